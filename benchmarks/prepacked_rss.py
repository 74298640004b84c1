"""Where a target session's memory goes: ONNX Runtime's prepacked weights, on the heap or mapped from a file.

    python benchmarks/prepacked_rss.py --bundle B [--steps 64] [--threads 2] [--work DIR]

MatMulNBits repacks its 4-bit weights at session creation into a CPU-specific layout held in
anonymous memory; reading the originals to pack them also faults their file pages in. ONNX Runtime
can instead write the packed buffers to an external data file
(``session.save_external_prepacked_constant_initializers``) and map them at the next load. This
script measures, each in a fresh process, after loading the bundle's target graph and after
``--steps`` one-token decode steps (2-row passes, as the runtime runs them): resident anonymous and
file-backed MiB and the peak, for

* ``as exported``: the bundle's graph (prepacking on the heap, the runtime's way);
* ``prepacked, mapped``: the graph re-saved by ONNX Runtime with its prepacked weights in the data
  file, that file's tensors then re-laid out at 4096-byte offsets (ONNX Runtime 1.31 writes packed
  buffers at unaligned offsets, and loading them segfaults in the first run; the relayout is what
  makes it load), with the logits checked equal to the exported graph's.

A benchmark, not a test. The packed file is specific to the CPU that wrote it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20
ALIGN = 4096


def status() -> dict[str, int]:
    """RssAnon, RssFile and VmHWM of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def save_prepacked(graph: Path, out_dir: Path) -> Path:
    """Let ONNX Runtime write ``graph`` optimized, with its prepacked weights in ``packed.data``."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out_dir / "packed.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "packed.data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    so.log_severity_level = 3
    ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    return out_dir / "packed.onnx"


def relayout(model_path: Path) -> Path:
    """Copy every external tensor (originals and ``prepacked_N`` buffers) to a 4096-aligned offset."""
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    root = model_path.parent
    placed: dict[tuple[str, int, int], int] = {}
    sources = {}
    with open(root / "aligned.data", "wb") as out:
        def put(loc: str, off: int, length: int) -> int:
            key = (loc, off, length)
            if key not in placed:
                src = sources.setdefault(loc, open(root / loc, "rb"))
                out.write(b"\0" * (-out.tell() % ALIGN))
                placed[key] = out.tell()
                src.seek(off)
                out.write(src.read(length))
            return placed[key]

        for t in m.graph.initializer:
            entries = {e.key: e for e in t.external_data}
            if "location" not in entries:
                continue
            loc = entries["location"].value
            entries["offset"].value = str(put(loc, int(entries["offset"].value) if "offset" in entries else 0,
                                              int(entries["length"].value)))
            for key, e in entries.items():
                if key.startswith("prepacked_"):  # "Kernel+hash|offset;length;..."
                    head, tail = e.value.split("|")
                    parts = tail.split(";")
                    parts[0] = str(put(loc, int(parts[0]), int(parts[1])))
                    e.value = head + "|" + ";".join(parts)
            entries["location"].value = "aligned.data"
    for f in sources.values():
        f.close()
    onnx.save(m, str(root / "aligned.onnx"))
    return root / "aligned.onnx"


def child(graph: str, steps: int, threads: int, layers: int, kv_heads: int, head: int) -> dict:
    """One process: load ``graph``, run ``steps`` 2-row decode passes; memory at each stage, logits."""
    import numpy as np
    import onnxruntime as ort

    from edge_spec.runtime.options import session_options

    base = status()
    s = ort.InferenceSession(graph, session_options(threads), providers=["CPUExecutionProvider"])
    loaded = status()
    past = {f"past_key_values.{i}.{kv}": np.zeros((1, kv_heads, 0, head), np.float32)
            for i in range(layers) for kv in ("key", "value")}
    ids = np.array([[1, 2]], dtype=np.int64)
    first = None
    for n in range(steps):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, 2 * (n + 1)), dtype=np.int64), **past}
        out = s.run(None, feeds)
        if first is None:
            first = out[0][0, -1, :8].tolist()
        names = [o.name for o in s.get_outputs()]
        past = {name.replace("present", "past_key_values"): v for name, v in zip(names, out) if name != "logits"}
        ids = np.array([[int(out[0][0, -1].argmax())] * 2], dtype=np.int64)
    run = status()
    return {"baseline": base, "loaded": loaded, "after_steps": run, "first_logits": first}


def measure(graph: Path, args: argparse.Namespace, spec: dict) -> dict:
    cmd = [sys.executable, __file__, "--child", str(graph), "--steps", str(args.steps), "--threads", str(args.threads),
           "--shape", f"{spec['num_layers']},{spec['num_kv_heads']},{spec['head_size']}"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if res.returncode:
        return {"error": f"exit {res.returncode}: {res.stderr.strip()[-300:]}"}
    return json.loads(res.stdout.splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path(__file__).resolve().parent / "out" / "prepacked")
    ap.add_argument("--child")
    ap.add_argument("--shape")
    args = ap.parse_args()
    if args.child:
        layers, kv_heads, head = (int(x) for x in args.shape.split(","))
        print(json.dumps(child(args.child, args.steps, args.threads, layers, kv_heads, head)))
        return 0
    spec = json.loads((args.bundle / "edge_spec.json").read_text())["target"]
    graph = args.bundle / spec["graph"]
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    for f in work.iterdir():
        f.unlink()
    for f in graph.parent.iterdir():  # the graph's data files, linked next to the packed copy
        if f.name != graph.name:
            os.link(f, work / f.name)
    packed = relayout(save_prepacked(graph, work))
    rows = {"as exported": measure(graph, args, spec), "prepacked, mapped": measure(packed, args, spec)}
    sizes = {"packed data file MiB": (work / "aligned.data").stat().st_size / MiB}
    print(f"{args.steps} two-row decode steps, {args.threads} threads; MiB (anonymous / file-backed / peak)")
    print("| graph | after load anon | file | after steps anon | file | peak | same logits |")
    print("|---|---:|---:|---:|---:|---:|---|")
    ref = rows["as exported"].get("first_logits")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | {r['error']} | | | | | |")
            continue
        lo, st = r["loaded"], r["after_steps"]
        print(f"| {name} | {lo['RssAnon'] / MiB:.0f} | {lo['RssFile'] / MiB:.0f} | {st['RssAnon'] / MiB:.0f} | "
              f"{st['RssFile'] / MiB:.0f} | {st['VmHWM'] / MiB:.0f} | {r['first_logits'] == ref} |")
    print(f"baseline (python + onnxruntime + numpy): {rows['as exported']['baseline']['VmHWM'] / MiB:.0f} MiB; "
          f"packed data file {sizes['packed data file MiB']:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
