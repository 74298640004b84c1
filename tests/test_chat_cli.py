"""Chat that goes on past its context (issue 9 item 1), closed stdin (item 9), and KV reuse on SmolLM2's template."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STATS = re.compile(r"^\[\d+ tokens, .*KV reused (\d+)/(\d+) prompt tokens, RSS \d+ MiB\](.*)$", re.M)


def _cli(args: list[str], stdin: str | None, closed_stdin: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "edge_spec", *args]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"}
    if closed_stdin:  # what `edge-spec chat B <&-` does: fd 0 is not open at all
        return subprocess.run(" ".join(cmd) + " <&-", shell=True, capture_output=True, text=True, timeout=120,
                              env=env, cwd=ROOT)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


@pytest.mark.slow
def test_thirty_turns_past_the_context_go_on(demo_bundle: Path) -> None:
    script = "".join(f"Tell me about topic number {i} please.\n" for i in range(1, 31)) + "/stats\n"
    proc = _cli(["chat", str(demo_bundle), "--max-context", "96", "--max-new-tokens", "16", "--seed", "0",
                 "--system", "Be brief."], script)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr + proc.stdout, proc.stderr
    assert "error" not in proc.stdout.lower() and "/reset starts over" not in proc.stdout
    stats = STATS.findall(proc.stdout)
    assert len(stats) == 30  # every turn answered
    notes = [note for _, _, note in stats if "older turns dropped" in note]
    assert len(notes) == 1 and "96-token context; the system prompt is kept" in notes[0]  # said once
    dropped = int(re.search(r"\((\d+) older ones dropped to fit\)", proc.stdout).group(1))
    assert dropped >= 20  # the conversation went on many times past the context
    assert all(int(reused) > 0 for reused, _, _ in stats[1:])  # at least the system prompt's KV stays


@pytest.mark.slow
def test_chat_with_stdin_closed_ends_cleanly(demo_bundle: Path) -> None:
    proc = _cli(["chat", str(demo_bundle)], None, closed_stdin=True)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr


def test_engine_chat_fills_context_without_warning(demo_bundle: Path) -> None:
    from edge_spec.runtime.engine import Engine

    engine = Engine.load(demo_bundle, max_context=48)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        first = engine.chat(msgs, max_new_tokens=200, config={"stop_token_ids": ()})
        assert first.finish_reason == "context_full"
        msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Again."}]
        kept, dropped = engine.fit_chat(msgs, reserve=16)
        assert dropped == 2 and kept[0] == msgs[0] and kept[-1] == msgs[-1]
        assert len(engine.encode_chat(kept)) <= 48 // 2
        again = engine.chat(kept, max_new_tokens=8)
    assert engine.last_stats.reused_tokens > 0 and again.token_ids


def test_follow_up_turn_reuses_kv_on_smollm2_template(demo_bundle: Path, tmp_path: Path) -> None:
    """The demo bundle, its chat format replaced by SmolLM2's template derived at export: turn two prefills
    only the new tokens (the default system block is not repeated, nothing is re-added)."""
    from test_chat_template import SMOLLM2
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from edge_spec.export.chat_template import chat_format
    from edge_spec.runtime.engine import Engine

    tok_file = demo_bundle / "tokenizer" / "tokenizer.json"
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tok_file), eos_token="<|endoftext|>")
    tok.chat_template = SMOLLM2
    fmt = chat_format(tok, Tokenizer.from_file(str(tok_file)))
    root = tmp_path / "bundle"
    root.mkdir()
    for sub in ("target", "drafter", "tokenizer"):
        (root / sub).symlink_to(demo_bundle / sub, target_is_directory=True)
    data = json.loads((demo_bundle / "edge_spec.json").read_text())
    data["tokenizer"]["chat"] = asdict(fmt)
    (root / "edge_spec.json").write_text(json.dumps(data))

    engine = Engine.load(root)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert engine.encode_chat(msgs) == tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    first = engine.chat(msgs, max_new_tokens=12, config={"stop_token_ids": ()})
    prompt1 = engine.last_stats.prompt_tokens
    msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And of Germany?"}]
    engine.chat(msgs, max_new_tokens=4)
    st = engine.last_stats
    assert st.prompt_tokens == len(tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False))
    assert st.reused_tokens >= prompt1  # the whole first prompt's KV (and usually the reply's) is reused


@pytest.mark.slow
def test_chat_samples_by_default_with_a_seed_that_replays(demo_bundle: Path) -> None:
    """Like llama.cpp / ollama, chat samples by default (the model's settings, else llama.cpp's T 0.8, top-k 40,
    top-p 0.95, min-p 0.05) with a fresh seed that /stats prints; that seed replays the conversation; --temperature 0
    is greedy."""
    script = "Write a function that adds two numbers.\nAnd one that multiplies them.\n/stats\n"
    args = ["chat", str(demo_bundle), "--max-new-tokens", "24"]
    first = _cli(args, script)
    assert first.returncode == 0, first.stderr
    line = re.search(r"sampling: (.*)", first.stdout).group(1)
    assert "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05 (llama.cpp's defaults where not given)" in line
    seed = int(re.search(r"seed (\d+):", line).group(1))
    replies = lambda out: re.findall(r"you> [^\n]*\n(.*?)\[\d+ tokens", out, re.S)  # noqa: E731
    again = _cli([*args, "--seed", str(seed)], script)
    assert len(replies(first.stdout)) == 2 and replies(again.stdout) == replies(first.stdout)
    other = _cli([*args, "--seed", str(seed + 1)], script)
    assert replies(other.stdout) != replies(first.stdout)  # the seed is what makes them equal
    greedy = _cli([*args, "--temperature", "0"], script)
    assert "sampling: greedy (--temperature 0)" in greedy.stdout
    bad = _cli([*args, "--min-p", "1.5"], "")
    assert bad.returncode != 0 and "must be in [0, 1)" in bad.stderr and "Traceback" not in bad.stderr


def test_recommended_sampling_comes_from_the_model(tmp_path: Path) -> None:
    from edge_spec.export import build
    from edge_spec.export.bundle_tokenizer import recommended_sampling

    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6,
                                                                 "top_p": 0.9, "top_k": 20}))
    ckpt = build.Checkpoint(name="m", path=tmp_path, config={}, architecture="LlamaForCausalLM")
    assert recommended_sampling(ckpt) == {"temperature": 0.6, "top_k": 20, "top_p": 0.9,
                                          "source": "generation_config.json"}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert recommended_sampling(ckpt) is None
