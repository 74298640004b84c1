"""The target's aux features (and teacher top-k) for EAGLE-3 training, kept per sequence so data can grow.

One teacher-forced pass (no LM head but for the answer rows' teacher targets) computes, for every position of
every sequence's first ``max_len`` ids, the residual streams the head reads: float16 [positions, n_aux * hidden].
They are stored in *segments*: ``feat-<ns>-<tag>.f16`` (the rows), ``.idx.npz`` (which sequences, by a hash of
their prompt length and ids, and where their rows start) and ``.teacher<k>.npz`` (their teacher top-k), where
``ns`` names the target, aux layers and ``max_len``. A run finds every sequence it needs in the segments already
there and computes only the others, into new segments of ~``CHUNK_POSITIONS`` positions each — so adding an
answers file to ``--data`` costs a pass over that file alone, and a resumed run costs none. A segment is written to
temporary files and renamed, its index last: an interrupted pass keeps every segment it finished (a run started
again computes only the rest) and leaves nothing half-written that a later run would read.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from edge_spec.distill import parallel
from edge_spec.distill.ids import fill_teacher, teacher_targets
from edge_spec.distill.memory import release_freed
from edge_spec.distill.sequence import Sequence
from edge_spec.distill.target import aux_hooks, bf16_body
from edge_spec.errors import EdgeSpecError
from edge_spec.process import process_alive

_KEY = 16  # bytes of a sequence's hash
# Positions per segment a pass writes: each is a point an interrupted pass resumes from (~4.5 min of SmolLM2's bf16
# pass on 2 threads here); few enough segments that a store of millions of positions opens ~10 memory maps.
CHUNK_POSITIONS = 200_000


class FeatureStore:
    """Aux features of every position of a list of sequences, read from the segments' memory maps.

    Sequence i's rows are ``maps[seg[i]][row[i]:row[i] + lens[i]]`` ([lens[i], dim] float16)."""

    def __init__(self, maps: list[np.memmap], seg: np.ndarray, row: np.ndarray, lens: np.ndarray, dim: int) -> None:
        self.maps, self.seg, self.row, self.lens, self.dim = maps, seg, row, lens, dim
        self.offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)  # rows of the list, in order

    @property
    def rows(self) -> int:
        """Positions over all sequences."""
        return int(self.offsets[-1])

    def get(self, i: int, n: int) -> np.ndarray:
        """[min(n, len_i), dim] features of sequence i."""
        a = int(self.row[i])
        return self.maps[int(self.seg[i])][a:a + min(n, int(self.lens[i]))]

    def sample(self, rows: int, seed: int) -> np.ndarray:
        """[min(rows, self.rows), dim] float32 rows drawn without replacement (seeded), in list order."""
        pick = np.sort(np.random.default_rng(seed).choice(self.rows, min(rows, self.rows), replace=False))
        i = np.searchsorted(self.offsets, pick, side="right") - 1
        out = np.empty((len(pick), self.dim), np.float32)
        for k, (s, p) in enumerate(zip(i, pick, strict=True)):
            out[k] = self.maps[int(self.seg[s])][int(self.row[s]) + int(p - self.offsets[s])]
        return out


def sequence_keys(seqs: list[Sequence], max_len: int) -> np.ndarray:
    """[n, 16] uint8: a hash of each sequence's prompt length and first ``max_len`` ids (what its rows depend on)."""
    return _keys([(s.ids, s.prompt_len) for s in seqs], max_len)


def _keys(seqs: list[tuple[np.ndarray, int]], max_len: int) -> np.ndarray:
    out = np.empty((len(seqs), _KEY), np.uint8)
    for i, (ids, prompt_len) in enumerate(seqs):
        h = hashlib.sha256(np.int64(prompt_len).tobytes())
        h.update(np.asarray(ids[:max_len], np.int32).tobytes())
        out[i] = np.frombuffer(h.digest()[:_KEY], np.uint8)
    return out


