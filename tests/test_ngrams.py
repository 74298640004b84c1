"""The static n-gram draft table: how it is counted, how it drafts, that drafts from it stay lossless, and that a
bundle carries, plans and refuses it properly (export --ngrams)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from test_runtime_loop import FakeModel, V, assert_follows, run, table_logits

from edge_spec.errors import BundleError
from edge_spec.export.ngrams import count_table, guess_table
from edge_spec.runtime.drafting import DraftPolicy
from edge_spec.runtime.ngrams import NgramTable, ngram_hash, window_hashes
from edge_spec.runtime.sampling import SamplingConfig, probs
from edge_spec.runtime.speculative import Decoder


def table(seqs: list[tuple[list[int], int]], **kw) -> NgramTable:
    keys, nxt = count_table([(np.asarray(s), p) for s, p in seqs], **kw)
    return NgramTable(keys, nxt, kw.get("min_n", 2), kw.get("max_n", 4))


def test_window_hashes_equal_ngram_hash() -> None:
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 70000, 50)
    for n in range(1, 6):
        assert [int(h) for h in window_hashes(seq, n)] == [ngram_hash(seq[i:i + n].tolist()) for i in range(51 - n)]
    assert ngram_hash([3, 4]) != ngram_hash([0, 3, 4])  # the length is hashed in
    assert len(window_hashes(seq[:2], 3)) == 0


def test_count_table_keeps_frequent_dominant_answer_continuations() -> None:
    # prompt [9, 1] (length 2), answers: "1 -> 2" three times and "1 -> 3" once after the 2-gram (x, 1)
    seqs = [([9, 1, 5, 1, 2], 2), ([9, 1, 5, 1, 2], 2), ([9, 1, 5, 1, 2], 2), ([9, 1, 5, 1, 3], 2)]
    t = table(seqs, min_n=2, max_n=2, min_count=3, min_share=0.6)
    assert t.next_token([9, 1]) == 5  # the prompt's last tokens predict the first answer token (4 of 4)
    assert t.next_token([5, 1]) == 2  # 3 of 4: kept
    assert t.next_token([1, 5]) == 1
    assert t.next_token([8, 9]) == -1
    # below the count, or not dominant: dropped
    assert table(seqs, min_n=2, max_n=2, min_count=4, min_share=0.6).next_token([5, 1]) == -1
    assert table(seqs, min_n=2, max_n=2, min_count=3, min_share=0.8).next_token([5, 1]) == -1
    # the prompt's own n-grams are never counted (their next token is not an answer token)
    assert table([([7, 8, 7, 8, 7, 8, 1], 6)] * 5, min_n=2, max_n=2).next_token([7, 8]) == 1
    assert table([([7, 8, 7, 8, 7, 8, 1], 6)] * 5, min_n=2, max_n=2).next_token([8, 7]) == -1
    # ties go to the smaller id, deterministically
    tie = [([0, 4, 6], 1)] * 3 + [([0, 4, 5], 1)] * 3
    assert table(tie, min_n=2, max_n=2, min_share=0.5).next_token([0, 4]) == 5


def test_table_drafts_the_longest_match_and_chains() -> None:
    seqs = [([1, 2, 3, 4, 5], 1)] * 3 + [([7, 3, 4, 9], 1)] * 3
    t = table(seqs)
    ctx = np.array([1, 2, 3, 4, 0, 0])
    # "2 3 4" -> 5 (3-gram) wins over "3 4" -> (5 and 9 split: not dominant)
    assert t.draft(ctx, 4, 3).tolist() == [5]
    assert t.draft(np.array([8, 1, 2]), 3, 5).tolist() == [3, 4, 5]  # chained: each draft extends the context
    assert t.draft(np.array([8, 1, 2]), 3, 2).tolist() == [3, 4]  # at most max_len
    assert t.draft(np.array([5, 5]), 2, 4).tolist() == []


def test_decoder_drafts_from_the_table_where_the_context_has_no_match_losslessly() -> None:
    """The lookup rung and hybrid drafting with a table: table drafts only where the context does not repeat, the
    same greedy output as plain decoding."""
    target = FakeModel(table_logits(0))
    prompt = [4, 7, 2]
    ar, _ = run(Decoder(target, None), prompt, gamma=None, max_new=24)
    seqs = [(prompt + ar[:12], len(prompt))] * 3  # the target's own continuation, as distill would keep it
    for drafter in (None, FakeModel(table_logits(3, 1.0))):
        dec = Decoder(FakeModel(table_logits(0)), drafter, lookup=True, max_gamma=4, table=table(seqs))
        out, steps = run(dec, prompt, gamma=4, max_new=24, hybrid=drafter is not None)
        assert out == ar
        used = [s for s in steps if s.table]
        assert used and all(s.lookup for s in used) and sum(s.accepted for s in used) >= 4
        # never instead of a repeat in the context
        for s in steps:
            assert not (s.table and s.gamma == 0)
    assert run(Decoder(FakeModel(table_logits(0)), None, lookup=True, max_gamma=4), prompt, gamma=4,
               max_new=24)[0] == ar


def test_lookup_prefers_the_table_to_a_one_token_repeat() -> None:
    """Draft sources in order of how often their drafts are right (BENCHMARKS.md, "Which lookup draft goes first"): a
    repeat of the context's last 2-3 tokens, then the table, then a repeat of the last token alone."""
    t = table([([1, 2, 3, 4, 5], 1)] * 3)
    dec = Decoder(FakeModel(table_logits(0)), None, lookup=True, max_gamma=3, table=t)
    dec.tok[:4], dec.n = np.array([2, 9, 1, 2]), 4  # "2" repeats (-> 9 1 2); "1 2" does not, and the table has it
    assert dec.draft_lookup(3) == 3 and dec.drafts[:3].tolist() == [3, 4, 5] and dec.table_drafts
    dec.tok[:5], dec.n = np.array([1, 2, 8, 1, 2]), 5  # "1 2" repeats: the context's own continuation goes first
    assert dec.draft_lookup(3) == 3 and dec.drafts[:3].tolist() == [8, 1, 2] and not dec.table_drafts
    dec.tok[:3], dec.n = np.array([6, 8, 6]), 3  # no table entry: the one-token repeat still drafts
    assert dec.draft_lookup(3) == 2 and dec.drafts[:2].tolist() == [8, 6] and not dec.table_drafts


