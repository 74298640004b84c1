"""The draft-length policy of this tree against the one at another git revision, on one bundle, in one process.

Two engines load the same bundle; one gets ``DraftPolicy`` objects built from ``edge_spec/runtime/drafting.py`` as
it was at ``--old-rev`` (read with ``git show``), the other keeps this tree's. For each held-out chat prompt and
temperature: one plain (AR) run, then both speculative runs, their order alternating so machine drift hits both;
greedy texts must equal AR's. Reports tokens/s, speculative / AR, tokens per target pass and the share of steps
that drafted with the model.

    python benchmarks/policy_ab.py --bundle demo --old-rev 4f3d3eb --prompts 20 --tokens 96 --threads 2 \
        [--drafting auto|model]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from chat_prompts import CHAT_PROMPTS, chat_messages  # noqa: E402


def old_policy_class(rev: str) -> type:
    """``DraftPolicy`` as defined at git revision ``rev``."""
    src = subprocess.run(["git", "-C", str(HERE.parent), "show", f"{rev}:edge_spec/runtime/drafting.py"],
                         check=True, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "old_drafting.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("old_drafting", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.DraftPolicy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--old-rev", required=True, help="git revision whose DraftPolicy is compared")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--drafting", choices=["auto", "model"], default="auto",
                    help="auto: hybrid with prompt lookup, as a user gets it (default); model: the drafter alone")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from edge_spec import Engine
    from edge_spec.demo import resolve_bundle

    bundle = resolve_bundle(args.bundle)
    engines = {name: Engine.load(bundle, max_context=1024, threads=args.threads, drafting=args.drafting)
               for name in ("old", "new")}
    old_cls, e = old_policy_class(args.old_rev), engines["old"]
    e._policy = old_cls(e._policy.max_gamma, free_drafts=e._policy.free_drafts)
    if e._lookup_policy is not None:
        e._lookup_policy = old_cls(e._lookup_policy.max_gamma, free_drafts=True)
    for e in engines.values():  # warm-up: first passes prepack weights
        e.chat(chat_messages(CHAT_PROMPTS[0]), max_new_tokens=8)
    rows = []
    for temp in args.temperatures:
        acc = {k: {"tokens": 0, "seconds": 0.0, "passes": 0, "model_steps": 0, "steps": 0} for k in ("ar", *engines)}
        for i, p in enumerate(CHAT_PROMPTS[:args.prompts]):
            seed = None if temp == 0 else i
            e = engines["new"]
            e.reset()
            ar = e.chat(chat_messages(p), max_new_tokens=args.tokens, temperature=temp, seed=seed, speculative=False)
            acc["ar"]["tokens"] += ar.stats.tokens
            acc["ar"]["seconds"] += ar.stats.seconds
            for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
                e = engines[name]
                e.reset()
                r = e.chat(chat_messages(p), max_new_tokens=args.tokens, temperature=temp, seed=seed)
                if temp == 0 and r.token_ids != ar.token_ids:
                    raise SystemExit(f"greedy speculative text differs from AR on prompt {i} ({name})")
                a = acc[name]
                a["tokens"] += r.stats.tokens
                a["seconds"] += r.stats.seconds
                a["passes"] += r.stats.target_passes
                a["steps"] += sum(r.stats.gamma_hist.values())
                a["model_steps"] += sum(n for g, n in r.stats.gamma_hist.items() if g)
        ar_rate = acc["ar"]["tokens"] / acc["ar"]["seconds"]
        row = {"temperature": temp, "ar_tok_s": round(ar_rate, 1)}
        for name in engines:
            a = acc[name]
            row[name] = {"tok_s": round(a["tokens"] / a["seconds"], 1),
                         "sd_over_ar": round(a["tokens"] / a["seconds"] / ar_rate, 3),
                         "tokens_per_pass": round(a["tokens"] / max(a["passes"], 1), 3),
                         "drafting_steps": round(a["model_steps"] / max(a["steps"], 1), 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(bundle), "old_rev": args.old_rev, "drafting": args.drafting,
                                         "prompts": args.prompts,
                                         "tokens": args.tokens, "threads": args.threads, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
