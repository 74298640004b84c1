"""The fixed benchmark prompts: code completion and chat-shaped (rendered like the demo chat template).

Written for the benchmark, not taken from the training corpus, so no system is helped by a
memorised continuation; the code prompts still look like the standard library the demo pair
was trained on.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models.corpus import render_chat  # noqa: E402  (stdlib-only module)

CODE = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\nimport sys\n\n\ndef walk_files(root, suffix):\n",
    "class LRUCache:\n    \"\"\"A least-recently-used cache of fixed capacity.\"\"\"\n\n"
    "    def __init__(self, capacity):\n",
    "def parse_header(line):\n    \"\"\"Split a 'Key: value' header line.\"\"\"\n    key, sep, value = line.partition(",
)
CHAT = (
    "Return the number of items waiting in the queue.",
    "Read a configuration file and return its sections as a dictionary.",
    "Convert a string of hexadecimal digits to bytes.",
    "Remove duplicate entries from a list while keeping their order.",
)


def prompts(quick: bool = False) -> list[tuple[str, str]]:
    """(kind, text) pairs; ``quick`` keeps one of each kind."""
    code = [("code", p) for p in CODE]
    chat = [("chat", render_chat(p, None)) for p in CHAT]
    return [code[0], chat[0]] if quick else code + chat