def _first_two(table_t: np.ndarray, prompt: list[int], cfg: SamplingConfig) -> np.ndarray:
    """[V, V] joint probability of the first two tokens the fake target samples after ``prompt``."""
    p1 = probs(table_t[prompt[-2], prompt[-1]][None], cfg)[0]
    joint = np.zeros((V, V))
    for a in range(V):
        joint[a] = p1[a] * probs(table_t[prompt[-1], a][None], cfg)[0]
    return joint


@pytest.mark.parametrize("hybrid", [False, True])
def test_table_drafts_keep_sampling_distributed_as_p(hybrid: bool) -> None:
    """Unseeded rejection rule with table drafts: the first two tokens jointly follow p (chi-square)."""
    cfg = SamplingConfig(1.0)
    table_t = table_logits(0)
    prompt = [4, 7]
    t = table([([4, 7, 1, 5, 9], 2)] * 3)  # after "4 7": "1 5 9", whatever the target samples
    joint = _first_two(table_t, prompt, cfg)
    counts = np.zeros((V, V))
    used = 0
    for seed in range(4000):
        drafter = FakeModel(table_logits(5, 1.5)) if hybrid else None
        dec = Decoder(FakeModel(table_t), drafter, lookup=True, max_gamma=3, table=t)
        out, steps = run(dec, prompt, cfg, gamma=3, max_new=2, seed=seed, rule="rejection", hybrid=hybrid)
        used += sum(s.table for s in steps)
        counts[out[0], out[1]] += 1
    assert used >= 4000  # every run's first step drafted from the table
    assert_follows(counts, joint)


