"""Speculative decoding against llama.cpp, every system loaded at once and alternating on every prompt.

``vs_llamacpp.py`` runs each system over all its prompts in its own process, one after the other (that is how it
measures each one's peak RSS); on this shared 2-core VM a whole block can then run 10-30 % slow, and that falls on
one system only (BENCHMARKS.md, "The head against llama.cpp": plain 13.8 tok/s in the greedy block, 17.7 in the
T = 0.7 block of the same run). Here, as in ``decode_ab.py``, every system stays loaded and each prompt goes to
all of them in turn, the order rotated from prompt to prompt, so the machine's drift falls on all alike; only one
computes at any moment. Systems:

* edge-spec engines, ``--edge NAME=BUNDLE:DRAFTING`` (any number): ``Engine.load(BUNDLE, drafting=DRAFTING)``
  (``auto`` = the bundle's default, ``hybrid``, ``model``, ``lookup``; ``none`` = ``edge-spec generate
  --no-speculation``: no drafter loaded, 1-row passes), through ``Engine.stream``;
* ``llama.cpp AR`` (``llama-server`` on ``--gguf``) and, with ``--draft-gguf``, ``llama.cpp speculative``, its
  draft-model mode (``-md``, ``--spec-draft-n-max --draft-max``).

Every request is fed the same token ids (the prompt rendered by the first bundle's chat format), ignores the stop
tokens (so every one makes ``--tokens`` tokens) and is seeded by its prompt's index. Per request: prefill (edge-spec:
time to the first token; llama.cpp: its ``prompt_ms`` and its first token, ``lib/request``), decode (the rest, per
token after the first; llama.cpp: ``predicted_ms / predicted_n``) and whole-request tokens/s. A system's row sums
tokens and seconds over its requests (tokens/s of the whole run, as ``vs_llamacpp.py`` reports), beside the median
decode ms per token. Greedy rows also
check losslessness: every edge-spec engine's tokens against the first ``none`` engine's (the model alone), prompt
by prompt, and how many of llama.cpp's equal them. Peak RSS: each llama-server's own, and the edge-spec engines'
together (one process; for one engine's, ``edge-spec chat`` under ``/usr/bin/time -v``).

    python benchmarks/spec_ab.py --gguf TARGET.gguf --draft-gguf DRAFT.gguf --edge head=HEAD:auto \\
        --edge lookup=PAIR:lookup --edge plain=PAIR:none --code --prompts 40 --tokens 128 --threads 2 \\
        --temperatures 0 0.7 --json benchmarks/results/spec_ab.json

A benchmark, not a test: needs the real models and a llama.cpp build (benchmarks/build_llamacpp.sh).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from benchmarks.lib.request import edge_request, llama_request  # noqa: E402
from edge_spec.runtime.budget import DRAFTING  # noqa: E402  (what Engine.load(drafting=...) takes)

LLAMA_AR, LLAMA_SPEC = "llama.cpp AR", "llama.cpp speculative"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A system's requests: whole-run tokens/s, decode tokens/s (tokens after the first over decode time), medians
    of prefill and of decode ms per token, and its drafts' acceptance."""
    tokens = sum(r["tokens"] for r in rows)
    secs = sum(r["prefill_s"] + r["decode_s"] for r in rows)
    out = {"requests": len(rows), "tokens": tokens, "tok_s": round(tokens / secs, 2),
           "decode_tok_s": round(sum(r["tokens"] - 1 for r in rows) / sum(r["decode_s"] for r in rows), 2),
           "prefill_ms_median": round(1e3 * statistics.median(r["prefill_s"] for r in rows), 1),
           "decode_ms_per_token_median": round(1e3 * statistics.median(r["decode_s"] / (r["tokens"] - 1)
                                                                       for r in rows), 2)}
    drafted = sum(r.get("drafted", 0) for r in rows)
    if drafted:
        out["acceptance"] = round(sum(r["accepted"] for r in rows) / drafted, 3)
    if any(r.get("target_passes") for r in rows):
        out["tokens_per_target_pass"] = round(tokens / sum(r["target_passes"] for r in rows), 3)
    return out


def parse_edge(spec: str) -> tuple[str, Path, str]:
    """``NAME=BUNDLE:DRAFTING`` -> (name, bundle, drafting)."""
    name, _, rest = spec.partition("=")
    bundle, _, drafting = rest.rpartition(":")
    if not name or not bundle or drafting not in DRAFTING:
        raise SystemExit(f"--edge {spec!r}: give NAME=BUNDLE:DRAFTING, DRAFTING one of {', '.join(DRAFTING)}")
    return name, Path(bundle).expanduser(), drafting


