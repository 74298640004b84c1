"""Streaming detokenization: deltas concatenate to the full decode and never carry broken UTF-8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from edge_spec.runtime.detok import StreamDetokenizer, byte_table

TOKENIZER = Path(__file__).resolve().parents[1] / "models" / "demo" / "target" / "tokenizer.json"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    if not TOKENIZER.exists():
        pytest.skip("demo tokenizer missing")
    return Tokenizer.from_file(str(TOKENIZER))


@pytest.mark.parametrize("fast", [True, False])
def test_multibyte_text_streams_whole_characters(tok, fast):
    text = "naïve café — 😀 日本語 ok\n\tdef f(x): return x ** 2  # ünïcödé"
    ids = tok.encode(text).ids
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # the text does split characters over tokens
    det = StreamDetokenizer(tok, table=byte_table(tok) if fast else None)
    deltas = [det.push([i]) for i in ids] + [det.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids)


def test_byte_table_matches_decoder_on_random_ids(tok):
    table = byte_table(tok)
    assert table is not None
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = [int(i) for i in rng.integers(0, tok.get_vocab_size(), size=20)]
        det = StreamDetokenizer(tok, table=table)
        out = "".join(det.push(ids[i:i + 3]) for i in range(0, 20, 3)) + det.flush()
        full = tok.decode(ids, skip_special_tokens=True)
        assert out == full.rstrip("\ufffd") or out == full
