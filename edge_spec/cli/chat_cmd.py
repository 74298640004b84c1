"""``edge-spec chat``: a local, streaming, multi-turn chat with a bundle (default: the demo pair)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edge_spec.cli import common
from edge_spec.errors import EdgeSpecError

HELP = """commands:
  /stats   totals for this session: tokens/s, acceptance, draft lengths, memory
  /reset   forget the conversation (the KV caches are rewound, nothing is reloaded)
  /help    this list
  /quit    leave (Ctrl-D too; Ctrl-C stops a reply, or leaves at the prompt)"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = common.command_parser(
        subparsers, "chat", help="chat with a bundle in the terminal (default: the demo pair)",
        description="Chat with a bundle: streamed replies, KV reused across turns, one line of speed and memory "
                    "after each reply.\n\n" + HELP,
        examples="""
  edge-spec chat                                   # the demo pair, exported on first run
  edge-spec chat coder                             # Qwen2.5-Coder-1.5B + its EAGLE-3 head (1.04 GiB fetched once)
  edge-spec chat --temperature 0                   # greedy (default: sampling, like llama.cpp)
  edge-spec chat bundles/qwen --memory-budget 600MB --temperature 0.7 --seed 1
  printf 'hello\\n/stats\\n' | edge-spec chat bundles/qwen > transcript.txt
  edge-spec chat bundles/qwen --max-context 1024 --system "Answer briefly."   # long chats drop old turns""")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help=common.BUNDLE_HELP + " (default: demo)")
    p.add_argument("--system", metavar="PROMPT", help="system message that starts every conversation")
    p.add_argument("--max-context", type=common.positive_int, metavar="N",
                   help="most tokens the conversation may hold (default: the bundle's, or what the memory budget "
                        "allows); when it is full the oldest turns are dropped, the system prompt kept")
    common.add_sampling_options(p, chat=True)
    common.add_load_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import secrets

    from edge_spec import demo

    common.generation_config(args)  # bad flags fail before anything is loaded
    err = common.Console(sys.stderr)
    bundle = demo.resolve_bundle(args.bundle or demo.DEMO_NAME,
                                 progress=lambda msg: err.line(err.dim(f"edge-spec: {msg}")))
    engine = common.load_engine(args, bundle)
    if engine.manifest.tokenizer.chat is None:
        raise EdgeSpecError(f"The bundle '{bundle}' has no chat format; use 'edge-spec generate' for plain prompts.")
    cfg = common.generation_config(args, engine.manifest.sampling)  # the model's own settings, else llama.cpp's
    if not cfg.sampling.greedy and cfg.seed is None:  # a seed the user can replay: /stats shows it
        cfg = dataclasses.replace(cfg, seed=secrets.randbelow(2**31))
    return Chat(engine, cfg, args.system, common.Console(sys.stdout)).loop(bundle)


