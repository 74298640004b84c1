"""Flatten a Jinja chat template into a :class:`ChatFormat`, then verify it token for token.

The runtime has no Jinja, so at export we render the template on conversations whose contents
are unique markers and read off the text *between* consecutive messages, keyed by the pair of
roles ("user>assistant"; "^>user" for the first message). Rendering in context is what catches
a default system block emitted only when the first message is not a system message (SmolLM2,
Qwen2.5), a BOS the template writes (Llama-3, Gemma) and a system message folded into the first
user turn (Gemma-3). A text that depends on more than the two neighbouring roles (a turn number,
the system prompt moved into the last user message) gives two different values for one pair and
is refused. Whatever is derived is then checked: the runtime's ids must equal
``apply_chat_template(..., tokenize=True)`` on a fixed set of conversations.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from edge_spec.bundle import ChatFormat
from edge_spec.errors import ExportError
from edge_spec.runtime.chat import START, encode_chat

ROLES = ("system", "user", "assistant")
GEN, END = "$gen", "$"  # "next role" after the last message, with / without the generation prompt
_PAD = " \n  "  # whitespace around a marker: kept by a plain template, removed by "| trim"

Conversation = list[dict[str, str]]

_CONTENTS = ("Hello!", "What is the capital of France?", "", "   ", "line one\nline two\n\n- a list item",
             "  leading and trailing spaces  ", "Grüße, 你好, مرحبا 👋🏽", "\tcode:\n    def f(x):\n        return x\n",
             "The capital of France is Paris.", "ok", "\n", "Thanks, that helps.")


def _marker(i: int) -> str:
    return f"EDGESPECMSG{i}X"


def _render(tok: Any, conv: Conversation, gen: bool) -> str | None:
    try:
        return tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
    except Exception:  # the template refuses this conversation (raise_exception), so the runtime refuses it too
        return None


def _shapes() -> list[tuple[str, ...]]:
    """Role sequences to derive from: optional system message, then 1..4 user/assistant turns from a user.

    A system message appears only first: a mid-conversation system message is another thing in
    several templates (Gemma-3 folds only the first one into the user turn)."""
    out = []
    for n in range(1, 5):
        for rest in itertools.product(("user", "assistant"), repeat=n - 1):
            seq = ("user",) + rest
            out += [seq, ("system",) + seq]
    # a system message before an assistant one separates the system suffix from the user header
    return out + [("system", "assistant"), ("system", "assistant", "user")]


def _split(text: str, n: int) -> list[str] | None:
    """The n+1 pieces of ``text`` around markers 0..n-1, or None unless each occurs once, in order."""
    pieces, pos = [], 0
    for i in range(n):
        m = _marker(i)
        at = text.find(m, pos)
        if at < 0 or text.count(m) != 1:
            return None
        pieces.append(text[pos:at])
        pos = at + len(m)
    pieces.append(text[pos:])
    return pieces


def _lcp(values: Sequence[str], specials: Sequence[str]) -> str:
    """Longest common prefix of ``values``, cut back so that it does not end inside a special token."""
    first, last = min(values), max(values)
    n = 0
    while n < len(first) and first[n] == last[n]:
        n += 1
    cut = n
    for v in values:
        for s in specials:
            at = v.find(s)
            while 0 <= at < cut:
                if at + len(s) > cut:  # "<|end|>\n<|" would split "<|user|>" from "<|endoftext|>"
                    cut = at
                at = v.find(s, at + 1)
    return first[:cut]


def _refuse(reason: str) -> ExportError:
    return ExportError(f"edge-spec cannot express this model's chat template without Jinja: {reason}; use a "
                       "template that renders each message from its role and its neighbours' roles, or export "
                       "a model without a chat template and prompt it with 'edge-spec generate'.")


def _joins(tok: Any) -> tuple[dict[tuple[str, str], str], dict[str, tuple[Conversation, bool]]]:
    """Text between consecutive messages, keyed by (previous role, role); plus one example per role."""
    seen: dict[tuple[str, str], str] = {}
    example: dict[str, tuple[Conversation, bool]] = {}
    for shape in _shapes():
        conv = [{"role": r, "content": _marker(i)} for i, r in enumerate(shape)]
        for gen in ((True, False) if shape[-1] == "user" else (False,)):
            text = _render(tok, conv, gen)
            if text is None:
                continue
            pieces = _split(text, len(conv))
            if pieces is None:
                raise _refuse(f"rendering the roles {' > '.join(shape)} moves, repeats or drops a message")
            keys = [(START, shape[0])] + list(zip(shape, shape[1:])) + [(shape[-1], GEN if gen else END)]
            for key, piece in zip(keys, pieces):
                if seen.setdefault(key, piece) != piece:
                    after = "the start" if key[0] == START else f"a {key[0]} message"
                    nxt = "the end" if key[1] in (GEN, END) else f"a {key[1]} message"
                    raise _refuse(f"the text between {after} and {nxt} depends on more than those two roles "
                                  f"({seen[key]!r} vs {piece!r})")
            for r in shape:
                example.setdefault(r, (conv, gen))
    return seen, example


def _trimmed(tok: Any, example: dict[str, tuple[Conversation, bool]]) -> tuple[str, ...]:
    """Roles whose content the template strips of surrounding whitespace."""
    out = []
    for role, (conv, gen) in example.items():
        i = next(j for j, m in enumerate(conv) if m["role"] == role)
        base = _render(tok, conv, gen)
        padded = [dict(m, content=_PAD + m["content"] + _PAD) if j == i else m for j, m in enumerate(conv)]
        text = _render(tok, padded, gen)
        if base is not None and text == base:
            out.append(role)
        elif base is None or text != base.replace(_marker(i), _PAD + _marker(i) + _PAD):
            raise _refuse(f"it changes the whitespace around {role} messages in a way other than trimming")
    return tuple(r for r in ROLES if r in out)


def derive(tok: Any) -> ChatFormat:
    """The flattened format of ``tok.chat_template`` (not yet verified; see :func:`chat_format`)."""
    joins, example = _joins(tok)
    if (START, "user") not in joins or ("user", GEN) not in joins:
        raise _refuse("it does not render a conversation that starts with a user message")
    roles = tuple(r for r in ROLES if r in example)
    specials = [t for t in getattr(tok, "all_special_tokens", []) or [] if t] + \
        [str(t) for t in (getattr(tok, "added_tokens_decoder", None) or {}).values()]
    starts = [v for (a, _), v in joins.items() if a == START]
    suffix = {}
    for r in roles:
        common = _lcp([v for (a, _), v in joins.items() if a == r], specials)
        for s in sorted(specials, key=len, reverse=True):  # "<|im_end|>\n<|im_start|>": the opener belongs
            if common.endswith(s) and common != s and all(s in v for v in starts):  # to the next message
                common = common[:-len(s)]
                break
        suffix[r] = common
    prefixes = {f"{a}>{b}": v[len(suffix[a]):] if a != START else v
                for (a, b), v in joins.items() if b not in (GEN, END)}
    gen = joins[("user", GEN)][len(suffix["user"]):]
    ends = {v[len(suffix[a]):] for (a, b), v in joins.items() if b == END}
    if len(ends) > 1:
        raise _refuse(f"the text after the last message depends on its role ({' vs '.join(map(repr, sorted(ends)))})")
    fmt_roles = {r: (prefixes.get(f"{START}>{r}", ""), suffix[r]) for r in roles}
    return ChatFormat(roles=fmt_roles, generation_prompt=gen, template=tok.chat_template, prefixes=prefixes,
                      trimmed=_trimmed(tok, example), end=ends.pop() if ends else "")


def verification_conversations() -> list[tuple[Conversation, bool]]:
    """(conversation, add_generation_prompt): 1..6 turns, with and without a system message, contents
    empty / whitespace / multi-line / unicode; ending on the user with a generation prompt and on the
    assistant without one."""
    out = []
    k = 0
    for system in (None, "You are a helpful assistant.", "  Answer briefly.\n"):
        for turns in range(1, 7):
            conv = [{"role": "system", "content": system}] if system is not None else []
            for _ in range(turns):
                conv.append({"role": "user", "content": _CONTENTS[k % len(_CONTENTS)]})
                conv.append({"role": "assistant", "content": _CONTENTS[(k + 5) % len(_CONTENTS)]})
                k += 1
            out += [(conv[:-1], True), (conv, False)]
    return out


def chat_format(tok: Any, runtime_tokenizer: Any) -> ChatFormat | None:
    """Derive the flattened format of ``tok``'s chat template and verify it against ``apply_chat_template``.

    ``runtime_tokenizer`` is the ``tokenizers.Tokenizer`` the bundle ships, so the check covers the
    ids the runtime will produce. Returns None when there is no template; raises :class:`ExportError`
    (one sentence) when the template cannot be expressed."""
    template = getattr(tok, "chat_template", None)
    if not template or not isinstance(template, str):
        return None
    fmt = derive(tok)
    checked = 0
    for conv, gen in verification_conversations():
        try:
            want = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=gen, return_dict=False)
        except Exception:
            continue  # the template refuses it (e.g. Gemma-2 and system messages); the runtime does too
        if hasattr(want, "tolist"):
            want = want.tolist()
        try:
            got = encode_chat(runtime_tokenizer, _verified(fmt), conv, gen)
        except Exception as exc:
            raise _refuse(f"the flattened format cannot render a {len(conv)}-message conversation the template "
                          f"accepts ({exc})") from None
        if list(want) != got:
            at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            raise _refuse(f"on a {len(conv)}-message conversation its token ids differ from apply_chat_template "
                          f"at position {at}")
        checked += 1
    if checked == 0:
        raise _refuse("apply_chat_template accepts none of the verification conversations")
    return _verified(fmt, checked)


def _verified(fmt: ChatFormat, n: int = 1) -> ChatFormat:
    from dataclasses import replace

    return replace(fmt, verified=n)