class FeatureWriter:
    """Where generation puts the features it computed while writing (``data.generate(aux=...)``): one segment per
    data job, in the namespace :func:`extract_features` reads, so the text a run writes needs no feature pass."""

    def __init__(self, out_dir: Path, aux: tuple[int, ...], max_len: int, target_sha256: str) -> None:
        self.out_dir, self.aux, self.max_len = Path(out_dir), tuple(aux), max_len
        self.ns = _namespace(self.aux, max_len, target_sha256)

    def write(self, seqs: list[tuple[np.ndarray, int]], feats: list[np.ndarray]) -> Path:
        """``seqs`` (ids [L], prompt length) with ``feats`` [>= min(L, max_len), dim] float16 each -> a segment."""
        keys = _keys(seqs, self.max_len)
        lens = np.array([min(len(ids), self.max_len) for ids, _ in seqs], np.int64)
        stem = _new_stem(self.out_dir, self.ns, keys)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = _tmp(stem.with_suffix(".f16"))
        with open(tmp, "wb") as f:
            for n, x in zip(lens, feats, strict=True):
                f.write(np.ascontiguousarray(x[:n], np.float16).tobytes())
        os.replace(tmp, stem.with_suffix(".f16"))
        _write_index(stem, keys, np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64))
        return stem


def _new_stem(out_dir: Path, ns: str, keys: np.ndarray) -> Path:
    """A segment's path stem: its namespace and a hash of the sequences it holds."""
    return out_dir / f"feat-{ns}-{hashlib.sha256(keys.tobytes()).hexdigest()[:16]}"


def _write_index(stem: Path, keys: np.ndarray, rows: np.ndarray) -> None:
    """The segment's index (its sequences' keys, where their rows start): written last, it makes the segment whole."""
    _write_npz(stem.with_name(stem.name + ".idx.npz"), keys=keys, rows=rows)


def _namespace(aux: tuple[int, ...], max_len: int, target_sha256: str) -> str:
    return hashlib.sha256(repr((tuple(aux), max_len, target_sha256)).encode()).hexdigest()[:12]


def _segments(out_dir: Path, ns: str) -> list[Path]:
    """The complete segments of namespace ``ns`` in ``out_dir`` (their index files), oldest first."""
    return sorted(out_dir.glob(f"feat-{ns}-*.idx.npz"), key=lambda p: (p.stat().st_mtime, p.name))


def _stem(idx_path: Path) -> Path:
    return idx_path.with_name(idx_path.name[:-len(".idx.npz")])


