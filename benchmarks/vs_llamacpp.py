"""edge-spec against llama.cpp and ORT GenAI on the same model, same prompt token ids, same threads: one run.

    python benchmarks/vs_llamacpp.py --bundle BUNDLE --gguf TARGET.gguf --draft-gguf DRAFTER.gguf --summary \
        [--tokens 128] [--prompts 8] [--repeats 2] [--rounds 1] [--threads 2] [--context N]

Systems (each in its own process, so peak RSS is its own), greedy and T=0.7:
* edge-spec AR (the speculative engine with ``speculative=False``: the reference greedy speculative decoding must
  equal, its 1-token passes padded to the graph's batch-invariant rows), speculative (adaptive draft length, the
  drafter model and prompt lookup: what a user gets), plain (``drafting="none"``, what ``edge-spec generate
  --no-speculation`` loads: no drafter, 1-row passes), and with ``--drafting-alone`` lookup only
  (``drafting="lookup"``: prompt lookup and the n-gram table, no drafter model loaded), drafter only
  (``drafting="model"``) and both (``drafting="hybrid"``; the speculative row runs the bundle's default, ``"auto"``),
  through ``Engine`` (lib/edge.py);
* llama.cpp (``llama-server`` fed token ids): AR, draft-model speculative decoding with the
  edge-spec drafter converted to GGUF (``--draft-gguf``, benchmarks/drafter_to_gguf.sh), and its
  n-gram lookup mode (``ngram-simple``);
* ORT GenAI (its C++ loop) AR and speculative on the bundle's own graphs, where it can run them.
With ``--rounds N`` every system runs N times, the order rotated each round (the first system a run measures
tended to come out low on this machine), and each row keeps its fastest round (all rounds listed in the JSON).
Then (lib/targets.py): greedy speculative vs greedy AR token for token (``--exact-prompts``
prompts), the generation-memory comparison and an edge-spec memory-budget sweep, the profile of a
speculative step (lib/profile_spec.py), and with ``--summary`` one markdown table of every target of
issue 10: measured, target, met or not. Ratios are between systems measured in this same run.
A benchmark, not a test: needs the real model and a llama.cpp build (benchmarks/build_llamacpp.sh).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from benchmarks.lib import llamacpp  # noqa: E402
from benchmarks.lib import targets as vs_targets  # noqa: E402
from benchmarks.lib.genai import bundle_composite  # noqa: E402
from benchmarks.lib.measure import measure  # noqa: E402
from benchmarks.lib.prompts import CHAT_PROMPTS, CODE_PROMPTS, prompt_ids  # noqa: E402


def guarded(fn, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """One system's measurement, or its error (the other rows still run)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # a peer that fails to start is a row, not the end of the run
        return {"error": f"{exc.__class__.__name__}: {str(exc)[:300]}"}


def edge(bundle: Path, ids: list[list[int]], *, tokens: int, temperature: float, repeats: int, threads: int,
         speculative: bool, budget: int | str | None = None, spin: bool = False,
         drafting: str | None = None) -> dict[str, Any]:
    """``drafting="none"``: the engine ``edge-spec generate --no-speculation`` loads (no drafter; 1-row passes)."""
    spec = {"module": "edge", "bundle": str(bundle), "prompt_ids": ids, "max_new_tokens": tokens,
            "temperature": temperature, "repeats": repeats, "warmup": 1, "threads": threads,
            "speculative": speculative, "budget": budget, "ignore_stop": True, "spin": spin, "drafting": drafting}
    return measure(spec)


def ort_genai(model: Path, ids: list[list[int]], *, tokens: int, temperature: float, repeats: int, threads: int,
              k: int | None, spin: bool) -> dict[str, Any]:
    spec = {"module": "genai", "system": "ort_genai", "model": str(model), "prompt_ids": ids,
            "max_new_tokens": tokens, "temperature": temperature, "repeats": repeats, "warmup": 1,
            "threads": threads, "k": k, "no_spin": not spin, "seed": 0}
    return measure(spec)


