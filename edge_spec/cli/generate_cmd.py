"""``edge-spec generate``: one prompt in, one completion out (streamed text, or JSON with stats)."""

from __future__ import annotations

import argparse
import json
import sys

from edge_spec.cli import common
from edge_spec.errors import EdgeSpecError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = common.command_parser(
        subparsers, "generate", help="complete one prompt (scriptable; --json for text + stats)",
        description="Complete one prompt and print the text as it is generated. With --json, print one JSON "
                    "object instead: text, finish reason, token ids, generation stats and the memory plan.",
        examples="""
  edge-spec generate demo --prompt 'def fibonacci(n):'          # the demo pair, exported on first use
  edge-spec generate coder --chat --prompt 'Write a Python palindrome check.'   # the coder pair
  edge-spec generate bundles/qwen --prompt 'def fibonacci(n):'
  edge-spec generate bundles/qwen --chat --prompt 'Write a haiku about RAM.' --temperature 0.7 --seed 3
  echo 'import numpy as np' | edge-spec generate bundles/qwen --json --max-new-tokens 32 | jq .stats
  edge-spec generate bundles/qwen --prompt 'Q: 2+2?' --stop '\\n' --memory-budget 400MB""")
    p.add_argument("bundle", metavar="BUNDLE", help=common.BUNDLE_HELP)
    p.add_argument("--prompt", metavar="TEXT", help="the prompt; absent or '-' reads it from stdin")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat format")
    p.add_argument("--system", metavar="PROMPT", help="system message (with --chat)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text appears (not printed; \\n and \\t are understood); repeatable")
    p.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    p.add_argument("--max-context", type=common.positive_int, metavar="N",
                   help="KV positions to preallocate (default: what this request needs, the prompt + "
                        "--max-new-tokens rounded up to 128, within the bundle's context and the budget)")
    common.add_sampling_options(p)
    common.add_load_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.system and not args.chat:
        raise EdgeSpecError("--system only applies with --chat; add --chat or drop --system.")
    cfg = common.generation_config(args, stop=tuple(common.unescape(s) for s in args.stop))
    prompt = _prompt(args.prompt)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": prompt}]
    engine = common.load_engine(args, common.bundle_path(args.bundle), messages if args.chat else prompt,
                                cfg.max_new_tokens)
    if args.chat:
        events = engine.chat(messages, cfg, stream=True)
    else:
        events = engine.stream(prompt, cfg)
    out = common.Console(sys.stdout)
    texts, ids, finish = [], [], "length"
    for ev in events:
        if not args.json:
            out.write(ev.text)
        texts.append(ev.text)
        ids.extend(ev.token_ids)
        finish = ev.finish_reason or finish
    if args.json:
        from edge_spec.runtime.memory import peak_rss

        plan = engine.plan
        out.line(json.dumps({
            "text": "".join(texts), "finish_reason": finish, "token_ids": ids,
            "stats": engine.last_stats.as_dict(),
            "plan": {"mode": plan.mode, "max_context": plan.max_context, "draft_length": plan.draft_length,
                     "budget_bytes": plan.budget_bytes, "planned_bytes": plan.total_bytes},
            "devices": engine.devices, "peak_rss_bytes": peak_rss()}, ensure_ascii=False))
    elif texts and not "".join(texts).endswith("\n"):
        out.line()
    return 0


def _prompt(value: str | None) -> str:
    if value is not None and value != "-":
        text = value
    else:
        if sys.stdin is not None and sys.stdin.isatty():
            print("edge-spec: reading the prompt from stdin (end it with Ctrl-D).", file=sys.stderr)
        # bytes, decoded here: the locale's decoder may raise mid-read or (C locale) smuggle surrogates to
        # the tokenizer, which fails with a TypeError; a stream without .buffer is text already
        buffer = getattr(sys.stdin, "buffer", None)
        data = buffer.read() if buffer is not None else (sys.stdin.read() if sys.stdin else "").encode("utf-8")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EdgeSpecError(f"The prompt on stdin is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                                f"{exc.start}); convert it first, e.g. iconv -f latin1 -t utf-8.") from None
        if text.endswith("\n"):  # the newline `echo` adds is not part of the prompt
            text = text[:-1]
    if not text.strip():
        raise EdgeSpecError("The prompt is empty; pass --prompt TEXT or pipe text to stdin.")
    return text
