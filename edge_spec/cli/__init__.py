"""The ``edge-spec`` command line: thin wrappers that parse arguments and call the library.

Each command lives in its own module exposing ``add_parser(subparsers)`` and ``run(args) -> int``.
A user error (:class:`edge_spec.errors.EdgeSpecError`) prints one sentence and exits non-zero;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from edge_spec import __version__
from edge_spec.errors import EdgeSpecError

COMMANDS = ("export", "package", "chat", "generate", "serve", "bench", "inspect", "distill")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one sentence, exit 2, like every other user error
        self.exit(2, f"edge-spec: error: {message} (see '{self.prog} --help').\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="edge-spec", description="Lossless speculative decoding for ONNX Runtime on the edge.")
    parser.add_argument("--version", action="version", version=f"edge-spec {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--offline", action="store_true",
                        help="never use the network: a named pair's model files (demo, coder) must already be in "
                             "the cache")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"edge_spec.cli.{name}_cmd")
        except ModuleNotFoundError as exc:
            if exc.name != f"edge_spec.cli.{name}_cmd":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if args.offline:
        os.environ["EDGE_SPEC_OFFLINE"] = "1"  # read by edge_spec.demo, also in child export processes
    try:
        return int(args.run(args) or 0)
    except EdgeSpecError as exc:
        if args.debug:
            raise
        print(f"edge-spec: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("edge-spec: interrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
