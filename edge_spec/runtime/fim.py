"""Fill-in-the-middle: the model's FIM tokens and the prompt llama-server's ``/infill`` builds from them.

The layout is llama.cpp's ``format_prompt_infill`` (tools/server), the repo-level pattern of
Qwen2.5-Coder (arXiv 2409.12186) when the model has ``<|repo_name|>`` / ``<|file_sep|>``::

    [REPO]myproject\\n [SEP]name0\\n text0 [SEP]name1\\n text1 ... [SEP]filename\\n
    [BOS if the tokenizer adds one] [PRE]prefix prompt [SUF]suffix [MID]

without them each extra file is introduced by ``\\n\\n--- snippet ---\\n\\n`` instead. Every piece is
tokenized on its own with special-token text read as plain text (a file that contains
``<|fim_prefix|>`` cannot forge a FIM token), except ``prompt``, whose special tokens are parsed, as
llama-server does. Budgets (llama-server's, with its ``n_batch``, ``n_predict`` and ``n_ctx``): the last
3/4 of a batch of the prefix, the first (batch/4 - 2 - prompt) tokens of the suffix, and of the extra
files' tokens the last ``n_ctx - n_batch - 2 n_predict``. Generation stops on the model's stop tokens and,
as in llama.cpp, on ``pad``, ``repo_name`` and ``file_sep``. The whole prompt is the engine's context, so
prompt lookup drafts from the prefix, the suffix and the extra files alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edge_spec.bundle import FimTokens, Manifest, TokenizerSpec, find_fim
from edge_spec.errors import EdgeSpecError

REPO = "myproject\n"  # llama-server's project name line (not an input there either)
CURRENT_FILE = "filename\n"  # llama-server's name for the file being edited
SNIPPET = "\n\n--- snippet ---\n\n"  # the separator before an extra file when the model has no <|file_sep|>
BATCH = 2048  # llama-server's default n_batch


@dataclass(frozen=True)
class ExtraFile:
    """Another file of the project the model may read (``input_extra`` of llama-server's /infill)."""

    text: str
    filename: str = "tmp"  # llama-server's default name


def fim_tokens(manifest: Manifest, tokenizer: Any) -> FimTokens | None:
    """The bundle's FIM tokens: the manifest's (version 10 on; None there means the model has none), else for
    older bundles those found in the bundle's tokenizer as the export would find them now."""
    if manifest.version >= 10:
        return manifest.tokenizer.fim
    return find_fim(tokenizer.get_vocab(with_added_tokens=True))


def no_fim_message(what: str) -> str:
    """The one sentence for a model without FIM tokens (``what``: what cannot be used)."""
    return (f"This model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> or "
            f"their kin), so {what} cannot be used; serve a code model that has them, such as Qwen2.5-Coder.")


def stop_ids(fim: FimTokens, tokenizer: TokenizerSpec) -> tuple[int, ...]:
    """Where an infill ends: the bundle's stop tokens and, as in llama.cpp's end-of-generation set, the FIM pad,
    repo and file-separator tokens."""
    extra = (t for t in (fim.pad, fim.repo_name, fim.file_sep) if t is not None)
    return tuple(sorted(set(tokenizer.stop_token_ids) | set(extra)))


def extra_files(extra: Sequence[ExtraFile | dict[str, str]] | None) -> tuple[ExtraFile, ...]:
    """``extra`` as ExtraFiles: each an ExtraFile or a dict with "text" and optionally "filename"."""
    out = []
    for i, item in enumerate(extra or ()):
        if isinstance(item, ExtraFile):
            out.append(item)
            continue
        if not isinstance(item, dict) or not isinstance(item.get("text"), str) or \
                not isinstance(item.get("filename", ""), str) or set(item) - {"text", "filename"}:
            raise EdgeSpecError(f"extra[{i}] must be a dict like {{'filename': 'utils.py', 'text': '...'}} (text "
                                "required, filename optional), or an ExtraFile.")
        out.append(ExtraFile(item["text"], item.get("filename", "tmp")))
    return tuple(out)


def infill_ids(tokenizer: Any, fim: FimTokens, prefix: str, suffix: str, extra: Sequence[ExtraFile] = (),
               prompt: str = "", *, batch: int = BATCH, predict: int = -1, context: int = 4096) -> list[int]:
    """Token ids of llama-server's infill prompt (module docstring). ``tokenizer``: a ``tokenizers.Tokenizer``;
    ``batch`` / ``predict`` / ``context``: llama-server's n_batch / n_predict / n_ctx (its budgets)."""
    for name, text in (("prefix", prefix), ("suffix", suffix), ("prompt", prompt)):
        if not isinstance(text, str):
            raise EdgeSpecError(f"The infill {name} must be a string, not a {type(text).__name__}.")

    def plain(text: str) -> list[int]:
        return _encode(tokenizer, text, parse_special=False)

    extra_tok: list[int] = []
    if fim.repo_name is not None:
        extra_tok += [fim.repo_name, *plain(REPO)]
    for f in extra:
        if fim.file_sep is not None:
            extra_tok += [fim.file_sep, *plain(f.filename + "\n")]
        else:
            extra_tok += plain(SNIPPET)
        extra_tok += plain(f.text)
    if fim.file_sep is not None:
        extra_tok += [fim.file_sep, *plain(CURRENT_FILE)]

    pre, suf = plain(prefix), plain(suffix)
    prompt_tok = _encode(tokenizer, prompt, parse_special=True) if prompt else []
    n_prefix = min(len(pre), 3 * (batch // 4))
    n_suffix = min(len(suf), max(0, batch // 4 - (2 + len(prompt_tok))))
    n_extra = min(max(0, context - batch - 2 * predict), len(extra_tok))
    pre = [fim.prefix, *pre[len(pre) - n_prefix:], *prompt_tok]
    suf = [fim.suffix, *suf[:n_suffix]]
    return [*extra_tok[len(extra_tok) - n_extra:], *_bos(tokenizer), *pre, *suf, fim.middle]


def engine_ids(tokenizer: Any, fim: FimTokens | None, prefix: str, suffix: str,
               extra: Sequence[ExtraFile | dict[str, str]] | None, prompt: str, capacity: int,
               max_new_tokens: int) -> list[int]:
    """:func:`infill_ids` with an engine's budgets: n_batch min(2048, context / 2), n_predict min(max_new_tokens,
    context / 8), so that the prompt leaves the reply at least 2 n_predict - 1 positions of the context. A model
    without FIM tokens (``fim`` None) gets :func:`no_fim_message`."""
    if fim is None:
        raise EdgeSpecError(no_fim_message("infill()"))
    return infill_ids(tokenizer, fim, prefix, suffix, extra_files(extra), prompt, batch=min(BATCH, capacity // 2),
                      predict=min(max_new_tokens, capacity // 8), context=capacity)


def _encode(tokenizer: Any, text: str, parse_special: bool) -> list[int]:
    """``text``'s ids without the post-processor's BOS/EOS; special-token text parsed or read as plain text."""
    if not text:
        return []
    was = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = not parse_special
    try:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)
    finally:
        tokenizer.encode_special_tokens = was


def _bos(tokenizer: Any) -> list[int]:
    """What the tokenizer puts before a text of its own (its BOS, when it adds one: llama.cpp's add_bos)."""
    with_special = tokenizer.encode("a", add_special_tokens=True).ids
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    return list(with_special[:len(with_special) - len(bare)]) if with_special[-len(bare):] == bare else []
