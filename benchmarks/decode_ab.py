"""Plain decoding against llama.cpp's server, prompt by prompt in one run: where whole requests win or lose.

``vs_llamacpp.py`` times whole requests (prompt + generation), each system in its own process, one after the
other; ``probes/context_scaling.py`` times single steps against ``llama-bench``. On this shared 2-core VM whole
runs move by 10-30 % between minutes, and ``llama-bench`` is not the server the whole-request rows run. This
script keeps both systems loaded at once and alternates them on every prompt (the order swapped each round), so
the machine's drift falls on both alike, and it splits each request into its two phases:

* **prefill**: edge-spec's time to the first token (``Engine.stream``'s first event), llama.cpp's ``prompt_ms``
  plus its first token's share of ``predicted_ms`` (``lib/request``);
* **decode**: edge-spec's time from the first token to the last over the tokens after the first; llama.cpp's
  ``predicted_ms / predicted_n`` (its own timings, HTTP excluded);
* **whole**: generated tokens over prompt + generation time, as ``vs_llamacpp.py`` counts them.

edge-spec is the engine ``edge-spec generate --no-speculation`` loads (``drafting="none"``: no drafter, 1-row
passes), greedy, the stop tokens ignored so every request makes ``--tokens`` tokens; llama.cpp is ``llama-server``
(benchmarks/build_llamacpp.sh) on the same GGUF and threads, greedy, fed the same token ids. Only one of the two
computes at any moment. Ratios are llama.cpp's time over edge-spec's (above 1: edge-spec is faster), from medians
over every prompt of every round.

``--kernels`` also times, at each thread count, the target graph's ``MatMulNBits`` nodes alone (121 in the demo's;
their real weights, each fed a [1, K] row; one session, no other kernel) beside a whole decode step of the same graph
(``lib/timing.step_times`` at ``--kernel-depth`` cached positions), one session loaded at a time: the share of a step
the 4-bit matmuls take, and what the extra threads buy them and the rest of the graph.

    python benchmarks/decode_ab.py --bundle DEMO --gguf SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 1 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def timed(fn: Any, system: Any, ids: list[int], tokens: int) -> dict[str, float]:
    """One greedy request (``lib/request``): {prefill_s, decode_s_per_token, whole_tok_s, tokens}."""
    r = fn(system, ids, tokens)
    n = r["tokens"]
    return {"prefill_s": r["prefill_s"], "decode_s_per_token": r["decode_s"] / (n - 1),
            "whole_tok_s": n / (r["prefill_s"] + r["decode_s"]), "tokens": n}


def _with_data(tensor: Any, root: Path) -> Any:
    """``tensor`` with its external bytes read in (onnx's own loader refuses a bundle's hard-linked data files)."""
    if tensor.data_location != 1:  # onnx.TensorProto.EXTERNAL
        return tensor
    info = {e.key: e.value for e in tensor.external_data}
    with open(root / info["location"], "rb") as f:
        f.seek(int(info.get("offset", 0)))
        raw = f.read(int(info["length"]))
    tensor.ClearField("external_data")
    tensor.data_location = 0
    tensor.raw_data = raw
    return tensor


def matmul_only_graph(bundle: Path) -> tuple[bytes, dict[str, Any], dict[int, str]]:
    """(model bytes, shared initializers, {K: input name}): every MatMulNBits node of the bundle's target graph,
    each reading a graph input [1, K] instead of its activations; every node's output is a graph output."""
    import onnx
    from onnx import helper

    from edge_spec.bundle import read_manifest
    from edge_spec.runtime.session import shared_initializers

    manifest = read_manifest(bundle)
    graph_path = bundle / manifest.target.graph
    model = onnx.load(str(graph_path), load_external_data=False)  # the weights this needs are read below
    shared = shared_initializers(bundle, manifest)
    weights = {i.name: i for i in model.graph.initializer}
    nodes, inits, outputs, inputs = [], {}, [], {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k, n = int(attrs["K"]), int(attrs["N"])
        x = inputs.setdefault(k, f"x{k}")
        nodes.append(helper.make_node("MatMulNBits", [x, *node.input[1:]], list(node.output), domain=node.domain,
                                      **attrs))
        outputs.append(helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, [1, n]))
        for name in node.input[1:]:
            if name and name in weights:
                inits[name] = _with_data(weights[name], graph_path.parent)
    graph = helper.make_graph(nodes, "matmuls", [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [1, k])
                                                 for k, x in inputs.items()], outputs, list(inits.values()))
    out = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    used = {i for nd in nodes for i in nd.input}
    return out.SerializeToString(), {k: v for k, v in shared.items() if k in used}, inputs


