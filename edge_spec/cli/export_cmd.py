"""``edge-spec export``: a target + drafter (Hugging Face checkpoints or GGUF files) -> an edge-spec bundle."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from edge_spec.errors import ExportError

if TYPE_CHECKING:
    from edge_spec.export.pipeline import ExportOptions


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from edge_spec.cli.common import command_parser
    from edge_spec.export.build import SUPPORTED_ARCHITECTURES  # stdlib-only modules: --help stays fast
    from edge_spec.export.gguf import ARCHITECTURES as GGUF_ARCHITECTURES

    archs = ", ".join(a.removesuffix("ForCausalLM") for a in SUPPORTED_ARCHITECTURES)
    gguf_archs = ", ".join(GGUF_ARCHITECTURES)
    p = command_parser(
        subparsers, "export", help="export a target/drafter pair to an edge-spec bundle",
        description=textwrap.fill(
            "Build ONNX graphs (a GGUF file keeps its own quantization; Hugging Face checkpoints go through the ORT "
            "GenAI model builder), trim the drafter vocabulary, measure memory, and write a bundle with its "
            "manifest. Target and drafter must share a tokenizer.", 100) + "\n\n" + textwrap.fill(
            f"Architectures: GGUF files: {gguf_archs}; Hugging Face checkpoints (config.json 'architectures', "
            f"each ...ForCausalLM): {archs}.", 100) + "\n\n" +
        textwrap.fill("Time: the toy test pair (8.9M + 2.4M parameters) takes 1 to 1.5 minutes on 2 CPU cores, the "
                      "SmolLM2-135M demo about 1; larger models take longer (building, quantizing and calibrating "
                      "grow with the model).", 100),
        examples="""
  edge-spec export --target SmolLM2-135M-Instruct.Q4_1.gguf --drafter models/smollm2-eagle3 --out bundles/smol
  edge-spec export --target model.gguf --out bundles/alone      # no drafter yet: prompt-lookup drafts
  edge-spec export --target model.gguf --drafter my-eagle3-head --out bundles/fast   # from edge-spec distill
  edge-spec export --target model.gguf --drafter my-eagle3-head --out bundles/fast \
                   --ngrams my-eagle3-head/data/answers.npz   # + drafts from the target's own writing
  edge-spec export --target models/demo/target --drafter models/demo/drafter --out bundles/demo
  edge-spec export --target Qwen/Qwen2.5-1.5B-Instruct --drafter Qwen/Qwen2.5-0.5B-Instruct \\
                   --out bundles/qwen --max-context 4096
  edge-spec export --target T --drafter D --out B --quant int8 --trim-vocab 8192 --force
  edge-spec export --target T --drafter D --out B --calibration prompts.txt   # your own domain
  edge-spec export --target model.gguf --drafter D --out bundles/phone --mobile   # .ort graphs""")
    p.add_argument("--target", required=True, metavar="DIR_OR_GGUF", help="target: FILE.gguf, checkpoint dir or hub id")
    p.add_argument("--drafter", metavar="DIR_OR_GGUF",
                   help="drafter (same tokenizer): FILE.gguf, an EAGLE-3 head dir (edge-spec distill --kind eagle3 "
                        "or a published one), an edge-spec distilled drafter dir, a checkpoint dir or hub id; "
                        "omitted: a bundle without a drafter model (prompt-lookup drafts)")
    p.add_argument("--out", required=True, metavar="BUNDLE_DIR", help="bundle directory to create")
    p.add_argument("--quant", metavar="PREC[:LEVEL]",
                   help="precision for both models: int4|int8|fp16|fp32, optional int4/int8 accuracy level "
                        "(e.g. int4:1); default: a GGUF target keeps its own precision at accuracy level 4 (int8 "
                        "activations, as llama.cpp; --target-quant int4:1 for fp32 activations), a Hugging Face "
                        "target int4:1, the drafter int4:4 (an EAGLE-3 head int8:4)")
    p.add_argument("--target-quant", metavar="PREC[:LEVEL]", help="target precision (overrides --quant)")
    p.add_argument("--drafter-quant", metavar="PREC[:LEVEL]", help="drafter precision (overrides --quant)")
    p.add_argument("--lm-head", choices=("int8", "fp32"),
                   help="Hugging Face checkpoints: keep the LM head at int8 or fp32 under an int4/int8 body")
    p.add_argument("--gguf-mode", choices=("auto", "kquant", "split", "exact", "fast", "compact"), default="auto",
                   help="GGUF tensors: kquant = Q4_K / Q6_K (and Q8_0 / Q5_0 / Q4_1 layer) tensors keep the file's "
                        "bytes and "
                        "run on edge-spec's compiled K-quant kernels (the graph at the file's size; other types as "
                        "split); auto = "
                        "kquant where those kernels run here, else split (default); split = float-offset types "
                        "(Q4_1, Q4_K, Q2_K, Q5_1, Q5_K) as exact d*q MatMulNBits + block sums times the block offsets "
                        "(every weight equals the file's, fast "
                        "kernels); exact = types ONNX Runtime only runs through slow fallbacks become fp32 "
                        "MatMuls of the exact values (the reference graph: with --target-quant int4:1 it matches "
                        "transformers fp32; ~4x larger, ~2x slower); fast = Q4_1/Q4_K/Q2_K as 8-bit integer zero "
                        "points (not exact); compact = MatMulNBits everywhere (smallest, slow float-zero-point "
                        "kernels)")
    p.add_argument("--ngrams", nargs="+", type=Path, default=(), metavar="ANSWERS.npz",
                   help="answers files of edge-spec distill for this target (DRAFTER_DIR/data/answers.npz): the "
                        "bundle gets a static n-gram table of the target's own writing, which drafts where the "
                        "context has no repeat to look up (llama.cpp's static lookup cache; output unchanged)")
    p.add_argument("--default-drafting", choices=("hybrid", "model", "lookup"), metavar="MODE",
                   help="what --drafting auto runs with this bundle: hybrid (the drafter, and prompt lookup where the "
                        "text repeats itself; the default), model or lookup — pick the one measured fastest for the "
                        "pair (docs/pairs.md); a user's --drafting still chooses")
    p.add_argument("--trim-vocab", default="auto", metavar="K|auto|off",
                   help="keep K drafter LM-head rows; auto = smallest K covering 99%% of target tokens (default)")
    p.add_argument("--calibration", type=Path, metavar="FILE",
                   help="calibration prompts, one per line ('chat:' prefix = user turn); default: built-in set")
    p.add_argument("--max-context", type=int, metavar="N",
                   help="tokens the KV buffers may hold (default: the target's positions, at most 4096)")
    p.add_argument("--kv-dtype", choices=("fp16", "fp32"),
                   help="KV cache precision of graphs edge-spec builds (GGUF files, distilled drafters, EAGLE-3 "
                        "heads): fp16 (default, as llama.cpp) is half the memory of fp32 (q/k/v cast to fp16 around "
                        "attention; speculative output still equals plain decoding of the same bundle); Hugging "
                        "Face targets (the builder's graphs) keep fp32")
    p.add_argument("--execution-provider", default="cpu", choices=("cpu", "cuda", "dml", "webgpu"),
                   help="the provider ONNX Runtime GenAI's builder shapes a Hugging Face target's graphs for; a GGUF "
                        "target gets one graph for every provider (choose the device at run time: --device)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow checkpoints that need hub code")
    p.add_argument("--mobile", action="store_true",
                   help="write the graphs in the ORT format for ONNX Runtime Mobile, with the required-operators "
                        "config of a reduced build (as 'edge-spec package' does to an exported bundle)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.set_defaults(run=run)


def _trim(value: str) -> int | str | None:
    if value == "off":
        return None
    if value == "auto":
        return "auto"
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise ExportError(f"--trim-vocab '{value}' is not valid; use a positive integer K, 'auto' or 'off'.")


def run(args: argparse.Namespace) -> int:
    from edge_spec.export.pipeline import DEFAULT_QUANT, ExportOptions, Quant, export_bundle

    target_quant = Quant.parse(args.target_quant or args.quant or DEFAULT_QUANT["target"], "target")
    given = args.drafter_quant or args.quant  # none: the drafter's own default (int8 for an EAGLE-3 head, else int4)
    opts = ExportOptions(target_quant=target_quant, drafter_quant=Quant.parse(given, "drafter") if given else None,
                         trim_vocab=_trim(args.trim_vocab), calibration=args.calibration,
                         max_context=args.max_context, execution_provider=args.execution_provider,
                         force=args.force, trust_remote_code=args.trust_remote_code, lm_head=args.lm_head,
                         gguf_mode=args.gguf_mode, ngrams=tuple(args.ngrams), default_drafting=args.default_drafting,
                         kv_dtype={"fp16": "float16", "fp32": "float32", None: "auto"}[args.kv_dtype])
    if args.mobile:
        return _export_mobile(args, opts)
    m = export_bundle(args.target, args.drafter, args.out, opts)
    trim = f", drafter vocab {m.vocab_trim.kept}/{m.vocab_trim.full}" if m.vocab_trim else ""
    drafter = "no drafter" if m.drafter is None else \
        f"{'EAGLE-3 ' if m.drafter.kind == 'eagle3' else ''}drafter {m.drafter.quantization.precision}{trim}"
    if m.ngrams is not None:
        drafter += f", n-gram table {m.ngrams.entries:,} entries"
    print(f"Wrote bundle {args.out} (target {m.target.quantization.precision}, {drafter}) in "
          f"{m.notes.get('export_seconds')}s.")
    return 0


def _export_mobile(args: argparse.Namespace, opts: ExportOptions) -> int:
    """Export the ONNX bundle into a temp dir beside ``--out``, package it into ``--out``, drop the temp dir."""
    import os
    import shutil
    import tempfile
    from dataclasses import replace

    from edge_spec.cli.package_cmd import describe
    from edge_spec.export.mobile import package_bundle
    from edge_spec.export.pipeline import export_bundle

    out = Path(args.out)
    if out.exists() and not args.force:  # before minutes of exporting, not after
        raise ExportError(f"The output '{out}' already exists; pass --force to replace it or choose another --out.")
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-onnx-", dir=parent))
    except OSError as exc:
        raise ExportError(f"Cannot write to the output directory '{parent}' ({exc.strerror}); choose a writable "
                          "--out location.") from None
    try:
        # ONNX Runtime Mobile cannot load edge-spec's kernels: --gguf-mode auto means ONNX Runtime's own ops here
        mode = "split" if opts.gguf_mode == "auto" else opts.gguf_mode
        export_bundle(args.target, args.drafter, work / "onnx", replace(opts, force=False, gguf_mode=mode))
        m = package_bundle(work / "onnx", out, force=args.force)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(describe(out, m))
    return 0