def test_guess_table_keeps_every_tokens_most_frequent_answer_continuation() -> None:
    # prompt [9, 1]; answers 5 1 2 (twice), 5 1 3 (twice), 5 1 4 (once)
    seqs = [([9, 1, 5, 1, 2], 2)] * 2 + [([9, 1, 5, 1, 3], 2)] * 2 + [([9, 1, 5, 1, 4], 2)]
    g = guess_table([(np.asarray(s), p) for s, p in seqs], 10)
    assert g.dtype == np.int32 and g.shape == (10,)
    assert g[1] == 5  # the prompt's last token counts as context of the first answer token (5 of 10)
    assert g[5] == 1 and g[9] == -1 and g[0] == -1  # "9 -> 1" lies inside the prompt: never counted
    # unfiltered (seen once each, 1 of 2), ties to the smaller id
    assert guess_table([(np.array([0, 4, 6]), 1), (np.array([0, 4, 5]), 1)], 10)[4] == 5
    assert (guess_table([], 10) == -1).all()


def _guessing(target: FakeModel, rows: int) -> FakeModel:
    target.min_rows = target.guess_rows = rows  # a target the runtime pads to `rows` rows (ModelSession.guess_rows)
    return target


def test_the_padding_row_carries_the_tables_guess_losslessly() -> None:
    """A step that drafted nothing, on a target that pads its passes to two rows: the table's guess takes the
    padding row (one pass, up to two tokens), the output is plain decoding's, and the draft-length policy is told
    nothing was drafted."""
    prompt = [4, 7, 2]
    ar, _ = run(Decoder(FakeModel(table_logits(0)), None), prompt, gamma=None, max_new=24)
    seq = prompt + ar
    guess = np.full(V, -1, np.int32)
    for a, b in zip(seq[len(prompt) - 1:-1], seq[len(prompt):]):
        guess[a] = b  # the target's own continuation (later pairs win where a token repeats)
    t = NgramTable(np.zeros(0, np.uint64), np.zeros(0, np.int32), 2, 4, guess)
    for drafter in (None, FakeModel(table_logits(3, 1.0))):
        dec = Decoder(_guessing(FakeModel(table_logits(0)), 2), drafter, lookup=True, max_gamma=4, table=t,
                      lookup_ngram_min=9)  # no context matches: every draft is the model's or a guess
        out, steps = run(dec, prompt, gamma=0 if drafter is None else 1, max_new=24, hybrid=drafter is not None,
                         threshold=2.0 if drafter is not None else 0.0)  # the drafter never confident: no drafts
        assert out == ar
        guessed = [s for s in steps if s.guess]
        assert guessed and all(s.gamma == 1 and s.lookup for s in guessed) and any(s.table for s in guessed)
        assert sum(s.accepted for s in guessed) >= 4 and len(steps) < len(ar)
    # no padding row (a 1-row target), lookup drafting off, or a pass that already has two pending tokens: no guess
    dec = Decoder(FakeModel(table_logits(0)), None, lookup=True, max_gamma=4, table=t, lookup_ngram_min=9)
    assert not any(s.guess for s in run(dec, prompt, gamma=0, max_new=24)[1])
    dec = Decoder(_guessing(FakeModel(table_logits(0)), 2), FakeModel(table_logits(3, 1.0)), max_gamma=4, table=t)
    assert not any(s.guess for s in run(dec, prompt, gamma=1, max_new=24, threshold=2.0)[1])
    dec = Decoder(_guessing(FakeModel(table_logits(0)), 2), None, lookup=True, max_gamma=4, table=t)
    dec.set_context(np.asarray(prompt, np.int64))
    dec.target.forward(np.asarray(prompt[:1]))  # two committed tokens pending: the pass has no padding row
    assert dec.draft_guess() == 0
    # speculation off (no policy): never a guess
    dec = Decoder(_guessing(FakeModel(table_logits(0)), 2), None, lookup=True, max_gamma=4, table=t)
    assert not any(s.guess for s in run(dec, prompt, gamma=None, max_new=24)[1])


