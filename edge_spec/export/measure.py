"""Measurements taken at export: session load bytes, per-pass workspace, step time, verify drift.

All sessions are created with :func:`edge_spec.runtime.options.session_options`, so the numbers
hold for the runtime. Memory is measured in a fresh subprocess (``python -m
edge_spec.export.measure memory GRAPH MAX_CTX``) because RSS in the exporting process is
polluted by torch and the builder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edge_spec.export.invariance import PAD_ROWS
from edge_spec.runtime.memory import current_rss, drop_mapped_pages, peak_rss
from edge_spec.runtime.options import session_options

_NP_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
MAX_WORKSPACE_K = 16




class Decoder:
    """A builder graph with one preallocated KV buffer per layer, bound as both past and present.

    This is how the runtime drives the graph (GUIDE §3): GroupQueryAttention writes the new
    positions in place and reads the valid length from ``attention_mask``."""

    def __init__(self, graph: str | os.PathLike[str], max_context: int, head_size: int, threads: int = 0,
                 initializers: dict[str, ort.OrtValue] | None = None) -> None:
        so = session_options(threads)
        for name, value in (initializers or {}).items():  # shared weights, handed over as the runtime does
            so.add_initializer(name, value)
        self.session = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past_names = sorted((n for n in inputs if n.startswith("past_key_values.")),
                                 key=lambda n: (int(n.split(".")[1]), n))
        first = inputs[self.past_names[0]]
        kv_heads, head = int(first.shape[1]), head_size  # the builder leaves the head dim symbolic
        self.kv_dtype = _NP_DTYPES[first.type]  # fp16 KV may sit in an fp32 graph (logits stay fp32)
        self.dtype = _NP_DTYPES[self.session.get_outputs()[0].type]
        self.max_context = max_context
        self.vocab = int(self.session.get_outputs()[0].shape[-1])
        self.io = self.session.io_binding()
        self.kv = {}
        for name in self.past_names:
            # [1, kv_heads, max_ctx + PAD_ROWS, head]: the rows a padded graph appends (export/invariance.py)
            buf = np.zeros((1, kv_heads, max_context + PAD_ROWS, head), dtype=self.kv_dtype)
            value = ort.OrtValue.ortvalue_from_numpy(buf)
            self.kv[name] = (buf, value)
            self.io.bind_ortvalue_input(name, value)
            self.io.bind_ortvalue_output(name.replace("past_key_values.", "present."), value)

    def forward(self, tokens: list[int] | np.ndarray, past_len: int) -> np.ndarray:
        """Run ``len(tokens)`` new positions after ``past_len`` cached ones; returns logits [k, vocab]."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        mask = np.ones((1, past_len + ids.shape[1]), dtype=np.int64)
        self.io.bind_cpu_input("input_ids", ids)
        self.io.bind_cpu_input("attention_mask", mask)
        for i in self.session.get_inputs():  # an EAGLE-3 drafter's feature inputs: zeros of their width
            if i.name in ("target_hidden", "prev_hidden"):
                self.io.bind_cpu_input(i.name, np.zeros((1, ids.shape[1], int(i.shape[-1])),
                                                        dtype=np.float16 if "float16" in i.type else np.float32))
        logits = np.empty((1, ids.shape[1], self.vocab), dtype=self.dtype)  # [1, k, vocab]; budgeted apart
        self.io.bind_output("logits", "cpu", 0, self.dtype, list(logits.shape), logits.ctypes.data)
        self.session.run_with_iobinding(self.io)
        return logits[0].astype(np.float32)


def row_table_files(proto: Any) -> list[str]:
    """External-data files (their ``location``) that hold only initializers the graph reads by row: each one the data
    input of Gather / GatherBlockQuantized / GgufGather nodes and of nothing else (an untied embedding; a tied one,
    which the LM head reads whole, is not)."""
    where: dict[str, str] = {}
    for t in proto.graph.initializer:
        ext = {e.key: e.value for e in t.external_data}
        if "location" in ext:
            where[t.name] = ext["location"]
    by_row, other = set(), set()
    for n in proto.graph.node:
        for k, name in enumerate(n.input):
            if name in where:
                row = (n.op_type in ("Gather", "GgufGather") and k == 0
                       or n.op_type == "GatherBlockQuantized" and k in (0, 2, 3))  # data, scales, zero points
                (by_row if row else other).add(name)
    files: dict[str, bool] = {}
    for name, loc in where.items():
        files[loc] = files.get(loc, True) and name in by_row and name not in other
    return sorted(loc for loc, only in files.items() if only)


