"""edge-spec against llama.cpp on the same GGUF, same prompt token ids, same thread count, one run.

    python benchmarks/vs_llamacpp.py --bundle BUNDLE --gguf TARGET.gguf \
        [--draft-gguf DRAFTER.gguf] [--tokens 128] [--repeats 2] [--threads 2] [--context 4096]

Systems (each in its own process, so peak RSS is its own):
* edge-spec AR (drafting off) and edge-spec speculative (adaptive draft length), greedy and T=0.7;
* llama.cpp (``llama-server``, fed token ids) AR greedy and T=0.7, and with ``--draft-gguf`` its
  draft-model speculative decoding (the edge-spec drafter converted to GGUF).
Reports tokens/s (all generated tokens over wall time including the prompt), TTFT, peak RSS,
acceptance where there is one, and the ratios the issue asks for, measured in this same run.
A benchmark, not a test: needs the real model and a llama.cpp build (benchmarks/build_llamacpp.sh).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from chat_prompts import CHAT_PROMPTS, chat_messages  # noqa: E402
from measure import measure  # noqa: E402


def prompt_ids(bundle: Path, n: int) -> list[list[int]]:
    """Chat prompts rendered and tokenised by the bundle itself (what the engine's chat() feeds)."""
    from edge_spec import Engine

    eng = Engine.load(bundle, drafting="none", max_context=256)
    return [[int(t) for t in eng.encode_chat(chat_messages(p))] for p in CHAT_PROMPTS[:n]]


def vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def llamacpp(gguf: Path, ids: list[list[int]], *, tokens: int, temperature: float, repeats: int, threads: int,
             context: int, draft: Path | None = None, draft_max: int = 8) -> dict[str, Any]:
    from llamacpp import LlamaServer

    extra = ["-md", str(draft), "--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", "0",
             "-td", str(threads)] if draft else []
    with LlamaServer(gguf, threads=threads, context=context, extra=extra) as srv:
        srv.complete(ids[0], 8, temperature=temperature)  # warm-up
        per_repeat, ttft, drafted, accepted = [], [], 0, 0
        for _ in range(repeats):
            n_tok, secs = 0, 0.0
            for i, p in enumerate(ids):
                r = srv.complete(p, tokens, temperature=temperature, seed=i, extra={"ignore_eos": True})
                t = r["timings"]
                n_tok += int(t["predicted_n"])
                secs += (t["prompt_ms"] + t["predicted_ms"]) / 1e3
                ttft.append(t["prompt_ms"] + t["predicted_per_token_ms"])
                drafted += int(t.get("draft_n", 0) or 0)
                accepted += int(t.get("draft_n_accepted", 0) or 0)
            per_repeat.append(n_tok / secs)
        return {"tokens_per_s": statistics.median(per_repeat), "tokens_per_s_repeats": per_repeat,
                "ttft_ms": statistics.median(ttft), "peak_rss": vm_hwm(srv.pid),
                "acceptance": accepted / drafted if drafted else None}


def guarded(fn, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """One system's measurement, or its error (the other rows still run)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # a peer that fails to start is a row, not the end of the run
        return {"error": f"{exc.__class__.__name__}: {str(exc)[:200]}"}


def edge(bundle: Path, ids: list[list[int]], *, tokens: int, temperature: float, repeats: int, threads: int,
         speculative: bool, budget: str | None = None) -> dict[str, Any]:
    spec = {"module": "edge", "bundle": str(bundle), "prompt_ids": ids, "max_new_tokens": tokens,
            "temperature": temperature, "repeats": repeats, "warmup": 1, "threads": threads,
            "speculative": speculative, "budget": budget, "ignore_stop": True}
    return measure(spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--draft-gguf", type=Path)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "vs_llamacpp.json")
    args = ap.parse_args()
    ids = prompt_ids(args.bundle, args.prompts)
    common = {"tokens": args.tokens, "repeats": args.repeats, "threads": args.threads}
    rows: dict[str, dict[str, Any]] = {}
    for temp in (0.0, 0.7):
        tag = "greedy" if temp == 0 else f"T={temp}"
        rows[f"edge-spec AR {tag}"] = edge(args.bundle, ids, temperature=temp, speculative=False, **common)
        rows[f"edge-spec speculative {tag}"] = edge(args.bundle, ids, temperature=temp, speculative=True, **common)
        rows[f"llama.cpp AR {tag}"] = guarded(llamacpp, args.gguf, ids, temperature=temp, context=args.context,
                                              **common)
        if args.draft_gguf:
            rows[f"llama.cpp speculative {tag}"] = guarded(llamacpp, args.gguf, ids, temperature=temp,
                                                           context=args.context, draft=args.draft_gguf, **common)
    print(f"\n{len(ids)} chat prompts x {args.repeats} repeats, {args.tokens} new tokens, {args.threads} threads")
    print("| system | tokens/s | TTFT ms | peak RSS MiB | acceptance |\n|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | error: {r['error'][:80]} | | | |")
            continue
        acc = r.get("acceptance")
        print(f"| {name} | {r['tokens_per_s']:.1f} | {r['ttft_ms']:.1f} | {r['peak_rss'] / 2**20:.0f} | "
              f"{'—' if acc is None else f'{acc:.2f}'} |")

    def ratio(a: str, b: str) -> float | None:
        ra, rb = rows.get(a, {}), rows.get(b, {})
        return ra["tokens_per_s"] / rb["tokens_per_s"] if "tokens_per_s" in ra and "tokens_per_s" in rb else None

    ratios = {
        "SD greedy / llama.cpp AR greedy (target 1.6)": ratio("edge-spec speculative greedy", "llama.cpp AR greedy"),
        "SD T=0.7 / llama.cpp AR T=0.7 (target 1.3)": ratio("edge-spec speculative T=0.7", "llama.cpp AR T=0.7"),
        "SD greedy / llama.cpp speculative greedy (target 1.3)": ratio("edge-spec speculative greedy",
                                                                      "llama.cpp speculative greedy"),
        "AR greedy / llama.cpp AR greedy (target 1.0)": ratio("edge-spec AR greedy", "llama.cpp AR greedy"),
        "SD greedy / edge-spec AR greedy": ratio("edge-spec speculative greedy", "edge-spec AR greedy"),
    }
    rss = {k: v.get("peak_rss") for k, v in rows.items()}
    if rss.get("edge-spec speculative greedy") and rss.get("llama.cpp AR greedy"):
        ratios["peak RSS SD / llama.cpp AR (target <= 0.9)"] = (rss["edge-spec speculative greedy"]
                                                               / rss["llama.cpp AR greedy"])
    print("\n| ratio (same run) | value |\n|---|---:|")
    for k, v in ratios.items():
        print(f"| {k} | {'—' if v is None else f'{v:.2f}'} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "args": {k: str(v) for k, v in
                                    vars(args).items()}, "rows": {k: {kk: vv for kk, vv in v.items() if kk != "runs"}
                                                                  for k, v in rows.items()},
                                    "ratios": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
