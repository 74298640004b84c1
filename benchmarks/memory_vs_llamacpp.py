"""Peak RSS of edge-spec (AR and speculative, drafter loaded) against llama.cpp AR, same GGUF, same context.

    python benchmarks/memory_vs_llamacpp.py --gguf /work/smollm2.gguf --bundle B1 [--bundle B2 ...] \
        [--context 4096] [--tokens 128] [--threads 2] [--fill] [--out results.json]

Each row runs once in its own fresh process; its peak RSS is the kernel's ``ru_maxrss`` of that one
child (``os.wait4``), so every number is the whole process: interpreter, runtime, weights, KV and
buffers. Rows:

* llama.cpp AR: ``llama-completion -c CONTEXT`` and ``-c REQUEST`` (the context edge-spec plans for
  the request), ``--ignore-eos`` so all ``--tokens`` are generated;
* per bundle: edge-spec AR (``--no-speculation``) and speculative (drafter loaded), at
  ``--max-context CONTEXT`` and at the request-sized default (prompt + tokens, rounded up to 128);
* the process baseline (python + onnxruntime + numpy + tokenizer, no session), to split edge-spec's
  peak into baseline, session loads (weights) and generation memory (KV, buffers, workspace).

``--fill``: the prompt is long enough that prompt + ``--tokens`` fill the context (edge-spec's own runtime sources
to explain, cut to size with the first bundle's tokenizer; until 2026-12-02 the code prompts of
``benchmarks/lib/prompts.py`` repeated, a tenth as many distinct tokens), so every KV position the plan reserves is
written (edge-spec) and the embedding rows of a context's worth of text are read; only the ``--context`` rows run
then (the request-sized context is the same).

Ratios are against llama.cpp AR at the same context, measured in this same run. A benchmark, not
a test: needs the real GGUF and a llama.cpp build (benchmarks/build_llamacpp.sh, or ``$LLAMA_CPP_BIN``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from benchmarks.lib.llamacpp import bin_dir  # noqa: E402
from benchmarks.lib.prompts import CHAT_PROMPTS, prompt_ids  # noqa: E402

MiB = 1 << 20
PROMPT = CHAT_PROMPTS[1]
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # SmolLM2's template (system block aside)
BASELINE = ("import sys, numpy, numpy.random, onnxruntime; from tokenizers import Tokenizer; "
            "t = Tokenizer.from_file(sys.argv[1]); t.encode('warm up'); numpy.random.default_rng(0)")


def run_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, str, int]:
    """Run ``cmd`` to the end; (exit code, stdout, peak RSS bytes of that child, from ``os.wait4``)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # reaps it and reads that one child's rusage
        code = proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if code != 0:
            print(f"{' '.join(cmd[:4])} ... exited {code}: {err.read().decode(errors='replace')[-600:]}",
                  file=sys.stderr)
        return code, out.read().decode(errors="replace"), int(usage.ru_maxrss) * 1024


def fill_prompt(bundle: Path, context: int, tokens: int) -> str:
    """A user message whose chat prompt (the bundle's template) is ``context - tokens - 8`` tokens or a few less:
    "explain this code" over edge-spec's own runtime sources (real code, as a code model's long prompts are; the
    context's distinct tokens decide how much of the mapped embedding table becomes resident)."""
    want = context - tokens - 8
    sources = sorted((HERE.parent / "edge_spec" / "runtime").glob("*.py"))
    text = "Explain what this Python code does, file by file:\n\n"
    for f in sources:
        if len(prompt_ids(bundle, [text])[0]) >= want:
            break
        text += f"# {f.name}\n{f.read_text(encoding='utf-8')}\n"
    words = text.split(" ")
    lo, hi = 1, len(words)  # the most words whose prompt still fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(prompt_ids(bundle, [" ".join(words[:mid])])[0]) <= want else (lo, mid - 1)
    return " ".join(words[:lo])


def llamacpp_row(gguf: Path, prompt: str, context: int, tokens: int, threads: int) -> dict[str, Any]:
    root = bin_dir()
    if root is None:
        raise SystemExit("llama.cpp is not built; run benchmarks/build_llamacpp.sh or set LLAMA_CPP_BIN.")
    env = {**os.environ, "LD_LIBRARY_PATH": str(root)}
    cmd = [str(root / "llama-completion"), "-m", str(gguf), "-p", CHATML.format(prompt), "-n", str(tokens),
           "-c", str(context), "-t", str(threads), "-tb", str(threads), "-no-cnv", "--temp", "0", "--ignore-eos",
           "--no-warmup"]
    code, _, rss = run_child(cmd, env)
    return {"system": "llama.cpp AR", "context": context, "ok": code == 0, "peak_rss": rss}