class _Unpadded(FakeModel):
    """A target that needs no padding row (ModelSession.guess_free False; the engine then passes decode a guesser):
    a 2-row pass costs ``two`` x a 1-row one."""

    def __init__(self, table: np.ndarray, two: float) -> None:
        super().__init__(table, capacity=256)
        self.guess_rows, self.guess_free, self.two = 2, False, two

    def forward(self, tokens):
        time.sleep(0.002 * (1.0 if len(tokens) == 1 else self.two))
        return super().forward(tokens)


@pytest.mark.parametrize("two,keeps", [(1.05, True), (2.5, False)], ids=["cheap-row", "dear-row"])
def test_guesses_on_an_unpadded_target_go_on_while_they_pay(two: float, keeps: bool) -> None:
    """Where the second row is not free, the loop guesses while the measured goodput says it pays: right guesses
    and a cheap second row keep guessing; a second row dearer than two tokens' worth turns it off (probes aside).
    The output is plain decoding's either way."""
    prompt = [4, 7, 2]
    ar, _ = run(Decoder(FakeModel(table_logits(0), capacity=256), None), prompt, gamma=None, max_new=80)
    seq = prompt + ar
    guess = np.full(V, -1, np.int32)
    for a, b in zip(seq[len(prompt) - 1:-1], seq[len(prompt):]):
        guess[a] = b  # right unless a token repeats with another continuation
    t = NgramTable(np.zeros(0, np.uint64), np.zeros(0, np.int32), 2, 4, guess)
    dec = Decoder(_Unpadded(table_logits(0), two), None, lookup=True, max_gamma=4, table=t, lookup_ngram_min=9)
    out, steps = run(dec, prompt, gamma=0, max_new=80, guesser=DraftPolicy(1, free_drafts=True))  # as Engine has
    assert out == ar
    guessed = sum(s.guess for s in steps)
    assert (guessed > len(steps) // 2) if keeps else (guessed < len(steps) // 4), (guessed, len(steps))


def test_guesses_keep_sampling_distributed_as_p() -> None:
    """Unseeded rejection rule with the padding row's guess: the first two tokens jointly follow p (chi-square)."""
    cfg = SamplingConfig(1.0)
    table_t = table_logits(0)
    prompt = [4, 7]
    guess = np.full(V, -1, np.int32)
    guess[7] = 1  # after 7: guess 1, whatever the target samples
    t = NgramTable(np.zeros(0, np.uint64), np.zeros(0, np.int32), 2, 4, guess)
    joint = _first_two(table_t, prompt, cfg)
    counts = np.zeros((V, V))
    used = 0
    for seed in range(4000):
        # padded to 4 rows: the first pass (the 2 prompt tokens) has room for the guess
        dec = Decoder(_guessing(FakeModel(table_t), 4), None, lookup=True, max_gamma=3, table=t, lookup_ngram_min=9)
        out, steps = run(dec, prompt, cfg, gamma=3, max_new=2, seed=seed, rule="rejection")
        used += steps[0].guess
        counts[out[0], out[1]] += 1
    assert used == 4000
    assert_follows(counts, joint)


def test_a_damaged_table_file_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "unsorted.npz", keys=np.array([5, 3], np.uint64), next=np.array([1, 2], np.int32))
    np.savez(tmp_path / "ids.npz", keys=np.array([3, 5], np.uint64), next=np.array([1, 200], np.int32))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    for name in ("unsorted", "ids", "junk"):
        with pytest.raises(BundleError, match="re-export it"):
            NgramTable.load(tmp_path / f"{name}.npz", 2, 4, vocab_size=100)
    keys, nxt = np.array([3, 5], np.uint64), np.array([1, 99], np.int32)
    for bad in (np.zeros(99, np.int32), np.full(100, 100, np.int32), np.zeros(100, np.int64)):
        np.savez(tmp_path / "guess.npz", keys=keys, next=nxt, guess=bad)
        with pytest.raises(BundleError, match="malformed 'guess'"):
            NgramTable.load(tmp_path / "guess.npz", 2, 4, vocab_size=100)
    np.savez(tmp_path / "ok.npz", keys=keys, next=nxt)
    assert NgramTable.load(tmp_path / "ok.npz", 2, 4, vocab_size=100).nbytes == 24
    np.savez(tmp_path / "ok.npz", keys=keys, next=nxt, guess=np.full(100, -1, np.int32))
    assert NgramTable.load(tmp_path / "ok.npz", 2, 4, vocab_size=100).nbytes == 24 + 400


