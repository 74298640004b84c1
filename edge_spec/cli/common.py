"""Options and helpers shared by the run-time commands (chat, generate, bench, inspect).

Numbers are checked by argparse types so a bad value ends in one sentence naming the flag;
everything else is validated by the library's own config types (GenerationConfig, parse_budget).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from edge_spec.errors import EdgeSpecError

if TYPE_CHECKING:
    from edge_spec.runtime.config import GenerationConfig, Stats
    from edge_spec.runtime.engine import Engine

MiB = 1 << 20
DEVICES = ("cpu", "cuda", "dml", "coreml", "qnn", "nnapi", "openvino", "webgpu")


def command_parser(subparsers: argparse._SubParsersAction, name: str, help: str, description: str,
                   examples: str) -> argparse.ArgumentParser:
    return subparsers.add_parser(name, help=help, description=description,
                                 epilog="examples:\n" + examples.strip("\n"),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


# ------------------------------------------------------------------------------ argparse types
def _whole_number(text: str, lowest: int, wanted: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"must be {wanted}, not {value}")
    return value


def positive_int(text: str) -> int:
    return _whole_number(text, 1, "a positive whole number")


def nonneg_int(text: str) -> int:
    return _whole_number(text, 0, "0 (off) or a positive whole number")


def temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 (greedy) or a positive number, not {text}")
    return value


def top_p(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (1 turns it off), not {text}")
    return value


def budget(text: str) -> str:
    from edge_spec.runtime.budget import parse_budget

    try:
        parse_budget(text)
    except EdgeSpecError:
        if text.strip().replace(".", "", 1).isdigit():  # a bare number: say which unit, never guess bytes
            n = text.strip()
            raise argparse.ArgumentTypeError(f"'{text}' has no unit; write {n}MB or {n}MiB ({n}B for bytes)") \
                from None
        raise argparse.ArgumentTypeError(f"'{text}' is not a size; write it like 600MB, 600MiB or 1.5GB") from None
    return text


def device(text: str) -> str:
    """A device name, with OpenVINO's device after a colon (openvino:NPU) or a device number (cuda:1)."""
    from edge_spec.runtime.providers import parse_device

    try:
        parse_device(text)
    except EdgeSpecError as exc:
        if text.partition(":")[0].lower() not in DEVICES:
            raise argparse.ArgumentTypeError(f"invalid choice: '{text}' (choose from {', '.join(DEVICES)}; "
                                             "openvino:CPU|GPU|NPU picks OpenVINO's device)") from None
        raise argparse.ArgumentTypeError(str(exc).rstrip(".")) from None
    return text


BUNDLE_HELP = ("bundle directory, or a named pair, fetched and exported once on first use: 'demo' (SmolLM2-135M, "
               "94 MiB) or 'coder' (Qwen2.5-Coder-1.5B + its EAGLE-3 head, 1.04 GiB; docs/pairs.md)")


def bundle_path(name: str) -> Path:
    """The bundle directory for a BUNDLE argument; a pair's name ('demo', 'coder') exports it on first use, with
    progress."""
    from edge_spec.demo import resolve_bundle

    err = Console(sys.stderr)
    return resolve_bundle(name, progress=lambda msg: err.line(err.dim(f"edge-spec: {msg}")))


# ------------------------------------------------------------------------------ option groups
def add_load_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("memory and devices")
    g.add_argument("--memory-budget", type=budget, metavar="SIZE",
                   help="most bytes the process may hold, e.g. 300MB or 1.5GiB (default: no limit); the plan "
                        "shrinks context and draft length, then drops the drafter, to fit")
    g.add_argument("--device", default="cpu", type=device, metavar="DEVICE",
                   help=f"device of the target: {', '.join(DEVICES)}; openvino:CPU, openvino:GPU or openvino:NPU "
                        "picks OpenVINO's device (default cpu; an unavailable one falls back to cpu with a warning; "
                        "docs/devices.md says what to install)")
    g.add_argument("--drafter-device", type=device, metavar="DEVICE", help="device of the drafter (default: "
                   "--device)")
    g.add_argument("--threads", type=nonneg_int, default=0, metavar="N",
                   help="CPU threads of the target's ONNX Runtime session (default 0 = all physical cores)")
    g.add_argument("--drafter-threads", type=nonneg_int, metavar="N",
                   help="CPU threads of the drafter's session (default 1: its passes are too small to split)")
    g.add_argument("--spin", action=argparse.BooleanOptionalAction, default=None,
                   help="let ONNX Runtime's threads busy-wait between kernels, as llama.cpp does: faster on an idle "
                        "machine, slower when other work shares the cores (default: on when the target has more "
                        "than one thread; --no-spin turns it off)")


# llama.cpp's default sampler settings (common/common.h), which llama-cli, llama-server and ollama-style apps use
LLAMA_CPP_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")