def edge_row(bundle: Path, prompt: str, context: int | None, tokens: int, threads: int,
             speculative: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "edge_spec", "generate", str(bundle), "--prompt", prompt, "--chat",
           "--max-new-tokens", str(tokens), "--json", "--threads", str(threads)]
    cmd += [] if context is None else ["--max-context", str(context)]
    cmd += [] if speculative else ["--no-speculation"]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    code, out, rss = run_child(cmd, env)
    row: dict[str, Any] = {"system": f"edge-spec {'speculative' if speculative else 'AR'}", "bundle": bundle.name,
                           "ok": code == 0, "peak_rss": rss}
    if code == 0:
        data = json.loads(out)
        plan = data["plan"]
        row.update(context=plan["max_context"], mode=plan["mode"], planned=plan["planned_bytes"],
                   tokens=data["stats"].get("tokens"), self_peak=data["peak_rss_bytes"])
    return row


def baseline(bundle: Path) -> int:
    from edge_spec.bundle import read_manifest

    tok = bundle / read_manifest(bundle).tokenizer.files[0]
    return run_child([sys.executable, "-c", BASELINE, str(tok)])[2]


def loads(bundle: Path) -> tuple[int, int, float]:
    """(target load_bytes, drafter load_bytes, target KV bytes per token) from the manifest."""
    from edge_spec.bundle import read_manifest

    m = read_manifest(bundle)
    kv = m.target.kv_bytes_per_token + (m.drafter.kv_bytes_per_token if m.drafter else 0)
    return m.target.load_bytes, m.drafter.load_bytes if m.drafter else 0, kv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--bundle", type=Path, action="append", required=True)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fill", action="store_true", help="a prompt that fills the context (module docstring)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    prompt = fill_prompt(args.bundle[0], args.context, args.tokens) if args.fill else PROMPT

    rows: list[dict[str, Any]] = []
    base = baseline(args.bundle[0])
    for bundle in args.bundle:
        for speculative in (False, True):
            for ctx in (args.context,) if args.fill else (args.context, None):
                rows.append(edge_row(bundle, prompt, ctx, args.tokens, args.threads, speculative))
                print(json.dumps(rows[-1]), file=sys.stderr)
    request = sorted({r["context"] for r in rows if r.get("ok") and r["context"] != args.context})
    llama = {}
    for ctx in [args.context, *request]:
        llama[ctx] = llamacpp_row(args.gguf, prompt, ctx, args.tokens, args.threads)
        rows.append(llama[ctx])
        print(json.dumps(rows[-1]), file=sys.stderr)

    ids = prompt_ids(args.bundle[0], [prompt])[0]
    print(f"prompt: {len(ids)} tokens, {len(set(ids))} distinct")
    print(f"process baseline (python + onnxruntime + numpy + tokenizer): {base / MiB:.1f} MiB")
    print(f"{'system':<22} {'bundle':<16} {'context':>7} {'mode':<12} {'peak RSS':>10} {'vs llama.cpp':>12} "
          f"{'generation memory':>18}")
    for r in rows:
        ref = llama.get(r.get("context"))
        ratio = f"{r['peak_rss'] / ref['peak_rss']:.2f}x" if ref and ref["ok"] and r["ok"] else "-"
        gen = "-"
        if r["system"].startswith("edge-spec") and r["ok"]:
            t_load, d_load, _ = loads(args.bundle[[b.name for b in args.bundle].index(r["bundle"])])
            weights = t_load + (d_load if r["mode"] == "speculative" else 0)
            gen_bytes = r["peak_rss"] - base - weights
            r["generation_bytes"] = gen_bytes
            gen = f"{gen_bytes / MiB:.1f} MiB"
        print(f"{r['system']:<22} {r.get('bundle', '-'):<16} {r.get('context', '-')!s:>7} {r.get('mode', '-'):<12} "
              f"{r['peak_rss'] / MiB:>6.1f} MiB {ratio:>12} {gen:>18}")
    if args.out:
        args.out.write_text(json.dumps({"baseline": base, "rows": rows, "prompt": prompt, "tokens": args.tokens,
                                        "prompt_tokens": len(ids), "distinct_prompt_tokens": len(set(ids)),
                                        "threads": args.threads}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