def extract_features(model: torch.nn.Module, seqs: list[Sequence], aux: tuple[int, ...], out_dir: Path,
                     max_len: int, log: Callable[[str], None] = print, batch_tokens: int = 4096,
                     teacher_top_k: int | None = None, target_sha256: str = "", shared: bool = False,
                     bf16: bool = False, chunk_positions: int = CHUNK_POSITIONS) -> FeatureStore:
    """The aux features of ``seqs`` (first ``max_len`` ids each): found in ``out_dir``'s segments, the rest computed.

    With ``teacher_top_k`` the same pass also fills each sequence's teacher targets (``ids.fill_teacher``, answer
    rows within ``max_len``: all that training reads), so ids-only data costs one pass, not two; sequences found in
    a segment get the teacher targets kept beside it. A run's own directory keeps only the segments this run read
    (the data changed); a ``shared`` one (``--features DIR``) keeps every segment, for later runs on any mix of
    the same data. The rest is computed in segments of ~``chunk_positions`` positions, each kept as soon as it is
    done (an interrupted pass resumes after the last one). ``bf16``: the target's decoder matmuls under bfloat16
    autocast with its LM head in float32 (``target.bf16_body``), as the text's writing runs them.

    Under ``torchrun`` every rank calls it with the same ``seqs`` and ``out_dir`` (one directory all ranks see):
    each computes its share of the sequences no segment holds (every world-th distinct sequence) into segments of
    its own, then every rank reads them all; rank 0 alone removes what the run does not use."""
    ns = _namespace(aux, max_len, target_sha256)
    dim = model.config.hidden_size * len(aux)
    lens = np.array([min(len(s.ids), max_len) for s in seqs], np.int64)
    keys = sequence_keys(seqs, max_len)
    out_dir.mkdir(parents=True, exist_ok=True)
    pass_args = (model, seqs, keys, lens, aux, dim, out_dir, ns, log, batch_tokens, teacher_top_k, bf16,
                 chunk_positions)
    alone = parallel.world() == 1
    if not alone:  # this rank's share first (planned on its own sequences: another rank's new segments hold none)
        first = np.sort(np.unique(keys, axis=0, return_index=True)[1])
        share = first[parallel.mine(len(first))]
        seg, _, _, _, _ = _find(out_dir, ns, keys[share], [seqs[i] for i in share], None)
        missing = share[seg < 0]
        log(f"features: {parallel.world()} processes; this one computes {len(missing):,} of the {len(share):,} "
            "sequences in its share")
        _compute_missing(*pass_args, missing, [])
        parallel.barrier()  # every rank's segments are whole now
    seg, row, stems, no_teacher, unkept = _find(out_dir, ns, keys, seqs, teacher_top_k)
    if not alone and (seg < 0).any():
        raise EdgeSpecError(f"The features of {int((seg < 0).sum()):,} sequences are missing from '{out_dir}' after "
                            "every process's share of the pass; give all machines one --out (and --features) "
                            "directory on a filesystem they share.")
    parallel.barrier()  # no rank reads an index any more: rank 0 may remove what the run does not use
    if parallel.is_main():
        _tidy(out_dir, ns, stems, shared, alone)
    if alone:
        missing = np.flatnonzero(seg < 0)
        if len(missing):
            log(f"features: {len(seqs) - len(missing):,} of {len(seqs):,} sequences kept (written with the text or "
                f"by earlier runs); computing {len(missing):,}")
        for chunk, stem in _compute_missing(*pass_args, missing, stems):
            seg[chunk] = stems.index(stem)
            row[chunk] = np.concatenate([[0], np.cumsum(lens[chunk])[:-1]])
    if no_teacher:
        log(f"teacher: {len(no_teacher):,} kept sequences have no teacher top-{teacher_top_k} kept; computing it")
        teacher_targets(model, [seqs[i] for i in no_teacher], teacher_top_k, log=log)  # shared among the ranks
        for stem, n_keys, hits in unkept if parallel.is_main() else []:
            first = {j: i for j, i in reversed(hits)}  # kept beside each segment this run read whole: the next skips
            if len(first) == n_keys:
                _save_teacher(stem, teacher_top_k, [seqs[first[j]] for j in range(n_keys)])
    maps = [_open(st, dim) for st in stems]
    release_freed()
    return FeatureStore(maps, seg, row, lens, dim)


def _find(out_dir: Path, ns: str, keys: np.ndarray, seqs: list[Sequence], teacher_top_k: int | None) -> tuple:
    """Where ``out_dir``'s complete segments hold ``seqs`` (keys [n, 16]): (seg [n] (-1: none), row [n], the
    segments' stems, the sequences found without teacher targets, and those segments as (stem, keys, hits)).
    With ``teacher_top_k`` the sequences found get the teacher targets kept beside their segment."""
    want: dict[bytes, list[int]] = {}  # sequences alike in their first max_len ids share one key
    for i, k in enumerate(keys):
        want.setdefault(k.tobytes(), []).append(i)
    seg, row = np.full(len(seqs), -1, np.int64), np.zeros(len(seqs), np.int64)
    stems: list[Path] = []
    no_teacher: list[int] = []
    unkept: list[tuple[Path, int, list[tuple[int, int]]]] = []  # segments without a teacher file: (stem, keys, hits)
    for idx_path in _segments(out_dir, ns):
        z = np.load(idx_path)
        hits = [(j, i) for j, k in enumerate(z["keys"]) for i in want.get(k.tobytes(), ()) if seg[i] < 0]
        if not hits:
            continue
        stems.append(_stem(idx_path))
        for j, i in hits:
            seg[i], row[i] = len(stems) - 1, z["rows"][j]
        if teacher_top_k and not _load_teacher(stems[-1], teacher_top_k, [(j, seqs[i]) for j, i in hits]):
            no_teacher += [i for _, i in hits]
            unkept.append((stems[-1], len(z["keys"]), hits))
    return seg, row, stems, no_teacher, unkept


