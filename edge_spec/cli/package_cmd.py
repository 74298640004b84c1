"""``edge-spec package``: an exported bundle -> a bundle of ORT-format graphs for ONNX Runtime Mobile."""

from __future__ import annotations

import argparse
from pathlib import Path

from edge_spec.bundle import Manifest
from edge_spec.cli import common


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = common.command_parser(
        subparsers, "package", help="convert a bundle's graphs to the ORT format for ONNX Runtime Mobile",
        description="Write a copy of BUNDLE whose graphs are in ONNX Runtime's own format (.ort, converted with "
                    "onnxruntime.tools.convert_onnx_models_to_ort: optimizations applied, weights inside the file), "
                    "with required_operators.config and required_operators_and_types.config for a reduced ONNX "
                    "Runtime Mobile build (build.py --minimal_build --include_ops_by_config ...; contrib ops kept), "
                    "and the manifest's memory fields measured on the new graphs. The runtime (and every command) "
                    "loads it like any bundle; the original is left untouched. Needs the export extra (the converter "
                    "imports onnx); running the result needs only the base install. See docs/mobile.md.",
        examples="""
  edge-spec package bundles/smol --out bundles/smol-mobile
  edge-spec package demo --out demo-mobile --force
  edge-spec generate bundles/smol-mobile --prompt 'Hello'""")
    p.add_argument("bundle", metavar="BUNDLE", help=common.BUNDLE_HELP)
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory of the packaged bundle")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from edge_spec.export.mobile import package_bundle

    m = package_bundle(common.bundle_path(args.bundle), args.out, force=args.force)
    print(describe(args.out, m))
    return 0


def describe(out: Path, m: Manifest) -> str:
    """One line on what was written (shared with ``export --mobile``)."""
    sizes = ", ".join(f"{role} {common.mib(spec.weight_bytes)}" for role, spec in (("target", m.target),
                                                                                   ("drafter", m.drafter)) if spec)
    return (f"Wrote ORT-format bundle {out} ({sizes}; load peak {common.mib(m.target.load_peak)} for the target) "
            f"and {out / 'required_operators.config'} for a reduced ONNX Runtime Mobile build.")