# ---------------------------------------------------------------------------- a real bundle (tiny GGUF)
PROMPT = [5, 9, 13]


def _answers(path: Path, seqs: list[list[int]], prompt_len: int, sha: str) -> Path:
    from edge_spec.distill import ids
    from edge_spec.distill.sequence import Sequence

    empty = np.zeros((0, 0), np.int32)
    train = [Sequence(np.asarray(s, np.int32), prompt_len, 0.0, empty, empty.astype(np.float16),
                      np.zeros((0, 2), np.float32)) for s in seqs]
    return ids.pack(train, [], path, {"target_sha256": sha})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny GGUF target, an answers file of its own greedy continuation of PROMPT (behind three different first
    prompt tokens, so each n-gram is seen three times), and its lookup-only bundle with the n-gram table."""
    import hashlib

    from test_gguf_export import write_tiny_gguf

    from edge_spec import Engine
    from edge_spec.export.pipeline import ExportOptions, export_bundle

    root = tmp_path_factory.mktemp("ngrams")
    gguf = write_tiny_gguf(root / "t.gguf", "llama", 1, seed=1)
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    # --gguf-mode split: the tiny file is Q8_0, which auto now runs on edge-spec's kernels, and a test below packages
    # the bundle for ONNX Runtime Mobile, which cannot load them
    opts = ExportOptions(max_context=128, measure_memory=False, gguf_mode="split")
    export_bundle(str(gguf), None, root / "plain", opts, progress=None)
    e = Engine.load(root / "plain", drafting="none", max_context=128)
    answer = e.generate(PROMPT, max_new_tokens=24, config={"stop_token_ids": ()}).token_ids
    answers = _answers(root / "answers.npz", [[x, *PROMPT, *answer] for x in (1, 2, 3)], len(PROMPT) + 1, sha)
    export_bundle(str(gguf), None, root / "bundle", ExportOptions(max_context=128, measure_memory=False,
                                                                     ngrams=(answers,), gguf_mode="split"),
                  progress=None)
    return {"root": root, "gguf": gguf, "sha": sha, "answers": answers, "bundle": root / "bundle", "answer": answer}


@pytest.mark.slow
def test_export_writes_the_table_and_the_runtime_drafts_from_it(tiny: dict) -> None:
    from edge_spec import Engine
    from edge_spec.bundle import read_manifest

    m = read_manifest(tiny["bundle"])
    assert m.ngrams is not None and m.ngrams.entries > 0 and m.ngrams.bytes == 12 * m.ngrams.entries
    assert m.ngrams.guess_bytes == 4 * m.target.vocab_size
    assert m.ngrams.sequences == 3 and m.ngrams.tokens == 3 * len(tiny["answer"])
    assert (tiny["bundle"] / m.ngrams.file).is_file()
    cfg = {"stop_token_ids": ()}
    e = Engine.load(tiny["bundle"], max_context=128)  # no drafter: the lookup rung, with the table
    assert e.plan.mode == "lookup" and e._dec.table is not None
    assert any("n-gram draft table" in what for what, _ in e.plan.items)
    sd = e.generate(PROMPT, cfg, max_new_tokens=24, draft_length=4)
    ar = e.generate(PROMPT, cfg, max_new_tokens=24, speculative=False)
    assert sd.token_ids == ar.token_ids == tiny["answer"]
    assert sd.stats.table_accepted > 0 and sd.stats.table_drafted <= sd.stats.lookup_drafted
    for seed in (0, 1):  # seeded sampling: the same text with the table's drafts as without drafts
        kw = {"temperature": 0.9, "seed": seed, "max_new_tokens": 24}
        assert e.generate(PROMPT, cfg, **kw).token_ids == e.generate(PROMPT, cfg, speculative=False, **kw).token_ids
    plain = Engine.load(tiny["bundle"], drafting="none", max_context=128)
    assert plain.plan.mode == "ar" and plain._dec.table is None
    assert not any("n-gram" in what for what, _ in plain.plan.items)


@pytest.mark.slow
def test_bad_answers_files_are_refused_before_anything_is_written(tiny: dict, tmp_path: Path) -> None:
    from edge_spec.errors import ExportError
    from edge_spec.export.pipeline import ExportOptions, export_bundle

    other = _answers(tmp_path / "other.npz", [[1, 2, 3, 4]], 2, "0" * 64)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"no")
    cases = {other: "written by another model", junk: "not an answers file", tmp_path / "none.npz": "does not exist"}
    for path, needle in cases.items():
        with pytest.raises(ExportError, match=needle):
            export_bundle(str(tiny["gguf"]), None, tmp_path / "out", ExportOptions(max_context=128, ngrams=(path,)),
                          progress=None)
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_manifest_checks_the_table_entry(tiny: dict, tmp_path: Path) -> None:
    import shutil

    from edge_spec.bundle import MANIFEST_NAME, read_manifest

    b = tmp_path / "b"
    shutil.copytree(tiny["bundle"], b)
    data = json.loads((b / MANIFEST_NAME).read_text())
    data["ngrams"]["bytes"] += 1
    (b / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(BundleError, match="ngrams.bytes"):
        read_manifest(b)
    data["ngrams"]["bytes"] -= 1
    data["ngrams"]["guess_bytes"] = 4  # neither 0 nor one int32 per vocabulary entry
    (b / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(BundleError, match="ngrams.guess_bytes"):
        read_manifest(b)
    data["ngrams"].pop("guess_bytes")  # a version-7 table (no guesses) loads
    (b / MANIFEST_NAME).write_text(json.dumps(data))
    assert read_manifest(b).ngrams.guess_bytes == 0
    (b / "ngrams.npz").unlink()
    with pytest.raises(BundleError, match="missing 'ngrams.npz'"):
        read_manifest(b)
    data.pop("ngrams")  # a bundle without the key (every older one) loads: no table
    (b / MANIFEST_NAME).write_text(json.dumps(data))
    assert read_manifest(b).ngrams is None


@pytest.mark.slow
def test_a_packaged_bundle_keeps_its_table(tiny: dict, tmp_path: Path) -> None:
    """edge-spec package (ONNX Runtime Mobile's format) carries the table over, and the packaged bundle drafts from
    it as the original does."""
    from edge_spec import Engine
    from edge_spec.bundle import read_manifest
    from edge_spec.export.mobile import package_bundle

    m = package_bundle(tiny["bundle"], tmp_path / "ort")
    assert m.ngrams == read_manifest(tiny["bundle"]).ngrams and read_manifest(tmp_path / "ort").ngrams == m.ngrams
    e = Engine.load(tmp_path / "ort", max_context=128)
    r = e.generate(PROMPT, {"stop_token_ids": ()}, max_new_tokens=24, draft_length=4)
    assert r.token_ids == tiny["answer"] and r.stats.table_accepted > 0
