"""The demo bundle on an execution provider: greedy output vs the CPU provider, speculative vs plain, placement, speed.

Each provider's ONNX Runtime is its own wheel in its own environment (docs/devices.md), so this runs once per
environment and the runs meet in JSON files:

    python benchmarks/providers_check.py --device cpu --out benchmarks/results/providers_cpu.json
    /work/venv-ov/bin/python benchmarks/providers_check.py --device openvino:CPU \
        --reference benchmarks/results/providers_cpu.json --out benchmarks/results/providers_openvino.json
    XDG_RUNTIME_DIR=/tmp/xdg /work/venv-webgpu/bin/python benchmarks/providers_check.py --device webgpu \
        --reference benchmarks/results/providers_cpu.json --out benchmarks/results/providers_webgpu.json
    python benchmarks/providers_check.py --compare benchmarks/results/providers_webgpu.json   # CPU side of the gaps

A stopped run goes on with ``--resume`` (same ``--out``): the prompts in its ``.partial.json`` are kept, and
tokens/s are over the prompts that carry timings.

Per prompt (the held-out chat prompts of lib/prompts.py, rendered by the bundle's chat template, as vs_llamacpp.py
does): greedy plain decoding on the provider, greedy speculative decoding on the provider (must be equal: the
runtime's promise), and, against the CPU run, the first differing step. There, the provider's logits (teacher-forced
on the common prefix) give its margin between its token and the CPU's; ``--compare`` (run with the CPU wheel) adds
the CPU's margin at the same step and the largest |difference| over the whole logits row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.lib.prompts import CHAT_PROMPTS, prompt_ids  # noqa: E402


def teacher_forced(engine: Any, ids: list[int]) -> np.ndarray:
    """The target's logits row after ``ids`` (fed in passes of the session's row count), as float32."""
    t = engine.target
    engine.reset()
    t.rewind_to(0)
    logits = None
    for s in range(0, len(ids), t.max_rows):
        logits = t.forward(ids[s:s + t.max_rows])
    row = np.array(logits[-1], dtype=np.float32)
    t.rewind_to(0)
    engine.reset()
    return row


def first_difference(a: list[int], b: list[int]) -> int | None:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return n if n is not None or len(a) == len(b) else min(len(a), len(b))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import onnxruntime as ort

    from edge_spec import Engine
    from edge_spec.runtime.placement import node_placement
    from edge_spec.runtime.providers import resolve

    bundle = Path(args.bundle)
    prompts = list(CHAT_PROMPTS[:args.prompts])
    ids = prompt_ids(bundle, prompts)
    device = resolve(args.device, strict=True)
    from edge_spec.bundle import read_manifest

    manifest = read_manifest(bundle)  # placement first: a second WebGPU session beside a live engine crashed once
    placement = {role: node_placement(bundle / spec.graph, device).__dict__
                 for role, spec in (("target", manifest.target), ("drafter", manifest.drafter)) if spec is not None}
    engine = Engine.load(bundle, device=args.device, strict=True, threads=args.threads, max_context=512)
    greedy = {"max_new_tokens": args.tokens, "temperature": 0.0, "stop_token_ids": ()}
    engine.generate(ids[0], {**greedy, "max_new_tokens": 4, "speculative": False})  # shaders, first-run costs
    rows: list[dict[str, Any]] = []
    reference = json.loads(Path(args.reference).read_text()) if args.reference else None
    logits_rows: dict[str, np.ndarray] = {}
    partial = Path(args.out).with_suffix(".partial.json") if args.out else None
    if args.resume and partial is not None and partial.is_file():
        rows = json.loads(partial.read_text())["rows"]
        saved = partial.with_suffix(".logits.npz")
        logits_rows = dict(np.load(saved)) if saved.is_file() else {}
        print(f"resuming after {len(rows)} prompts of {partial}", flush=True)
    for i, (text, p) in enumerate(zip(prompts, ids)):
        if i < len(rows):  # done in an earlier run (--resume); its logits at a first difference are re-read
            d = rows[i].get("first_difference")
            if d is not None and str(i) not in logits_rows:  # runs before --resume kept none: one forward pass
                logits_rows[str(i)] = teacher_forced(engine, p + rows[i]["ar"][:d["step"]])
            continue
        t0 = time.perf_counter()
        ar = list(engine.generate(p, {**greedy, "speculative": False}).token_ids)
        t1 = time.perf_counter()
        sd_res = engine.generate(p, {**greedy, "speculative": True})
        t2 = time.perf_counter()
        sd = list(sd_res.token_ids)
        row: dict[str, Any] = {"prompt": text, "prompt_tokens": len(p), "ar": ar, "sd_equals_ar": sd == ar,
                               "ar_seconds": round(t1 - t0, 3), "sd_seconds": round(t2 - t1, 3),
                               "acceptance": sd_res.stats.acceptance_rate}
        if sd != ar:
            row["sd"] = sd
            row["sd_first_difference"] = first_difference(ar, sd)
        if reference is not None:
            cpu = reference["rows"][i]["ar"]
            k = first_difference(ar, cpu)
            row["equal_to_cpu"] = k is None
            if k is not None:
                logits = teacher_forced(engine, p + ar[:k])
                logits_rows[str(i)] = logits
                mine, theirs = ar[k], cpu[k]
                row["first_difference"] = {"step": k, "token": mine, "cpu_token": theirs,
                                           "margin_here": float(logits[mine] - logits[theirs])}
        rows.append(row)
        if partial is not None:  # what is done so far survives a crash of a slow run (--resume goes on from it)
            partial.write_text(json.dumps({"device": args.device, "rows": rows}))
            if logits_rows:
                np.savez(partial.with_suffix(".logits.npz"), **logits_rows)
        print(f"[{i + 1}/{len(prompts)}] sd==ar {row['sd_equals_ar']} equal_to_cpu {row.get('equal_to_cpu')} "
              f"{row.get('first_difference', '')}", flush=True)
    timed = [r for r in rows if "ar_seconds" in r]  # rows from before --resume existed carry no timings
    n = sum(len(r["ar"]) for r in timed)
    out: dict[str, Any] = {
        "device": args.device, "providers": engine.target.session.get_providers(),
        "onnxruntime": f"{ort.__version__} ({Path(ort.__file__).parent.parent.name})", "bundle": str(bundle),
        "prompts": len(rows), "tokens_per_prompt": args.tokens, "threads": args.threads, "timed_prompts": len(timed),
        "ar_tokens_per_s": round(n / sum(r["ar_seconds"] for r in timed), 2) if timed else None,
        "sd_tokens_per_s": round(n / sum(r["sd_seconds"] for r in timed), 2) if timed else None,
        "acceptance_mean": round(float(np.mean([r["acceptance"] for r in timed])), 3) if timed else None,
        "sd_equals_ar": sum(r["sd_equals_ar"] for r in rows),
        "placement": placement, "rows": rows,
    }
    if reference is not None:
        out["equal_to_cpu"] = sum(bool(r["equal_to_cpu"]) for r in rows)
    if logits_rows:
        np.savez(Path(args.out).with_suffix(".logits.npz"), **logits_rows)
        out["logits_file"] = str(Path(args.out).with_suffix(".logits.npz").name) + " (not committed)"
    return out


def compare(path: Path, bundle: Path, threads: int) -> dict[str, Any]:
    """With the CPU wheel: the CPU's logits at each first difference recorded in ``path``."""
    from edge_spec import Engine

    data = json.loads(path.read_text())
    theirs = np.load(path.with_suffix(".logits.npz"))
    engine = Engine.load(bundle, threads=threads, max_context=512, drafting="none")
    ids = prompt_ids(bundle, [r["prompt"] for r in data["rows"]])
    gaps = []
    for i, (row, p) in enumerate(zip(data["rows"], ids)):
        d = row.get("first_difference")
        if d is None:
            continue
        cpu = teacher_forced(engine, p + row["ar"][:d["step"]])
        d["cpu_margin"] = float(cpu[d["cpu_token"]] - cpu[d["token"]])
        d["max_abs_logit_diff"] = float(np.abs(cpu - theirs[str(i)]).max())
        gaps.append(d["max_abs_logit_diff"])
    data["max_abs_logit_diff_at_first_differences"] = max(gaps) if gaps else 0.0
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", default=str(Path.home() / ".cache/edge-spec/demo-238f77ac150e7613"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reference", help="the CPU run's JSON")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--resume", action="store_true",
                    help="go on after the prompts in OUT's .partial.json (a slow provider's run that was stopped)")
    ap.add_argument("--compare", help="a provider run's JSON to complete with the CPU side (run with the CPU wheel)")
    args = ap.parse_args()
    if args.compare:
        data = compare(Path(args.compare), Path(args.bundle), args.threads)
        Path(args.compare).write_text(json.dumps(data, indent=1) + "\n")
        return 0
    data = run(args)
    text = json.dumps(data, indent=1) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(json.dumps({k: v for k, v in data.items() if k not in ("rows", "placement")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
