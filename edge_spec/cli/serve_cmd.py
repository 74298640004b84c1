"""``edge-spec serve``: an OpenAI-compatible HTTP server over one bundle (needs the ``serve`` extra)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from edge_spec.cli import common
from edge_spec.errors import EdgeSpecError

API_KEY_ENV = "EDGE_SPEC_API_KEY"
EXTRA = ("starlette", "uvicorn", "anyio")  # what pip install 'edge-spec[serve]' brings


def _port(text: str) -> int:
    value = common.nonneg_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number up to 65535 (0 = any free port), not {value}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = common.command_parser(
        subparsers, "serve", help="serve a bundle over an OpenAI-compatible HTTP API (needs edge-spec[serve])",
        description="Serve a bundle at http://HOST:PORT/v1 with the OpenAI API's chat/completions, completions and "
                    "models endpoints (streaming too), plus GET /health. One request is generated at a time, in "
                    "arrival order; up to --queue more wait, beyond that the server answers 503 with Retry-After. "
                    "A chat that re-sends its history reuses the KV of the previous turn; one that outgrows the "
                    "context drops its oldest turns, as 'edge-spec chat' does. Ctrl-C or SIGTERM stops it.",
        examples="""
  edge-spec serve                                        # the demo pair on http://127.0.0.1:8080/v1
  edge-spec serve bundles/qwen --port 9000 --memory-budget 1.5GB --max-context 4096
  EDGE_SPEC_API_KEY=secret edge-spec serve demo --host 0.0.0.0   # reachable from the network: use a key
  curl http://127.0.0.1:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'""")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help=common.BUNDLE_HELP + " (default: demo)")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 = every interface)")
    g.add_argument("--port", type=_port, default=8080, metavar="N", help="TCP port (default 8080; 0 = any free one)")
    g.add_argument("--api-key", metavar="KEY", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV}, else none)")
    g.add_argument("--queue", type=common.nonneg_int, default=16, metavar="N",
                   help="requests that may wait while one is generated (default 16); more get HTTP 503")
    g.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser pages from ORIGIN (e.g. http://localhost:3000) to call the API; repeatable "
                        "(default: no CORS headers)")
    g.add_argument("--model-name", metavar="NAME",
                   help="the model id clients send and /v1/models lists (default: the pair's name, 'demo' or "
                        "'coder', or the bundle's directory name)")
    g.add_argument("--quiet", action="store_true", help="no line per request (warnings and errors only)")
    p.add_argument("--max-context", type=common.positive_int, metavar="N",
                   help="tokens a conversation may hold (default: the bundle's, or what the memory budget allows); "
                        "longer ones drop their oldest turns")
    p.add_argument("--drafting", choices=("auto", "hybrid", "model", "lookup", "none"), default="auto",
                   help=common.DRAFTING_HELP + "; none = no speculation")
    common.add_load_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from edge_spec.serve import ServeConfig, create_app
        from edge_spec.serve.run import base_url, bind, is_loopback, serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in EXTRA:
            raise
        raise EdgeSpecError(f"edge-spec serve needs the serve extra ({exc.name} is missing); run "
                            "pip install 'edge-spec[serve]'.") from None
    if args.api_key is not None and not args.api_key.strip():
        raise EdgeSpecError("The API key is empty; pass --api-key KEY with some text, or leave it out.")
    from edge_spec import demo

    err = common.Console(sys.stderr)
    name = args.bundle or demo.DEMO_NAME
    sock = bind(args.host, args.port)  # before the (maybe long) load: a port in use fails at once
    try:
        bundle = demo.resolve_bundle(name, progress=lambda msg: err.line(err.dim(f"edge-spec: {msg}")))
        engine = common.load_engine(args, bundle)
        names = (args.model_name,) if args.model_name else ()
        names += (str(name),) if str(name) in demo.PAIR_NAMES and bundle != Path(name) else ()
        names += (Path(bundle).resolve().name,)
        config = ServeConfig(model_names=tuple(dict.fromkeys(names)), api_key=args.api_key, queue_size=args.queue,
                             cors_origins=tuple(args.cors_origin))
        app = create_app(engine, config)
    except BaseException:
        sock.close()
        raise
    if not is_loopback(sock) and not args.api_key:
        err.line(f"edge-spec serve: warning: listening on {args.host}, which other machines can reach, without "
                 f"--api-key: anyone on the network can use this model; pass --api-key KEY (or set {API_KEY_ENV}).")
    plan = engine.plan
    chat = "" if engine.manifest.tokenizer.chat else " (no chat format: only /v1/completions)"
    started = (f"edge-spec serve: {base_url(sock)} serves '{config.model_names[0]}'{chat} ({plan.mode}, context "
               f"{plan.max_context} tokens, queue {args.queue}); Ctrl-C stops.")
    stopped_by = serve(app, sock, log_level="warning" if args.quiet else "info", access_log=not args.quiet,
                       on_start=lambda: err.line(started))
    err.line(f"edge-spec serve: stopped ({stopped_by or 'shut down'}).")
    return 0
