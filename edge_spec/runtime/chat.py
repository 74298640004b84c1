"""Rendering a conversation with a bundle's flattened chat format, and keeping it inside the context.

The format (``edge_spec.bundle.ChatFormat``) was derived from the model's Jinja template at
export and verified there token for token against ``tokenizer.apply_chat_template``; rendering
here is string concatenation, and encoding is what transformers does with the rendered text:
``add_special_tokens=False``, so a BOS the template writes appears exactly once and a tokenizer
post-processor adds nothing. Only the standard library and ``tokenizers`` are used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from edge_spec.bundle import ChatFormat, Manifest
from edge_spec.errors import EdgeSpecError
from edge_spec.runtime import template

START = "^"  # the "previous role" of the first message


def _message(m: Any, i: int) -> tuple[str, str]:
    if not isinstance(m, dict):
        raise EdgeSpecError(f"Chat message {i} is a {type(m).__name__}; chat() takes a list of messages like "
                            "[{'role': 'user', 'content': 'Hello'}].")
    role, content = m.get("role"), m.get("content", "")
    if not isinstance(role, str):
        raise EdgeSpecError(f"Chat message {i} has no string 'role'; pass dicts like "
                            "{'role': 'user', 'content': 'Hello'}.")
    if not isinstance(content, str):
        raise EdgeSpecError(f"Chat message {i} ({role}) has {type(content).__name__} content; pass a string.")
    return role, content


def render_chat(fmt: ChatFormat, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The text ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` renders."""
    if not messages:
        raise EdgeSpecError("The conversation is empty; pass at least one message.")
    parts: list[str] = []
    prev = START
    for i, m in enumerate(messages):
        role, content = _message(m, i)
        if role not in fmt.roles:
            raise EdgeSpecError(f"Unknown chat role {role!r}; this model's chat template knows "
                                f"{', '.join(fmt.roles)}.")
        if fmt.prefixes:
            prefix = fmt.prefixes.get(f"{prev}>{role}")
            if prefix is None:  # the template raises here too (e.g. Gemma: roles must alternate)
                where = "at the start" if prev == START else f"after a {prev} message"
                raise EdgeSpecError(f"This model's chat template does not allow a {role} message {where}; "
                                    "reorder the conversation.")
        else:  # a manifest written before prefixes existed
            prefix = fmt.roles[role][0]
        if role in fmt.trimmed:
            content = content.strip()  # Jinja's "| trim" is Python's str.strip()
        parts += (prefix, content, fmt.roles[role][1])
        prev = role
    parts.append(fmt.generation_prompt if add_generation_prompt else fmt.end)
    return "".join(parts)


def encode_chat(tokenizer: Any, fmt: ChatFormat, messages: Sequence[dict[str, str]],
                add_generation_prompt: bool = True, reply_prefix: str = "") -> list[int]:
    """Token ids of the rendered conversation, as ``apply_chat_template(..., tokenize=True)`` gives them
    (``reply_prefix``: text the assistant's reply starts with, encoded with it).

    ``tokenizer`` is a ``tokenizers.Tokenizer``. Legacy formats (``verified == 0``) stripped BOS
    from the text and relied on the tokenizer's post-processor, so they keep adding special tokens."""
    text = render_chat(fmt, messages, add_generation_prompt) + reply_prefix
    return list(tokenizer.encode(text, add_special_tokens=fmt.verified == 0).ids)


def chat_format(manifest: Manifest, tools: bool = False) -> ChatFormat:
    """The bundle's chat format; with ``tools``, only if the export verified its template with tools."""
    chat = manifest.tokenizer.chat
    if chat is None:
        raise EdgeSpecError("This bundle has no chat format; use generate() with a plain prompt.")
    if tools and chat.tools_verified == 0:
        why = "was exported before edge-spec checked tool templates; re-export it to use tools" \
            if manifest.version < 10 else "does not render tools in the <tool_call> format edge-spec reads"
        raise EdgeSpecError(f"This model's chat template {why}, so tools and tool messages cannot be used.")
    return chat


def render_any(manifest: Manifest, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
               add_generation_prompt: bool = True) -> str:
    """The conversation's text: the flattened format, or the Jinja template when tools are involved
    (:func:`edge_spec.runtime.template.needs_template`)."""
    if template.needs_template(messages, tools):
        return template.render_template(chat_format(manifest, tools=True), messages, tools, add_generation_prompt)
    return render_chat(chat_format(manifest), messages, add_generation_prompt)


def encode_any(tokenizer: Any, manifest: Manifest, messages: Sequence[dict[str, Any]],
               tools: Sequence[dict[str, Any]] | None, add_generation_prompt: bool = True,
               reply_prefix: str = "") -> list[int]:
    """Token ids of :func:`render_any` (+ ``reply_prefix``), as ``apply_chat_template(..., tokenize=True)``."""
    if template.needs_template(messages, tools):
        return template.encode_template(tokenizer, chat_format(manifest, tools=True), messages, tools,
                                        add_generation_prompt, reply_prefix)
    return encode_chat(tokenizer, chat_format(manifest), messages, add_generation_prompt, reply_prefix)


def fit_chat(messages: Sequence[dict[str, str]], count: Callable[[Sequence[dict[str, str]]], int], limit: int,
             target: int | None = None) -> tuple[list[dict[str, str]], int]:
    """Drop the oldest turns until ``count(messages) <= limit``; returns (kept messages, messages dropped).

    Leading system messages are kept. A turn is a user message and the messages after it up to
    the next user message, so what stays still starts with a user turn (Gemma-style templates
    insist). Once something must go, turns are dropped down to ``target`` tokens (default
    ``limit``) so the next few turns fit without dropping again (each drop re-prefills what
    follows the system prompt). Raises :class:`EdgeSpecError` when the last turn alone is too long."""
    msgs = list(messages)
    n = count(msgs)
    if n <= limit:
        return msgs, 0
    head = 0
    while head < len(msgs) and msgs[head].get("role") == "system":
        head += 1
    starts = [i for i in range(head, len(msgs)) if msgs[i].get("role") == "user"]
    goal = min(limit, target if target is not None else limit)
    kept = msgs
    for s in starts[1:]:
        kept = msgs[:head] + msgs[s:]
        n = count(kept)
        if n <= goal:
            break
    if n > limit:
        raise EdgeSpecError(f"The last message and the system prompt need {n} tokens but at most {limit} fit in "
                            "the context; shorten the message or raise max_context / the memory budget.")
    return kept, len(msgs) - len(kept)
