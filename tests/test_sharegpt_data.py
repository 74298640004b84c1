"""models/smollm2-data/sharegpt.py: reading a cut-off ShareGPT file and choosing its prompts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("sharegpt", ROOT / "models" / "smollm2-data" / "sharegpt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _conv(i: int, user: str, reply: str = "A reply.") -> dict:
    return {"id": str(i), "conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": reply}]}


def test_a_cut_off_file_gives_its_complete_conversations() -> None:
    sg = _module()
    convs = [_conv(i, f"Question number {i} about tides?") for i in range(3)]
    text = json.dumps(convs, indent=2)
    cut = text[:text.rindex("Question number 2") + 5]  # the file ends inside the third conversation
    assert [c["id"] for c in sg.conversations(cut)] == ["0", "1"]
    assert [c["id"] for c in sg.conversations(text)] == ["0", "1", "2"]


def test_exchanges_keep_english_first_messages_once_and_never_a_benchmark_prompt() -> None:
    sg = _module()
    convs = [
        _conv(0, "How do tides work on a lake?1 / 1"),  # the interface's suffix is removed
        _conv(1, "How do tides work on a lake?"),  # a repeat once the suffix is gone
        _conv(2, "short"),  # under 12 characters
        _conv(3, "潮汐是如何在湖上运作的？请详细解释一下"),  # not the model's language
        _conv(4, "what is the capital of france?"),  # benchmarks/chat_prompts.py, in any case
        {"id": "5", "conversations": [{"from": "gpt", "value": "Hello! How can I help you today?"}]},
        _conv(6, "Write a haiku about the sea at night.", ""),
    ]
    assert sg.exchanges(convs) == [("How do tides work on a lake?", "A reply."),
                                   ("Write a haiku about the sea at night.", "")]


def test_exclude_leaves_out_the_prompts_an_answers_file_already_answered(tmp_path: Path) -> None:
    import numpy as np

    from edge_spec.distill.ids import pack
    from edge_spec.distill.sequence import Sequence

    sg = _module()
    prompts = ["<|user|>How do tides work on a lake?<|assistant|>", "<|user|>Name three rivers.<|assistant|>"]
    empty = np.zeros((0, 0), np.int32)
    seqs = [Sequence(np.array([ord(c) for c in p + " an answer"], np.int32), len(p), 0.0, empty,
                     empty.astype(np.float16), np.zeros((0, 2), np.float32)) for p in prompts]
    f = pack(seqs[:1], seqs[1:], tmp_path / "answers.npz", {})  # one training, one held-out conversation
    seen = sg.answered([f], lambda t: "".join(map(chr, t)))
    assert " an answer" not in seen  # prompts only
    pairs = [("How do tides work on a lake?", "r"), ("Name three rivers.\r", ""), ("Name three lakes.", "")]
    assert sg.unanswered(pairs, seen) == [("Name three lakes.", "")]