def kernel_times(bundle: Path, threads: int, depth: int, repeats: int) -> dict[str, float]:
    """Median ms of the target's MatMulNBits nodes alone and of a whole decode step after ``depth`` positions."""
    import gc

    import numpy as np
    import onnxruntime as ort

    from benchmarks.lib.timing import step_times
    from edge_spec import Engine
    from edge_spec.runtime.options import session_options

    data, shared, inputs = matmul_only_graph(bundle)
    so = session_options(threads, threads > 1)  # what Engine.load gives the target: spinning with a pool
    for name, value in shared.items():
        so.add_initializer(name, value)
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((1, k)).astype(np.float32) for k, x in inputs.items()}
    samples = []
    for i in range(repeats + 5):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        if i >= 5:
            samples.append(time.perf_counter() - t0)
    del sess
    gc.collect()
    engine = Engine.load(bundle, drafting="none", max_context=depth + 16, threads=threads)
    step = step_times({"step": engine}, depth + 1, repeats)["step"]["median_ms"]
    del engine
    gc.collect()
    matmuls = round(1e3 * statistics.median(samples), 3)
    return {"matmulnbits_ms": matmuls, "step_ms": step, "rest_ms": round(step - matmuls, 3)}


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """Medians over requests: prefill ms, decode ms per token, whole tokens/s."""
    return {"prefill_ms": round(1e3 * statistics.median(r["prefill_s"] for r in rows), 2),
            "decode_ms_per_token": round(1e3 * statistics.median(r["decode_s_per_token"] for r in rows), 3),
            "whole_tok_s": round(statistics.median(r["whole_tok_s"] for r in rows), 2)}


def run_threads(bundle: Path, gguf: Path, prompts: list[list[int]], threads: int, tokens: int,
                rounds: int, baseline: Path | None = None) -> dict[str, Any]:
    """The systems at ``threads`` threads, alternating on every prompt (the order rotated each round); per-round and
    overall medians. ``baseline``: a second bundle of the same target (e.g. another ``--gguf-mode``) in the same
    rotation, row ``edge_spec_baseline``."""
    from benchmarks.lib import llamacpp
    from benchmarks.lib.request import edge_request, llama_request
    from edge_spec import Engine

    engines = {"edge_spec": Engine.load(bundle, drafting="none", max_context=4096, threads=threads)}
    if baseline is not None:
        engines["edge_spec_baseline"] = Engine.load(baseline, drafting="none", max_context=4096, threads=threads)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in [*engines, "llama_cpp"]}
    per_round = []
    with llamacpp.LlamaServer(gguf, threads=threads, context=4096) as server:
        systems = [(name, edge_request, e) for name, e in engines.items()] + [("llama_cpp", llama_request, server)]
        for _, fn, system in systems:  # warm-up, all
            fn(system, prompts[0], 8)
        for r in range(rounds):
            start = {name: len(v) for name, v in rows.items()}
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for ids in prompts:
                for name, fn, system in order:
                    rows[name].append(timed(fn, system, ids, tokens))
            rs = {name: summary(v[start[name]:]) for name, v in rows.items()}
            per_round.append(rs)
            print(f"threads {threads} round {r + 1}: {json.dumps(rs)}", flush=True)
    engines.clear()
    out: dict[str, Any] = {name: summary(v) for name, v in rows.items()}
    out["rounds"] = per_round
    ll = out["llama_cpp"]
    for name in engines_names(baseline):
        e = out[name]
        key = "llama_over_edge" + ("" if name == "edge_spec" else "_baseline")
        out[key] = {"decode": round(ll["decode_ms_per_token"] / e["decode_ms_per_token"], 3),
                    "prefill": round(ll["prefill_ms"] / e["prefill_ms"], 3),
                    "whole": round(e["whole_tok_s"] / ll["whole_tok_s"], 3)}
    return out


