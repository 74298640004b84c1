"""The demo training script runs end to end for a few steps (CI never retrains the real pair)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _train(out: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "models" / "train_demo.py"), "--out", str(out), "--max-files", "12",
           "--target-steps", "2", "--drafter-steps", "2", "--distill-steps", "2", "--distill-prompts", "4",
           "--heldout", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "training.json").read_text())


@pytest.mark.slow
def test_training_script_runs_a_few_steps_reproducibly(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    report = _train(out)
    # The model card's numbers are reproducible with its command: same steps -> same losses and weights.
    again = _train(tmp_path / "again")
    for part in ("target", "drafter"):
        for key in ("train_seconds",):
            report[part].pop(key), again[part].pop(key)
        assert report[part] == again[part]
        assert (out / part / "model.safetensors").read_bytes() == \
            (tmp_path / "again" / part / "model.safetensors").read_bytes()
    assert report["greedy_agreement"] == again["greedy_agreement"]
    assert report["target"]["steps"] == 2 and report["drafter"]["distill_steps"] == 2
    assert report["target"]["params"] >= 6_000_000
    assert 0.0 <= report["greedy_agreement"]["after_distill"] <= 1.0
    # Per-token compute (non-embedding weights incl. LM head) of the drafter is <= 1/5 of the target's.
    assert report["drafter"]["compute_params"] * 5 <= report["target"]["compute_params"]

    card = (out / "MODEL_CARD.md").read_text()
    assert "--target-steps 2 --drafter-steps 2 --distill-steps 2" in card

    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("target", "drafter"):
        model = AutoModelForCausalLM.from_pretrained(out / name)
        assert model.config.architectures == ["LlamaForCausalLM"]
    tok = AutoTokenizer.from_pretrained(out / "target")
    text = tok.apply_chat_template([{"role": "user", "content": "add two numbers"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|user|>\nadd two numbers<|end|>\n<|assistant|>\n"


def test_corpus_is_deterministic() -> None:
    sys.path.insert(0, str(ROOT / "models"))
    import corpus

    a, b = corpus.build_corpus(), corpus.build_corpus()
    assert a.sha256 == b.sha256 and a.files == b.files
    train, held = corpus.split_pairs(a, n_heldout=10, seed=3)
    assert len(held) == 10 and not set(held) & set(train)
    assert corpus.training_documents(a, train, seed=3)[:5] == corpus.training_documents(b, train, seed=3)[:5]