def gather_table_bytes(proto: Any, skip: set[str] | frozenset[str] = frozenset()) -> int:
    """Bytes of the external (memory-mapped) initializers the graph reads through Gather / GatherBlockQuantized:
    the embedding table, whose rows the runtime lets go after load (runtime.memory.drop_mapped_pages) and which
    come back, a page per token seen, as a conversation meets new tokens: at most all of it."""
    sizes = {}
    for t in proto.graph.initializer:
        ext = {e.key: e.value for e in t.external_data}
        if "length" in ext:
            sizes[t.name] = int(ext["length"])
    names = {i for n in proto.graph.node if n.op_type in ("Gather", "GatherBlockQuantized", "GgufGather")
             for i in (n.input[0], *(n.input[2:3] if n.op_type == "GatherBlockQuantized" else ()))}
    return sum(sizes.get(name, 0) for name in names - set(skip))


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_profile(graph: str, max_context: int, head_size: int, max_k: int = MAX_WORKSPACE_K,
                   shared: list[dict[str, Any]] | None = None, root: str | None = None,
                   beside: tuple[str, int] | None = None) -> dict[str, object]:
    """Run in a fresh process: RSS added by session creation, and peak RSS of k-token passes.

    load_bytes = RSS after creating the session, running one warm-up token (weight prepacking
    happens lazily), dropping the mapped weights' pages (as the runtime does) and running the
    workspace passes below, minus RSS before, minus the KV buffers (which the runtime budgets
    separately). load_peak_bytes = the peak RSS of the session's creation above RSS before (the weights
    being repacked are all resident then).
    workspace_bytes[k] = peak RSS during one k-token pass minus RSS just before it (KV buffers
    resident), with the peak mark reset before each pass; k grows 1..max_k and each value is made
    monotone (a k-token pass never needs less than a shorter one).

    ``shared``: the manifest's ``shared_initializers`` (as JSON objects, files relative to ``root``);
    they are mapped once and given to the session(s), as ``Engine.load`` does. ``beside`` = (graph, head size): a model
    created first and left loaded, as the runtime creates the target before the drafter; the load
    measured is then what this graph adds next to it. Without that, the first session of a process
    also pays ONNX Runtime's one-off set-up (kernel registry, thread pool: ~11 MiB), which the
    runtime pays once, with the target, and the drafter's shared weights would count twice."""
    values: dict[str, ort.OrtValue] = {}
    if shared:
        from edge_spec.bundle import SharedInitializer
        from edge_spec.runtime.session import shared_initializers

        tensors = [SharedInitializer(**{**t, "shape": tuple(t["shape"])}) for t in shared]
        values = shared_initializers(Path(root or "."), tensors)

    def drop() -> None:  # as Engine.load does once a session has run: see runtime.memory.drop_mapped_pages
        drop_mapped_pages(Path(graph).parent.parent)  # the bundle (role dirs and what they share)

    first = None
    if beside is not None:
        first = Decoder(beside[0], 16, beside[1], threads=1, initializers=values)
        first.forward([1], 0)
        drop()
    base = current_rss()
    tracked = _reset_peak()
    dec = Decoder(graph, max_context, head_size, threads=1, initializers=values)  # KV reserved, not yet resident
    dec.forward([1], 0)
    # the load's peak: what repacking held at once (the mapped weights being read, the packed copies written)
    load_peak = (peak_rss() if tracked else current_rss()) - base
    drop()
    kv_bytes = 0
    for buf, _ in dec.kv.values():
        buf.fill(0)  # touch the pages so the KV buffers are resident, as in a full context at run time
        kv_bytes += buf.nbytes
    can_reset = _reset_peak()
    workspace: dict[int, int] = {}
    for k in range(1, max_k + 1):
        tokens = [(7 * i + 3) % 100 + 5 for i in range(k)]
        dec.forward(tokens, 1)  # warm this shape once (kernel caches), then measure
        before = current_rss()
        if can_reset:
            _reset_peak()
        dec.forward(tokens, 1)
        peak = peak_rss()
        workspace[k] = max(0, peak - before, workspace.get(k - 1, 0))
    # After the passes: what they read back of the dropped pages (norms; the embedding rows of their tokens, which
    # the manifest's gather_bytes count whole anyway) and the heap they left is part of what loading costs.
    load = current_rss() - base - kv_bytes
    del first  # kept loaded through the measurement, like the runtime's target
    return {"load_bytes": int(max(load, 0)), "load_peak_bytes": int(max(load_peak, load, 0)),
            "workspace_bytes": workspace, "peak_reset": can_reset}


