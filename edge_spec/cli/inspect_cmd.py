"""``edge-spec inspect``: what a bundle is, and its memory plan for a budget, from the manifest alone."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from edge_spec.cli import common


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = common.command_parser(
        subparsers, "inspect", help="describe a bundle and its memory plan for a budget",
        description="Describe a bundle (models, sizes, quantization, trimmed vocabulary, tokenizer, sources) and "
                    "the memory plan for a budget, item by item. The plan comes from the manifest plus this "
                    "process's baseline (python, onnxruntime and the tokenizer), exactly as Engine.load plans it; "
                    "then each graph is opened in ONNX Runtime and checked against the manifest (layers, KV heads, "
                    "head size, vocabulary), so a damaged bundle exits non-zero. With --device, each graph is also "
                    "opened for that device and ONNX Runtime's node placement is listed: which op types each "
                    "execution provider takes and which fall back to the CPU provider.",
        examples="""
  edge-spec inspect demo                                  # the demo pair, exported on first use
  edge-spec inspect coder                                 # the coder pair (docs/pairs.md)
  edge-spec inspect bundles/qwen
  edge-spec inspect bundles/qwen --memory-budget 300MB
  edge-spec inspect bundles/qwen --memory-budget 1GiB --json | jq .plan.items
  edge-spec inspect demo --device webgpu                  # which nodes WebGPU runs, which stay on the CPU
  edge-spec inspect demo --device openvino:NPU --drafter-device cpu""")
    p.add_argument("bundle", metavar="BUNDLE", help=common.BUNDLE_HELP)
    p.add_argument("--memory-budget", type=common.budget, metavar="SIZE", help="plan for this budget (default none)")
    p.add_argument("--max-context", type=common.positive_int, metavar="N", help="cap the planned context")
    p.add_argument("--prompt", metavar="TEXT", help="plan the context for this prompt (with --max-new-tokens), as "
                   "'edge-spec generate' does")
    p.add_argument("--max-new-tokens", type=common.positive_int, metavar="N",
                   help="plan the context for a request of this many new tokens (prompt + N, rounded up to 128)")
    p.add_argument("--device", type=common.device, metavar="DEVICE",
                   help="list ONNX Runtime's node placement of each graph on this device (as --device of "
                        "chat/generate; a device this onnxruntime lacks is an error here, not a fallback)")
    p.add_argument("--drafter-device", type=common.device, metavar="DEVICE",
                   help="the drafter's device for the placement (default: --device)")
    p.add_argument("--json", action="store_true", help="print the manifest and the plan as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tokenizers import Tokenizer

    from edge_spec.bundle import read_manifest
    from edge_spec.runtime.engine import Engine

    root = common.bundle_path(args.bundle)
    # Engine.plan runs Engine.load's own steps up to planning, so the two cannot disagree.
    plan = Engine.plan(root, args.memory_budget, max_context=args.max_context, prompt=args.prompt,
                       max_new_tokens=args.max_new_tokens)
    m = read_manifest(root)
    tok = Tokenizer.from_file(str(root / m.tokenizer.files[0]))
    _check_graphs(root, m)  # after planning: the sessions' memory is not part of the baseline
    placement = _placement(root, m, args.device, args.drafter_device) if args.device or args.drafter_device else {}
    stops = [(i, tok.id_to_token(i)) for i in m.tokenizer.stop_token_ids]
    if args.json:
        print(json.dumps({"bundle": str(root), "manifest": m.to_json(), "stop_tokens": dict(stops),
                          "plan": {**asdict(plan), "items": [{"what": w, "bytes": b} for w, b in plan.items],
                                   "total_bytes": plan.total_bytes},
                          **({"placement": {role: {"device": dev, "nodes": p.nodes, "ops": p.ops}
                                            for role, (dev, p) in placement.items()}} if placement else {})},
                         indent=2))
        return 0
    out = common.Console(sys.stdout)
    out.line(f"Bundle {root} (manifest v{m.version}, {m.created_by}, {m.created_at})")
    for role, spec in (("target", m.target), ("drafter", m.drafter)):
        if spec is None:
            out.line(f"  {role:<8} none (drafts come from prompt lookup)")
            continue
        q = spec.quantization
        quant = q.precision + (f", block {q.block_size}" if q.block_size else "") + \
            (f", accuracy level {q.accuracy_level}" if q.accuracy_level is not None else "")
        out.line(f"  {role:<8} {spec.architecture}: {spec.num_layers} layers, hidden {spec.hidden_size}, "
                 f"{spec.num_attention_heads} heads ({spec.num_kv_heads} KV) x {spec.head_size}, "
                 f"vocab {spec.vocab_size}/{spec.full_vocab_size}, context {spec.max_context}")
        fmt = " (ORT format)" if spec.graph_format == "ort" else ""
        out.line(f"           {quant}; weights {common.mib(spec.weight_bytes)} on disk{fmt}, "
                 f"{common.mib(spec.load_bytes)} resident when loaded, KV {spec.kv_bytes_per_token} B/token")
        if spec.feature_layers:
            what = "EAGLE-3 head: reads" if spec.kind == "eagle3" else "outputs for the drafter"
            out.line(f"           {what} the residual streams at layers {spec.feature_layers} "
                     f"({spec.feature_dim} features per token)")
    if m.drafter is not None:
        out.line(f"  drafting --drafting auto runs {m.drafting or 'hybrid'}"
                 + (" (chosen at export)" if m.drafting else " (the drafter, and prompt lookup where text repeats)"))
    vt = m.vocab_trim
    if vt is not None:
        out.line(f"  vocab    drafter keeps {vt.kept} of {vt.full} tokens ({vt.kept / vt.full:.1%}), covering "
                 f"{vt.coverage:.1%} of {vt.calibration_tokens} target-generated calibration tokens; LM head "
                 f"{vt.lm_head_bytes_before:,} B -> {vt.lm_head_bytes_after:,} B "
                 f"(-{1 - vt.lm_head_bytes_after / max(vt.lm_head_bytes_before, 1):.0%})")
    else:
        out.line("  vocab    not trimmed")
    chat = m.tokenizer.chat
    out.line(f"  tokens   vocab {m.tokenizer.vocab_size}; stop tokens "
             + ", ".join(f"{i} {t!r}" for i, t in stops))
    out.line("  chat     " + ("none (use generate with plain prompts)" if chat is None else
                              f"roles {', '.join(chat.roles)}; assistant turn starts {chat.generation_prompt!r}"))
    for role, src in m.sources.items():
        out.line(f"  source   {role}: {src.name} (sha256 {src.sha256[:12]})")
    out.line()
    out.line(plan.describe())
    width = max(len(w) for w, _ in plan.items)
    out.line("\nBytes, item by item:")
    for what, b in plan.items:
        out.line(f"  {what:<{width}}  {b:>13,}")
    out.line(f"  {'total':<{width}}  {plan.total_bytes:>13,}")
    if plan.budget_bytes is not None:
        out.line(f"  {'budget':<{width}}  {plan.budget_bytes:>13,}")
    if placement:
        out.line("\nNode placement (ONNX Runtime's, per graph):")
        for role, (dev, p) in placement.items():
            out.line(f"  {role} on {dev}:")
            for line in p.describe():
                out.line(f"    {line}")
    return 0


def _placement(root: Path, m, device: str | None, drafter_device: str | None) -> dict:
    """{role: (device, Placement)} for the graphs of the bundle on the devices asked for."""
    from edge_spec.runtime.placement import node_placement
    from edge_spec.runtime.providers import resolve

    out = {}
    for role, spec, dev in (("target", m.target, device or "cpu"), ("drafter", m.drafter, drafter_device or device)):
        if spec is None or dev is None:
            continue
        resolved = resolve(dev, strict=True, role=role)
        out[role] = (resolved.name, node_placement(root / spec.graph, resolved))
    return out


def _check_graphs(root: Path, m) -> None:
    """Open each graph in ONNX Runtime (no KV buffers) and check it against its manifest entry."""
    import onnxruntime as ort

    from edge_spec.errors import BundleError
    from edge_spec.runtime.options import session_options
    from edge_spec.runtime.session import check_graph

    for spec in (m.target, m.drafter):
        if spec is None:
            continue
        graph = root / spec.graph
        try:
            session = ort.InferenceSession(str(graph), session_options(1), providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises several unrelated types for a bad file
            raise BundleError(f"ONNX Runtime could not load '{graph}' ({str(exc).splitlines()[0][:160]}); the "
                              "bundle is damaged, re-export it.") from None
        check_graph(session, spec, graph)
        del session