def engines_names(baseline: Path | None) -> list[str]:
    return ["edge_spec"] + (["edge_spec_baseline"] if baseline is not None else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, type=Path, help="a bundle directory, or demo")
    ap.add_argument("--gguf", required=True, type=Path, help="the target's GGUF for llama-server")
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--prompts", type=int, default=6, help="the first N chat prompts (vs_llamacpp.py's default)")
    ap.add_argument("--random-prompt", type=int, default=0, metavar="N",
                    help="instead of the chat prompts, --prompts prompts of N random token ids each (the same ids "
                    "both sides, seeded): prefill of longer prompts, as llama-bench's ppN")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--baseline", type=Path, help="a second bundle of the same target, alternating with the others "
                    "(e.g. exported with another --gguf-mode)")
    ap.add_argument("--kernels", action="store_true", help="also time the 4-bit matmuls alone (see above)")
    ap.add_argument("--kernel-depth", type=int, default=128)
    ap.add_argument("--kernel-repeats", type=int, default=100)
    ap.add_argument("--json", type=Path, default=HERE / "results" / "decode_ab.json")
    args = ap.parse_args(argv)

    import onnxruntime

    from benchmarks.lib import llamacpp
    from benchmarks.lib.prompts import CHAT_PROMPTS, prompt_ids
    from edge_spec.bundle import read_manifest
    from edge_spec.demo import resolve_bundle

    if llamacpp.bin_dir() is None:
        raise SystemExit("llama.cpp is not built; run benchmarks/build_llamacpp.sh or set LLAMA_CPP_BIN.")
    bundle = resolve_bundle(args.bundle)
    if args.random_prompt:  # ordinary BPE ids of the vocabulary's first part (no special tokens), fixed seed
        rng = np.random.default_rng(0)
        vocab = read_manifest(bundle).target.full_vocab_size
        prompts = [[int(t) for t in rng.integers(100, min(vocab, 100_000), args.random_prompt)]
                   for _ in range(args.prompts)]
    else:
        prompts = prompt_ids(bundle, list(CHAT_PROMPTS[:args.prompts]))
    result: dict[str, Any] = {"bundle": str(bundle), "baseline": str(args.baseline or ""), "gguf": str(args.gguf),
                              "prompts": args.prompts, "random_prompt": args.random_prompt,
                              "prompt_tokens": [len(p) for p in prompts], "tokens": args.tokens,
                              "rounds": args.rounds, "date": time.strftime("%Y-%m-%d"),
                              "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
                              "runs": {}}
    for threads in args.threads:
        result["runs"][str(threads)] = run_threads(bundle, args.gguf, prompts, threads, args.tokens, args.rounds,
                                                   args.baseline)
        if args.kernels:
            result["runs"][str(threads)]["kernels"] = kernel_times(bundle, threads, args.kernel_depth,
                                                                   args.kernel_repeats)
            print(f"threads {threads} kernels: {result['runs'][str(threads)]['kernels']}", flush=True)
    if len(args.threads) > 1:  # what the extra threads buy each system, from the same run
        lo, hi = str(min(args.threads)), str(max(args.threads))
        result["decode_gain_more_threads"] = {
            name: round(result["runs"][lo][name]["decode_ms_per_token"]
                        / result["runs"][hi][name]["decode_ms_per_token"], 3)
            for name in [*engines_names(args.baseline), "llama_cpp"]}
        if args.kernels:
            result["kernel_gain_more_threads"] = {
                part: round(result["runs"][lo]["kernels"][part] / result["runs"][hi]["kernels"][part], 3)
                for part in ("matmulnbits_ms", "rest_ms", "step_ms")}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"} | {
        "runs": {t: {k: v for k, v in r.items() if k != "rounds"} for t, r in result["runs"].items()}}, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
