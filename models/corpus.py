"""Build the demo corpus from the Python standard library source (PSF licence).

The corpus is reproducible: the file list is sorted, every file's bytes are hashed, and
the hash of the whole corpus is recorded in the model card. Two kinds of documents:

* raw source files (code completion), and
* chat-shaped pairs: the docstring of a function is the user turn, the function's code
  is the assistant turn, rendered with the demo chat template.

Only the standard library and ``ast`` are used here, so the corpus can be rebuilt
without torch.
"""

from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Directories of the stdlib that are tests, demos, generated data or GUI tooling.
EXCLUDED_PARTS = {
    "site-packages",
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "pydoc_data",
    "__pycache__",
    "config-3.11-x86_64-linux-gnu",
    "ensurepip",
    "encodings",
}
MAX_FILE_BYTES = 300_000

USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SYSTEM = "<|system|>"
END = "<|end|>"
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, USER, ASSISTANT, SYSTEM, END]

# Jinja chat template (Hugging Face `tokenizer_config.json` convention).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def render_chat(prompt: str, response: str | None) -> str:
    """Render one user turn (and optionally the assistant answer) like CHAT_TEMPLATE."""
    text = f"{USER}\n{prompt}{END}\n{ASSISTANT}\n"
    if response is not None:
        text += f"{response}{END}\n"
    return text


@dataclass(frozen=True)
class Corpus:
    """The demo corpus: documents in a fixed order plus provenance."""

    files: list[str]  # stdlib-relative paths, sorted
    sha256: str  # hash over (path, bytes) of every file, in order
    code_docs: list[str]  # raw source files
    chat_pairs: list[tuple[str, str]]  # (docstring prompt, code response)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_files(root: Path) -> list[Path]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_PARTS for part in rel.parts[:-1]):
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            continue
        out.append(path)
    return out


def _chat_pairs(source: str) -> list[tuple[str, str]]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    pairs = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20 or node.end_lineno is None:
            continue
        first = doc.strip().split("\n\n")[0].strip()
        code = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        # Strip the common indentation so methods read like top-level functions.
        indent = len(code) - len(code.lstrip(" "))
        code = "\n".join(line[indent:] if line[:indent].isspace() else line for line in code.splitlines())
        if len(code) > 2500:
            continue
        pairs.append((f"Write a Python function that does this: {first}", code))
    return pairs


def build_corpus(root: Path | None = None) -> Corpus:
    """Read the stdlib sources under ``root`` (default: this interpreter's) in sorted order."""
    root = root or stdlib_dir()
    digest = hashlib.sha256()
    files, code_docs, pairs = [], [], []
    for path in list_files(root):
        data = path.read_bytes()
        rel = path.relative_to(root).as_posix()
        digest.update(rel.encode() + b"\0" + data + b"\0")
        text = data.decode("utf-8", errors="replace")
        files.append(rel)
        code_docs.append(text)
        pairs.extend(_chat_pairs(text))
    return Corpus(files=files, sha256=digest.hexdigest(), code_docs=code_docs, chat_pairs=pairs)


def split_pairs(corpus: Corpus, n_heldout: int, seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split chat pairs into (training, held-out) deterministically; held-out pairs never train."""
    idx = list(range(len(corpus.chat_pairs)))
    held = set(random.Random(seed + 1).sample(idx, min(n_heldout, len(idx))))
    train = [pr for i, pr in enumerate(corpus.chat_pairs) if i not in held]
    heldout = [corpus.chat_pairs[i] for i in sorted(held)]
    return train, heldout


def training_documents(corpus: Corpus, train_pairs: list[tuple[str, str]], seed: int) -> list[str]:
    """All training documents (code files and rendered chat pairs) in a seeded order."""
    docs = list(corpus.code_docs) + [render_chat(p, r) for p, r in train_pairs]
    random.Random(seed).shuffle(docs)
    return docs