def _tidy(out_dir: Path, ns: str, used: list[Path], shared: bool, alone: bool) -> None:
    """A run's own directory: drop the segments this data does not use (and older releases' stores); a shared one:
    what killed runs left half-written (a pass's rows can be gigabytes). ``alone``: no other rank of this job
    writes (with several, this runs after they all finished, and their files may be another machine's)."""
    if not shared:
        for idx_path in _segments(out_dir, ns):
            if _stem(idx_path) not in used:
                for f in idx_path.parent.glob(_stem(idx_path).name + ".*"):
                    f.unlink()
        for f in [*out_dir.glob("features_*.f16"), *out_dir.glob("features_*.npz"), *out_dir.glob("*.tmp")]:
            f.unlink()
    else:
        for f in out_dir.glob("*.tmp"):
            if not alone or not _writer_alive(f):
                f.unlink(missing_ok=True)


def _compute_missing(model: torch.nn.Module, seqs: list[Sequence], keys: np.ndarray, lens: np.ndarray,
                     aux: tuple[int, ...], dim: int, out_dir: Path, ns: str, log: Callable[[str], None],
                     batch_tokens: int, teacher_top_k: int | None, bf16: bool, chunk_positions: int,
                     missing: np.ndarray, stems: list[Path]) -> list[tuple[np.ndarray, Path]]:
    """The segments of ``missing`` (indices into ``seqs``), ~``chunk_positions`` positions each, each appended to
    ``stems`` as soon as it is whole; returns (the chunk's indices, its segment) in order."""
    out = []
    total, done, t0 = int(lens[missing].sum()), 0, time.time()
    for chunk in _chunks(missing, lens, chunk_positions) if len(missing) else []:
        with bf16_body(model, bf16):
            stems.append(_compute_segment(model, [seqs[i] for i in chunk], keys[chunk], lens[chunk], aux, dim,
                                          out_dir, ns, log, batch_tokens, teacher_top_k, (done, total, t0)))
        done += int(lens[chunk].sum())
        out.append((chunk, stems[-1]))
    return out


def _chunks(idx: np.ndarray, lens: np.ndarray, positions: int) -> list[np.ndarray]:
    """``idx`` cut into consecutive runs of roughly ``positions`` positions each (cut before the sequence whose rows
    cross a multiple of ``positions``)."""
    ends = np.cumsum(lens[idx]) // max(positions, 1)
    cuts = np.flatnonzero(np.diff(ends)) + 1
    return [c for c in np.split(idx, cuts) if len(c)]