def min_p(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (0 turns it off), not {text}")
    return value


def add_sampling_options(p: argparse.ArgumentParser, max_new_tokens: int = 256, chat: bool = False) -> None:
    """Sampling flags. ``generate`` is greedy unless told otherwise (scripts expect that); ``chat`` samples like
    llama.cpp and ollama: the model's recommended settings, else llama.cpp's defaults (``None`` here = not given)."""
    g = p.add_argument_group("sampling")
    if chat:
        d = LLAMA_CPP_SAMPLING
        g.add_argument("--temperature", type=temperature, metavar="T",
                       help=f"0 = greedy; default: the model's recommended setting, else {d['temperature']} "
                            "(llama.cpp's default); the chat samples with a fresh seed shown by /stats")
        g.add_argument("--top-p", type=top_p, metavar="P", help=f"nucleus sampling mass (default {d['top_p']})")
        g.add_argument("--top-k", type=nonneg_int, metavar="K",
                       help=f"keep the K likeliest tokens (0 = off; default {d['top_k']})")
        g.add_argument("--min-p", type=min_p, metavar="P",
                       help=f"drop tokens below P x the likeliest one's probability (0 = off; default {d['min_p']})")
    else:
        g.add_argument("--temperature", type=temperature, default=0.0, metavar="T",
                       help="0 = greedy (the default here, as scripts expect; edge-spec chat samples)")
        g.add_argument("--top-p", type=top_p, default=1.0, metavar="P",
                       help="nucleus sampling mass (default 1 = off)")
        g.add_argument("--top-k", type=nonneg_int, default=0, metavar="K",
                       help="keep the K likeliest tokens (0 = off)")
        g.add_argument("--min-p", type=min_p, default=0.0, metavar="P",
                       help="drop tokens below P x the likeliest one's probability (default 0 = off)")
    g.add_argument("--seed", type=nonneg_int, metavar="N",
                   help="random seed for sampling, >= 0: the same seed, prompt and settings give the same text "
                        "(default: fresh)")
    g.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens, metavar="N",
                   help=f"most tokens per reply (default {max_new_tokens})")
    g.add_argument("--no-speculation", action="store_true",
                   help="plain autoregressive decoding (the drafter is not loaded)")
    g.add_argument("--drafting", choices=("auto", "hybrid", "model", "lookup"), default="auto", help=DRAFTING_HELP)


DRAFTING_HELP = ("where drafts come from: auto = the bundle's default (hybrid unless its export chose another; "
                 "'edge-spec inspect' says which); hybrid = the drafter, and prompt lookup where the text repeats "
                 "itself; model = the drafter only; lookup = prompt lookup only (no drafter loaded)")


def generation_config(args: argparse.Namespace, defaults: dict[str, Any] | None = None,
                      **extra: Any) -> GenerationConfig:
    """Validate the sampling options before anything is loaded; options not given take ``defaults``' values (then
    llama.cpp's), and given ones win. With ``--temperature 0`` the other sampling settings do not matter."""
    from edge_spec.runtime.config import GenerationConfig

    base = {**LLAMA_CPP_SAMPLING, **{k: v for k, v in (defaults or {}).items() if k in _SAMPLING_KEYS}}
    sampling = {**base, **{k: getattr(args, k) for k in _SAMPLING_KEYS if getattr(args, k, None) is not None}}
    return GenerationConfig(max_new_tokens=args.max_new_tokens, seed=args.seed, speculative=not args.no_speculation,
                            **sampling, **extra)


def load_engine(args: argparse.Namespace, bundle: Any, prompt: Any = None, max_new_tokens: int | None = None) -> Engine:
    """Engine.load with the command's options; ``prompt`` + ``max_new_tokens`` size the context when
    --max-context is absent (a one-shot request), else the bundle's context is planned."""
    import warnings

    from edge_spec.runtime.engine import Engine

    with warnings.catch_warnings(record=True) as caught:  # e.g. device fallback: one line, not file:line + source
        warnings.simplefilter("always")
        engine = Engine.load(bundle, memory_budget=args.memory_budget, device=args.device,
                             drafter_device=args.drafter_device, max_context=getattr(args, "max_context", None),
                             drafting="none" if getattr(args, "no_speculation", False) else
                             getattr(args, "drafting", "auto"),
                             threads=getattr(args, "threads", 0), spin=getattr(args, "spin", None),
                             drafter_threads=getattr(args, "drafter_threads", None),
                             prompt=prompt, max_new_tokens=max_new_tokens)
    for w in caught:
        print(f"edge-spec: warning: {w.message}", file=sys.stderr)
    return engine


# ------------------------------------------------------------------------------ output
class Console:
    """Writes to a stream; styling (ANSI dim) only when the stream is a terminal and NO_COLOR is unset."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.color = self.tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"

    def write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:  # `edge-spec generate ... | head`: the reader left; stop quietly
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())  # no second error at exit
            except (OSError, ValueError, AttributeError):
                pass
            raise SystemExit(1) from None

    def line(self, text: str = "") -> None:
        self.write(text + "\n")

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.color else text


def mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def stats_line(st: Stats, rss: int, speculative: bool) -> str:
    """One line after a reply: throughput, acceptance, KV reuse, memory in use."""
    parts = [f"{st.tokens} tokens", f"{st.tokens_per_second:.1f} tok/s"]
    if speculative and st.drafted:
        parts.append(f"acceptance {st.acceptance_rate:.0%} ({st.mean_accepted_length:.2f} tokens/pass)")
        if st.lookup_drafted:  # hybrid drafting (or the lookup rung): say how much came from lookup
            parts.append(f"{st.lookup_drafted / st.drafted:.0%} of drafts from lookup")
    elif speculative:
        parts.append("no drafts this reply")
    else:
        parts.append("no speculation")
    parts.append(f"KV reused {st.reused_tokens}/{st.prompt_tokens} prompt tokens")
    parts.append(f"RSS {rss / MiB:.0f} MiB")
    return "[" + ", ".join(parts) + "]"


def gamma_hist(hist: dict[int, int]) -> str:
    """'γ=0:12 1:3 4:9' (draft length -> steps)."""
    return " ".join(f"{g}:{n}" for g, n in sorted(hist.items())) or "-"


def unescape(text: str) -> str:
    r"""Turn the escapes \n, \t and \\ into newline, tab and backslash (for one-line arguments)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise EdgeSpecError(f"The {what} file '{path}' does not exist; check the path.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeSpecError(f"The {what} file '{path}' cannot be read ({exc.__class__.__name__}); "
                            "pass a UTF-8 text file.") from None