def run(systems: list[tuple[str, Any, Any]], prompts: list[list[int]], tokens: int, temperature: float,
        reference: str | None) -> dict[str, Any]:
    """Every prompt to every system, the order rotated by one from prompt to prompt; per-system summaries and, when
    greedy with a ``reference`` system (the model alone), each system's agreement with it."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in systems}
    for i, ids in enumerate(prompts):
        k = i % len(systems)
        for name, fn, system in systems[k:] + systems[:k]:
            rows[name].append(fn(system, ids, tokens, temperature, i))
        line = "  ".join(f"{n} {r[-1]['tokens'] / (r[-1]['prefill_s'] + r[-1]['decode_s']):.1f}"
                         for n, r in rows.items())
        print(f"T={temperature} prompt {i + 1}/{len(prompts)} tok/s: {line}", flush=True)
    out: dict[str, Any] = {"systems": {name: summary(r) for name, r in rows.items()}}
    if temperature == 0 and reference is not None:
        out["greedy_equal"] = agreement({n: [x["token_ids"] for x in r] for n, r in rows.items()}, reference)
    return out


def agreement(ids: dict[str, list[list[int]]], reference: str) -> dict[str, Any]:
    """Per system: on how many prompts its tokens equal ``reference``'s, and per prompt the first position where
    they differ (-1: none)."""
    base = ids[reference]
    out: dict[str, Any] = {"reference": reference}
    for name, seqs in ids.items():
        if name == reference:
            continue
        first = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y),
                      -1 if len(a) == len(b) else min(len(a), len(b))) for a, b in zip(seqs, base)]
        out[name] = {"equal": f"{first.count(-1)}/{len(base)}", "first_difference": first}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edge", action="append", required=True, metavar="NAME=BUNDLE:DRAFTING",
                    help="an edge-spec engine (repeat); the first bundle's chat format renders the prompts")
    ap.add_argument("--gguf", required=True, type=Path, help="the target's GGUF for llama-server")
    ap.add_argument("--draft-gguf", type=Path, help="llama.cpp's draft model (-md): adds 'llama.cpp speculative'")
    ap.add_argument("--draft-max", type=int, default=4, help="llama.cpp's --spec-draft-n-max (default 4)")
    ap.add_argument("--code", action="store_true", help="the coding tasks (lib/prompts.CODE_PROMPTS)")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--prompts-sampled", type=int, help="prompts for T > 0 (default: --prompts)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--json", type=Path, default=HERE / "results" / "spec_ab.json")
    args = ap.parse_args(argv)

    import onnxruntime

    from benchmarks.lib import llamacpp
    from benchmarks.lib.prompts import CHAT_PROMPTS, CODE_PROMPTS, prompt_ids
    from edge_spec import Engine

    if llamacpp.bin_dir() is None:
        raise SystemExit("llama.cpp is not built; run benchmarks/build_llamacpp.sh or set LLAMA_CPP_BIN.")
    edges = [parse_edge(s) for s in args.edge]
    texts = list((CODE_PROMPTS if args.code else CHAT_PROMPTS)[:args.prompts])
    prompts = prompt_ids(edges[0][1], texts)
    reference = next((name for name, _, drafting in edges if drafting == "none"), None)  # the model alone
    engines = [(name, edge_request, Engine.load(b, drafting=d, max_context=args.context, threads=args.threads))
               for name, b, d in edges]
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv[1:],
                              "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
                              "prompt_tokens": [len(p) for p in prompts], "runs": {}}
    servers = [(LLAMA_AR, [])]
    if args.draft_gguf:
        servers.append((LLAMA_SPEC, llamacpp.server_args("draft", threads=args.threads, draft=args.draft_gguf,
                                                         draft_max=args.draft_max)))
    opened = [llamacpp.LlamaServer(args.gguf, threads=args.threads, context=args.context, extra=x) for _, x in servers]
    try:
        for s in opened:
            s.__enter__()
        result["llama_cpp_commands"] = [" ".join(s.cmd) for s in opened]
        systems = engines + [(name, llama_request, s) for (name, _), s in zip(servers, opened)]
        for _, fn, system in systems:  # warm-up, all
            fn(system, prompts[0], 8, 0.0, 0)
        for t in args.temperatures:
            n = args.prompts_sampled if t > 0 and args.prompts_sampled else len(prompts)
            result["runs"][str(t)] = run(systems, prompts[:n], args.tokens, t, reference)
            print(json.dumps({str(t): result["runs"][str(t)]["systems"]} | {
                "greedy_equal": {k: v if isinstance(v, str) else v["equal"]
                                 for k, v in result["runs"][str(t)].get("greedy_equal", {}).items()}}, indent=1),
                  flush=True)
        # peak RSS: each llama-server's own (VmHWM, its -c context preallocated); edge-spec's engines share this process
        result["peak_rss_mib"] = {name: round(llamacpp.proc_memory(s.pid)["peak_rss"] / 2**20)
                                  for (name, _), s in zip(servers, opened)}
        result["peak_rss_mib"]["edge-spec engines, together"] = round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    finally:
        for s in opened:
            s.__exit__(None, None, None)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