def _open(stem: Path, dim: int) -> np.memmap:
    path = stem.with_suffix(".f16")
    return np.memmap(path, dtype=np.float16, mode="r", shape=(path.stat().st_size // (2 * dim), dim))


@torch.no_grad()
def _compute_segment(model: torch.nn.Module, seqs: list[Sequence], keys: np.ndarray, lens: np.ndarray,
                     aux: tuple[int, ...], dim: int, out_dir: Path, ns: str, log: Callable[[str], None],
                     batch_tokens: int, teacher_top_k: int | None, progress: tuple[int, int, float]) -> Path:
    """One teacher-forced pass over ``seqs`` (longest first, ~``batch_tokens`` per batch) into a new segment.

    ``progress``: positions the whole pass computed before this segment, its total, and when it began (the log)."""
    stem = _new_stem(out_dir, ns, keys)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    tmp = _tmp(stem.with_suffix(".f16"))
    mm = np.memmap(tmp, dtype=np.float16, mode="w+", shape=(int(offsets[-1]), dim))
    order = np.argsort(-lens, kind="stable")
    store: dict[int, torch.Tensor] = {}
    handles = aux_hooks(model, aux, store)
    done, total, t0 = progress
    shown = time.time()
    dev = next(model.parameters()).device
    try:
        i = 0
        while i < len(order):
            width = int(lens[order[i]])
            idx = order[i:i + max(1, batch_tokens // width)]
            ids = torch.zeros(len(idx), width, dtype=torch.int64)
            mask = torch.zeros(len(idx), width, dtype=torch.int64)
            for r, s in enumerate(idx):
                ids[r, :lens[s]] = torch.from_numpy(np.asarray(seqs[s].ids[:lens[s]], np.int64))
                mask[r, :lens[s]] = 1
            out = model.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False)
            if teacher_top_k:
                for r, s in enumerate(idx):
                    fill_teacher(model, seqs[s], out.last_hidden_state[r], teacher_top_k)
            feats = torch.cat([store[j] for j in aux], -1).to(torch.float16).cpu().numpy()
            for r, s in enumerate(idx):
                mm[offsets[s]:offsets[s + 1]] = feats[r, :lens[s]]
            i += len(idx)
            done += int(lens[idx].sum())
            if time.time() - shown > 30 or done >= total:  # a line every 30 s, and the last
                shown = time.time()
                log(f"features: {done:,}/{total:,} positions, {done / (time.time() - t0):,.0f} pos/s")
    finally:
        for hd in handles:
            hd.remove()
    mm.flush()
    del mm
    os.replace(tmp, stem.with_suffix(".f16"))
    if teacher_top_k:
        _save_teacher(stem, teacher_top_k, seqs)
    _write_index(stem, keys, offsets[:-1])
    return stem


def _tmp(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: named after this process (see _writer_alive)."""
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def _writer_alive(tmp: Path) -> bool:
    """Whether the process that named ``tmp`` (:func:`_tmp`) still runs; unnamed (older releases) counts as gone."""
    pid = tmp.name.rsplit(".", 2)[-2] if tmp.name.count(".") >= 2 else ""
    return pid.isdigit() and process_alive(int(pid))


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    tmp = _tmp(path)
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def _save_teacher(stem: Path, top_k: int, seqs: list[Sequence]) -> None:
    """Keep the segment's teacher targets beside its features (~200 B per answer position), so a run on the same
    sequences skips the teacher pass too."""
    _write_npz(stem.with_name(f"{stem.name}.teacher{top_k}.npz"),
               rows=np.array([len(s.topk_ids) for s in seqs], np.int64),
               topk_ids=np.concatenate([s.topk_ids for s in seqs]).astype(np.int32),
               topk_logits=np.concatenate([s.topk_logits for s in seqs]).astype(np.float16),
               lse=np.concatenate([s.lse for s in seqs]).astype(np.float32))


def _load_teacher(stem: Path, top_k: int, hits: list[tuple[int, Sequence]]) -> bool:
    """Fill the sequences of ``hits`` ((index in the segment, sequence)) from the segment's teacher file; False when
    the segment has none for ``top_k``."""
    path = stem.with_name(f"{stem.name}.teacher{top_k}.npz")
    if not path.is_file():
        return False
    z = np.load(path)
    off = np.concatenate([[0], np.cumsum(z["rows"])])
    ids, logits, lse = z["topk_ids"], z["topk_logits"], z["lse"]
    for j, s in hits:
        a, b = off[j], off[j + 1]
        s.topk_ids, s.topk_logits, s.lse = ids[a:b], logits[a:b], lse[a:b]
    return True


def aux_scale(store: FeatureStore, n_aux: int, rows: int = 20000, seed: int = 0) -> np.ndarray:
    """[n_aux * hidden] per-feature multiplier that brings each aux layer to RMS 1 (the last layer's RMS is ~30 with
    some dimensions near 900 against ~0.1 for early layers); folded into ``fc`` when the head is saved."""
    x = store.sample(rows, seed).reshape(-1, n_aux, store.dim // n_aux)
    rms = np.sqrt((x ** 2).mean(axis=(0, 2))) + 1e-6  # [n_aux]
    return np.repeat(1.0 / rms, x.shape[2]).astype(np.float32)