class Chat:
    def __init__(self, engine, cfg, system: str | None, out: common.Console) -> None:
        self.engine, self.cfg, self.out = engine, cfg, out
        self.start = [{"role": "system", "content": system}] if system else []
        self.messages = list(self.start)
        self.stdin = sys.stdin  # None when the shell closed it (`<&-`): then there is nothing to read
        # piped input is not echoed by a terminal; echo it for the transcript
        self.echo = self.stdin is None or not self.stdin.isatty()
        self.dropped = 0  # messages dropped so far to keep the conversation inside the context

    def loop(self, bundle) -> int:
        plan = self.engine.plan
        where = str(bundle).replace(str(Path.home()), "~", 1) if str(bundle).startswith(str(Path.home())) else bundle
        # A chat's length is unknown up front, so it keeps a default context (unlike generate); say which and why
        how = "--max-context" if self.engine.config.max_context else "the default; --max-context N sets it"
        self.out.line(self.out.dim(f"edge-spec chat: {where} ({plan.mode}, context {plan.max_context} tokens, "
                                   f"{how}; {common.mib(plan.total_bytes)} planned). /help lists commands."))
        while True:
            try:
                line = self.read("you> ")
            except (EOFError, KeyboardInterrupt):
                self.out.line()
                return 0
            command = line.strip()
            if not command:
                continue
            if command.startswith("/"):
                if self.command(command.split()[0].lower()):
                    return 0
                continue
            try:
                self.reply(line.rstrip("\n"))
            except KeyboardInterrupt:  # Ctrl-C after the stream ended (printing the stats line)
                self.out.line(" (interrupted)")

    def read(self, prompt: str) -> str:
        if self.stdin is None:
            raise EOFError
        if not self.echo:
            return input(prompt)
        line = self.stdin.readline()
        if not line:
            raise EOFError
        self.out.write(prompt + line if line.endswith("\n") else prompt + line + "\n")
        return line

    def command(self, name: str) -> bool:
        """Run a slash command; True means leave."""
        if name in ("/quit", "/exit", "/q"):
            return True
        if name == "/reset":
            self.engine.reset()
            self.messages = list(self.start)
            self.out.line(self.out.dim("(conversation cleared)"))
        elif name == "/stats":
            self.out.line(self.out.dim(self.session_stats()))
        elif name in ("/help", "/?"):
            self.out.line(HELP)
        else:
            self.out.line(f"Unknown command {name}; /help lists the commands.")
        return False

    def reply(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        dropped = 0
        try:
            # room for the reply: drop the oldest turns first (the system prompt stays), like llama.cpp / ollama
            self.messages, dropped = self.engine.fit_chat(self.messages, self.cfg.max_new_tokens)
            events = self.engine.chat(self.messages, self.cfg, stream=True)
        except EdgeSpecError as exc:  # e.g. the conversation outgrew the context: keep the session alive
            self.messages.pop()
            self.out.line(f"edge-spec: {exc} (/reset starts over)")
            return
        parts, finish = [], None
        try:
            for ev in events:
                self.out.write(ev.text)
                parts.append(ev.text)
                finish = ev.finish_reason or finish
        except KeyboardInterrupt:  # stop this reply, keep what was shown, back to the prompt
            finish = "interrupted"
        finally:
            events.close()  # rewinds the KV caches to what was committed
        answer = "".join(parts)
        self.messages.append({"role": "assistant", "content": answer})
        if answer and not answer.endswith("\n"):
            self.out.line()
        note = {"interrupted": " (interrupted)", "length": " (max-new-tokens reached)",
                "context_full": " (context full: the oldest turns make room next turn)"}.get(finish or "", "")
        if dropped and not self.dropped:  # said once per session; /stats counts every drop
            note += (f" (older turns dropped to fit the {self.engine.plan.max_context}-token context"
                     + ("; the system prompt is kept)" if self.start else ")"))
        self.dropped += dropped
        from edge_spec.runtime.memory import current_rss

        self.out.line(self.out.dim(common.stats_line(self.engine.last_stats, current_rss(),
                                                     self.cfg.speculative and self.engine.plan.mode != "ar") + note))

    def sampling_line(self) -> str:
        c = self.cfg
        if c.sampling.greedy:
            return "greedy (--temperature 0)"
        src = (self.engine.manifest.sampling or {}).get("source")
        origin = f"the model's recommended settings ({src}) where not given" if src else \
            "llama.cpp's defaults where not given"
        return (f"temperature {c.temperature:g}, top-k {c.top_k}, top-p {c.top_p:g}, min-p {c.min_p:g} ({origin}); "
                f"seed {c.seed}: --seed {c.seed} with the same messages replays this conversation")

    def session_stats(self) -> str:
        from edge_spec.runtime.memory import current_rss, peak_rss

        e, st, plan = self.engine, self.engine.stats, self.engine.plan
        budget = "no budget" if plan.budget_bytes is None else f"budget {common.mib(plan.budget_bytes)}"
        lines = [
            f"session: {st.tokens} tokens in {st.seconds:.2f}s ({st.tokens_per_second:.1f} tok/s), "
            f"{st.target_passes} target passes, {st.overhead_share:.0%} of time outside ONNX Runtime",
            f"drafts: {st.accepted}/{st.drafted} accepted ({st.acceptance_rate:.0%}), "
            f"{st.mean_accepted_length:.2f} tokens per target pass; draft lengths (gamma:steps) "
            f"{common.gamma_hist(st.gamma_hist)}",
            f"context: {len(e.context)}/{plan.max_context} tokens in the KV cache, "
            f"{sum(m['role'] != 'system' for m in self.messages)} messages ({self.dropped} older ones dropped to "
            f"fit); prompt tokens reused "
            f"{st.reused_tokens}/{st.prompt_tokens}",
            f"plan: {plan.mode}, draft length <= {plan.draft_length}, {common.mib(plan.total_bytes)} planned, "
            f"{budget}; devices target={e.devices['target']} drafter={e.devices['drafter']}",
            f"memory: RSS {common.mib(current_rss())} now, peak {common.mib(max(peak_rss(), current_rss()))}",
            f"sampling: {self.sampling_line()}",
        ]
        return "\n".join(lines)
