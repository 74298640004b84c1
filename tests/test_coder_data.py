"""models/coder-data: the prompts the coder pair's n-gram table was built from are not the benchmarks' coding tasks.

A drafter (and an n-gram table) is never measured on the text it was built from: no prompt of prompts.txt is a
benchmark prompt, and no problem it asks for is one of benchmarks/lib/prompts.py's coding tasks — a problem
collides when every distinctive word of it (4+ letters, not a generic one) is a word of one benchmark task.
prompts.txt is what prompts.py writes.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from lib.prompts import CHAT_PROMPTS, CODE_PROMPTS  # noqa: E402

GENERIC = {"string", "strings", "number", "numbers", "integer", "integers", "whether", "compute", "element",
           "elements", "function", "given", "their", "which", "every", "other", "returns", "return", "write",
           "words", "small", "short", "first", "python", "array", "length", "values", "value", "positive",
           "original", "list", "that", "with", "from", "into", "each", "them", "this", "have", "does"}


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def _module():
    spec = importlib.util.spec_from_file_location("coder_prompts", ROOT / "models" / "coder-data" / "prompts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prompts_file_is_what_the_generator_writes() -> None:
    mod = _module()
    text = (ROOT / "models" / "coder-data" / "prompts.txt").read_text(encoding="utf-8").splitlines()
    assert text == mod.prompts() and len(set(text)) == len(text) > 1000


def test_no_prompt_or_problem_is_a_benchmarks() -> None:
    mod = _module()
    bench = [_words(p) for p in CODE_PROMPTS]
    assert not set(mod.prompts()) & (set(CODE_PROMPTS) | set(CHAT_PROMPTS))
    for problem in mod.PROBLEMS:
        words = {w for w in _words(problem) if len(w) >= 4} - GENERIC
        assert words, problem  # every problem has words of its own to compare
        clash = [b for b in bench if words <= b]
        assert not clash, (problem, clash)
    # the rule catches the benchmark's own tasks, and a rephrasing of one
    own = [{w for w in b if len(w) >= 4} - GENERIC for b in bench]
    assert all(w and any(w <= b for b in bench) for w in own)
    assert any({"palindrome"} <= b for b in bench)