def log(msg: str) -> None:
    print(f"[vs_llamacpp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_systems(args: argparse.Namespace, ids: list[list[int]]) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Every system's row; and why ORT GenAI could not run the bundle's graphs (None when it could)."""
    common = {"tokens": args.tokens, "repeats": args.repeats, "threads": args.threads}
    ort_dirs = {k: bundle_composite(args.bundle, args.work / f"ort_composite_k{k}", k) for k in args.ort_k}
    ort_reason = next((d for d in ort_dirs.values() if isinstance(d, str)), None)
    drafter = json.loads((args.bundle / "edge_spec.json").read_text()).get("drafter") or {}
    # GenAI's speculative mode runs a standalone draft model; a head that reads the target's features is not one
    spec_reason = ("not applicable: ORT GenAI drafts with a standalone model, and this bundle's drafter is an EAGLE-3 "
                   "head that reads the target's hidden states") if drafter.get("kind") == "eagle3" else None
    rows: dict[str, dict[str, Any]] = {}

    def run_round(jobs: list[tuple[str, Any, tuple, dict]], r: int) -> None:
        """Round r runs every job once, in the order rotated by r (the first slot of a run tends to measure low on
        this machine, so no system keeps it); a row keeps its fastest round and lists every round's tok/s."""
        k = r % len(jobs)
        for name, fn, a, kw in jobs[k:] + jobs[:k]:
            log(f"{name} (round {r + 1} of {args.rounds})")
            res = guarded(fn, *a, **kw)
            speed = format(res.get("tokens_per_s", 0), ".1f") + " tok/s"
            log(f"{name}: {res.get('error') or res.get('refused') or speed}")
            old = rows.get(name)
            speeds = (old or {}).get("rounds_tokens_per_s", []) + [res.get("tokens_per_s")]
            if old is None or (res.get("tokens_per_s") or 0) > (old.get("tokens_per_s") or 0):
                rows[name] = res
            rows[name]["rounds_tokens_per_s"] = speeds

    for temp in args.temperatures:
        tag = "greedy" if temp == 0 else f"T={temp}"
        edge_kw = {"temperature": temp, "spin": args.edge_spin, **common}
        jobs: list[tuple[str, Any, tuple, dict]] = [
            (f"edge-spec AR {tag}", edge, (args.bundle, ids), {"speculative": False, **edge_kw}),
            (f"edge-spec speculative {tag}", edge, (args.bundle, ids), {"speculative": True, **edge_kw}),
            (f"edge-spec plain {tag}", edge, (args.bundle, ids), {"speculative": False, "drafting": "none",
                                                                  **edge_kw})]
        if args.drafting_alone:  # the speculative row's drafting alternatives: both (hybrid), then each alone: prompt
            # lookup and the n-gram table with no drafter model loaded; the drafter model with no lookup drafts
            jobs += [(f"edge-spec hybrid {tag}", edge, (args.bundle, ids),
                      {"speculative": True, "drafting": "hybrid", **edge_kw}),
                     (f"edge-spec lookup only {tag}", edge, (args.bundle, ids),
                      {"speculative": True, "drafting": "lookup", **edge_kw}),
                     (f"edge-spec drafter only {tag}", edge, (args.bundle, ids),
                      {"speculative": True, "drafting": "model", **edge_kw})]
        if args.context is None:  # the same context as edge-spec's plan, so peak RSS compares like with like
            run_round(jobs[1:2], 0)  # the speculative row alone, measured again in the rounds
            args.context = vs_targets.plan_context(rows[f"edge-spec speculative {tag}"]) or 4096
            log(f"llama.cpp context {args.context} (edge-spec's planned context)")
            rows.clear()
        lc = {"temperature": temp, "context": args.context, "draft_max": args.draft_max, "poll": args.llama_poll,
              **common}
        jobs.append((f"llama.cpp AR {tag}", llamacpp.run, (args.gguf, ids), {"mode": "ar", **lc}))
        if args.draft_gguf:
            jobs.append((f"llama.cpp speculative {tag}", llamacpp.run, (args.gguf, ids),
                         {"mode": "draft", "draft": args.draft_gguf, "spec_args": shlex.split(args.llama_spec_args),
                          **lc}))
        jobs.append((f"llama.cpp n-gram {tag}", llamacpp.run, (args.gguf, ids), {"mode": "ngram", **lc}))
        if ort_reason is None and not args.skip_ort:
            target_dir = ort_dirs[args.ort_k[0]][0]
            ort_kw = {"temperature": temp, "spin": args.ort_spin, **common}
            jobs.append((f"ORT GenAI AR {tag}", ort_genai, (target_dir, ids), {"k": None, **ort_kw}))
            # every k greedy; at T=0.7 the k that was fastest greedy
            ks = args.ort_k if temp == 0 else [max(args.ort_k, key=lambda k: rows.get(
                f"ORT GenAI speculative k={k} greedy", {}).get("tokens_per_s") or 0)]
            for k in ks:
                if spec_reason:  # a row in its place in the table, run (instantly) like the others
                    jobs.append((f"ORT GenAI speculative k={k} {tag}", lambda: {"refused": spec_reason}, (), {}))
                    continue
                jobs.append((f"ORT GenAI speculative k={k} {tag}", ort_genai, (ort_dirs[k][1], ids),
                             {"k": k, **ort_kw}))
        if args.systems:  # a subset, by name: e.g. --systems "edge-spec plain" "llama.cpp AR"
            jobs = [j for j in jobs if any(j[0].startswith(x) for x in args.systems)]
        for r in range(args.rounds):
            run_round(jobs, r)
    return rows, ort_reason


def profile(args: argparse.Namespace) -> str:
    """The speculative-step profile table (profile_spec.py in its own process), or why it failed."""
    cmd = [sys.executable, str(HERE / "lib" / "profile_spec.py"), "--bundle", str(args.bundle), "--prompts",
           str(min(args.prompts, 4)), "--tokens", str(args.tokens), "--threads", str(args.threads),
           "--gammas", *args.profile_gammas]
    log("profile: " + " ".join(cmd[1:]))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        return "profile_spec.py failed: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
    return proc.stdout.strip()


def print_rows(rows: dict[str, dict[str, Any]], info: dict[str, Any]) -> None:
    print("| system | tokens/s | TTFT ms | peak RSS MiB | generation memory MiB | acceptance |\n"
          "|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        if "error" in r or "refused" in r:
            print(f"| {name} | {'error' if 'error' in r else 'refused'}: {(r.get('error') or r['refused'])[:100]} "
                  f"| | | | |")
            continue
        acc, gen = r.get("acceptance"), info["gen_memory"].get(name)
        print(f"| {name} | {r['tokens_per_s']:.1f} | {r['ttft_ms']:.1f} | {r['peak_rss'] / 2**20:.0f} | "
              f"{'—' if gen is None else f'{gen / 2**20:.0f}'} | {'—' if acc is None else f'{acc:.2f}'} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--draft-gguf", type=Path, help="the edge-spec drafter as GGUF (benchmarks/drafter_to_gguf.sh)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every system this many times, the order rotated each round; a row keeps its fastest")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, help="llama.cpp's context (-c); default: the context edge-spec's "
                    "plan gives (4096 if unknown), so the peak-RSS target compares the same context")
    ap.add_argument("--draft-max", type=int, default=8, help="llama.cpp's most drafted tokens (draft model, n-gram)")
    ap.add_argument("--llama-poll", type=int, help="llama.cpp --poll (0: no busy-waiting, for a shared machine; "
                    "default: llama.cpp's own)")
    ap.add_argument("--llama-spec-args", default="", help="extra llama-server arguments for its draft-model "
                    "mode, e.g. '--spec-draft-p-min 0.75'")
    ap.add_argument("--ort-k", type=int, nargs="+", default=[2, 4],
                    help="ORT GenAI max_draft_tokens tried greedy (the targets compare with the fastest)")
    ap.add_argument("--edge-spin", action="store_true", help="edge-spec with Engine.load(spin=True) (the CLI's "
                    "--spin), as llama.cpp busy-waits by default; off by default")
    ap.add_argument("--ort-spin", action="store_true", help="ORT GenAI with intra-op spinning (its default); "
                    "off by default, as edge-spec's sessions")
    ap.add_argument("--skip-ort", action="store_true")
    ap.add_argument("--code", action="store_true", help="the coding tasks (lib/prompts.CODE_PROMPTS) as prompts")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--drafting-alone", action="store_true",
                    help="also edge-spec hybrid (drafter + lookup), lookup only (no drafter model loaded) and drafter "
                    "only (no lookup drafts)")
    ap.add_argument("--systems", nargs="*", help="run only the systems whose row name starts with one of these")
    ap.add_argument("--exact-prompts", type=int, default=200,
                    help="prompts for greedy speculative == greedy AR (0: only the run's prompts)")
    ap.add_argument("--exact-tokens", type=int, default=32)
    ap.add_argument("--sweep-prompts", type=int, default=4)
    ap.add_argument("--sweep-fractions", type=float, nargs="*", default=[1.0, 0.5, 0.35],
                    help="budgets that leave edge-spec this fraction of llama.cpp's generation memory")
    ap.add_argument("--profile-gammas", nargs="*", default=["auto", "4"],
                    help="draft lengths profiled ('auto': the adaptive policy); none: no profile")
    ap.add_argument("--summary", action="store_true", help="print the table of issue 10's targets")
    ap.add_argument("--work", type=Path, default=HERE / "out" / "vs_llamacpp")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "vs_llamacpp.json")
    args = ap.parse_args()
    if llamacpp.bin_dir() is None:
        log("llama.cpp binaries not found (set LLAMA_CPP_BIN); its rows will be errors")
    t0 = time.time()
    ids = prompt_ids(args.bundle, list((CODE_PROMPTS if args.code else CHAT_PROMPTS)[:args.prompts]))
    rows, ort_reason = run_systems(args, ids)
    exact = vs_targets.exactness(rows, args, prompt_ids, log)
    sweep = vs_targets.budget_sweep(rows, args, ids[:args.sweep_prompts], log)
    info = vs_targets.memory_info(rows, args.bundle) | {"llama_context": args.context}
    prof = profile(args) if args.profile_gammas else "not run (--profile-gammas empty)"

    kind = "code" if args.code else "chat"
    print(f"\n{len(ids)} {kind} prompts x {args.repeats} repeats, {args.tokens} new tokens, {args.threads} threads, "
          f"llama.cpp context {args.context}; edge-spec {info['edge_plan']}")
    print_rows(rows, info)
    if ort_reason:
        print(f"\nORT GenAI: not run on this bundle's graphs: {ort_reason}.")
    elif json.loads((args.bundle / "edge_spec.json").read_text()).get("vocab_trim"):
        print("\nORT GenAI speculative ran the bundle's drafter with its trimmed logits scattered back to the full "
              "vocabulary (lib/genai.untrim_drafter: GenAI compares draft and target logits id by id).")
    print("\n" + vs_targets.sweep_table(sweep))
    print("\n" + vs_targets.exact_text(exact))
    print("\n### Profile of a speculative step (benchmarks/lib/profile_spec.py)\n\n" + prof)
    targets = vs_targets.targets(rows, info, sweep, exact, ort_reason, prof)
    if args.summary:
        print("\n### Issue 10 targets (this run)\n\n" + vs_targets.summary_table(targets))
    print(f"\nwall time {time.time() - t0:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M"), "args": {k: str(v) for k, v in vars(args).items()},
        "rows": {k: {kk: vv for kk, vv in v.items() if kk not in ("runs", "token_ids")} for k, v in rows.items()},
        "ort_genai_unavailable": ort_reason, "memory": info, "budget_sweep": sweep, "exactness": exact,
        "profile": prof, "targets": targets}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