def measure_memory(graph: Path, max_context: int, head_size: int, max_k: int = MAX_WORKSPACE_K,
                   shared: list[dict[str, Any]] | None = None, root: Path | None = None,
                   beside: tuple[Path, int] | None = None) -> dict[str, object]:
    """:func:`memory_profile` in a fresh subprocess (the exporting process is full of torch)."""
    extra = {"shared": shared or [], "root": None if root is None else str(root),
             "beside": None if beside is None else [str(beside[0]), int(beside[1])]}
    cmd = [sys.executable, "-m", "edge_spec.export.measure", "memory", str(graph), str(max_context), str(head_size),
           str(max_k), json.dumps(extra)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"memory measurement failed: {tail}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data["workspace_bytes"] = {int(k): int(v) for k, v in data["workspace_bytes"].items()}
    return data


def verify_profile(graph: str, head_size: int, max_context: int = 256, ks: tuple[int, ...] = (1, 2, 4, 8),
                   prefix: int = 32, repeats: int = 30, threads: int = 0) -> dict[str, object]:
    """Step time of a k-token pass, and max |logit diff| between one k-token pass and k 1-token steps."""
    dec = Decoder(graph, max_context, head_size, threads=threads)
    rng = np.random.default_rng(0)
    vocab = dec.vocab
    prompt = rng.integers(5, min(vocab, 8000), size=prefix).tolist()
    dec.forward(prompt, 0)
    times, diffs, scale = {}, {}, 0.0
    for k in ks:
        new = rng.integers(5, min(vocab, 8000), size=k).tolist()
        for _ in range(3):
            dec.forward(new, prefix)
        samples = []
        for _ in range(repeats):
            t = time.perf_counter()
            dec.forward(new, prefix)
            samples.append(time.perf_counter() - t)
        times[k] = round(float(np.min(samples) * 1e3), 3)  # min: this machine shares its cores
        multi = dec.forward(new, prefix)
        single = np.stack([dec.forward([tok], prefix + i)[0] for i, tok in enumerate(new)])
        diffs[k] = float(np.abs(multi - single).max())
        scale = max(scale, float(np.abs(single).max())) if k > 1 else float(np.abs(single).max())
    return {"step_ms": times, "max_abs_logit_diff": diffs, "max_abs_logit": scale}


SWEEP = (("fp32", None), ("int8", 1), ("int8", 4), ("int4", 1), ("int4", 2), ("int4", 4))


def sweep(checkpoints: list[str], work: Path, threads: int = 1) -> list[dict[str, object]]:
    """Build each checkpoint at each (precision, accuracy_level) of SWEEP and profile it (docs/export.md)."""
    from edge_spec.export.build import BuildOptions, build_graph, resolve_checkpoint

    rows = []
    for name in checkpoints:
        ckpt = resolve_checkpoint(name, "model")
        head = ckpt.config.get("head_dim") or ckpt.config["hidden_size"] // ckpt.config["num_attention_heads"]
        for precision, level in SWEEP:
            out = work / f"{Path(name).name}-{precision}-{level}"
            graph = build_graph(ckpt, out, BuildOptions(precision, level), work / "cache")
            prof = verify_profile(str(graph), head, threads=threads)
            size = sum(f.stat().st_size for f in out.glob("model.onnx*"))
            rows.append({"model": name, "precision": precision, "accuracy_level": level, "bytes": size, **prof})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def _main(argv: list[str]) -> int:
    if argv[0] == "sweep":
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(sweep(argv[1:], Path(tmp)), indent=1))
        return 0
    if argv[0] == "memory":
        extra = json.loads(argv[5]) if len(argv) > 5 else {}
        beside = tuple(extra["beside"]) if extra.get("beside") else None
        out = memory_profile(argv[1], int(argv[2]), int(argv[3]), int(argv[4]) if len(argv) > 4 else MAX_WORKSPACE_K,
                             shared=extra.get("shared"), root=extra.get("root"), beside=beside)
    elif argv[0] == "verify":
        out = verify_profile(argv[1], int(argv[2]), threads=int(argv[3]) if len(argv) > 3 else 0)
    else:
        raise SystemExit("usage: python -m edge_spec.export.measure "
                         "memory GRAPH MAX_CTX HEAD [MAX_K] | verify GRAPH HEAD | sweep CKPT...")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
