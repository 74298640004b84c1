"""Fill-in-the-middle as an editor sends it (issue 46): 10 Python files cut mid-function, sent to ``/infill``.

    python benchmarks/infill.py --bundle BUNDLE [--llama-server --gguf FILE] [--threads 1]
    python benchmarks/infill.py --url http://127.0.0.1:8080 [--plain-url URL]     # servers you started yourself

Each case is one file of our own (not HumanEval/MBPP) with the cursor inside a function; a second file of the
"project", when the case has one, goes in ``input_extra``. The request is llama.vscode's at that cursor
(benchmarks/lib/editor.py: ``input_prefix`` the lines before the cursor's line, ``prompt`` that line up to the
cursor, ``input_suffix`` the rest; ``n_indent`` the cursor line's indentation, ``t_max_predict_ms`` 500,
``n_predict`` 128, its ``top_p``, ``samplers``, ``cache_prompt``, ...; not streamed), made greedy (``temperature``
0, ``top_k`` 1) so that runs repeat and plain == speculative can be checked; the same body goes to every server.
For each case and server: whether the file parses (``ast.parse``) once llama.vscode has inserted the answer as
it does (trailing blank lines dropped, repeats of the following text discarded, its leading spaces removed), the
stop type, the server's own prompt time (``timings.prompt_ms``: to the first token) and tokens/s after it, the
client's wall time, and the prompt's token count. ``--no-indent`` leaves ``n_indent`` out, ``--t-max-predict-ms 0``
turns the time limit off (it depends on the machine's speed: at a few tokens/s it ends most answers at their
first line break, and plain and speculative decoding may stop at different line breaks).

edge-spec: ``--bundle`` starts ``edge-spec serve BUNDLE`` twice in turn, speculative (``--drafting auto``) and
plain (``--drafting none``), and compares the two greedy answers (equal, or one a prefix of the other when the
time limit ended them); ``--url`` / ``--plain-url`` use running servers. ``--llama-server`` also starts
llama-server on ``--gguf`` (same threads and context) and checks its /infill prompt is ours (same prompt text and
token count). Results: ``--out`` (JSON) and a Markdown table. A benchmark, not a test: time it on an otherwise idle
machine, servers one at a time.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from benchmarks.lib import editor  # noqa: E402
from benchmarks.lib.llamacpp import LlamaServer  # noqa: E402

UTIL = '''"""Small helpers shared by the project."""


def clamp(x, lo, hi):
    return max(lo, min(x, hi))


def chunks(items, n):
    return [items[i:i + n] for i in range(0, len(items), n)]
'''
# (name, file with CURSOR, extra files): each prefix ends inside a function body
CASES: list[tuple[str, str, list[dict[str, str]]]] = [
    ("sum_even", '''def sum_even(numbers):
    """Sum of the even numbers in the list."""
    total = 0
    for n in numbers:
        <CURSOR>
    return total


if __name__ == "__main__":
    print(sum_even([1, 2, 3, 4]))
''', []),
    ("word_count", '''from collections import Counter


def word_count(text):
    """How often each lower-cased word occurs in text."""
    words = <CURSOR>
    return Counter(words)


def top_words(text, n=3):
    return word_count(text).most_common(n)
''', []),
    ("stack_pop", '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            <CURSOR>
        return self.items.pop()

    def __len__(self):
        return len(self.items)
''', []),
    ("fibonacci", '''def fibonacci(n):
    """The first n Fibonacci numbers."""
    seq = [0, 1]
    while len(seq) < n:
        <CURSOR>
    return seq[:n]


def test_fibonacci():
    assert fibonacci(5) == [0, 1, 1, 2, 3]
''', []),
    ("read_config", '''import json
from pathlib import Path


def read_config(path):
    """The JSON object in path, or {} when the file does not exist."""
    p = Path(path)
    if not p.exists():
        return {}
    with open(p, encoding="utf-8") as f:
        <CURSOR>


def write_config(path, data):
    Path(path).write_text(json.dumps(data, indent=2), encoding="utf-8")
''', []),
    ("normalise", '''from util import clamp


def normalise(values, lo=0.0, hi=1.0):
    """Scale values linearly into [lo, hi], clamped."""
    small, big = min(values), max(values)
    span = big - small or 1.0
    return [<CURSOR> for v in values]


print(normalise([3, 5, 9]))
''', [{"filename": "util.py", "text": UTIL}]),
    ("batches", '''from util import chunks


def batches(rows, size):
    """Yield the rows in lists of at most size rows, each sorted by its "id" key."""
    for part in chunks(rows, size):
        <CURSOR>


for b in batches([{"id": 3}, {"id": 1}, {"id": 2}], 2):
    print(b)
''', [{"filename": "util.py", "text": UTIL}]),
    ("is_palindrome", '''import re


def is_palindrome(text):
    """True when text reads the same backwards, ignoring case and anything but letters and digits."""
    cleaned = re.sub(r"[^a-z0-9]", "", text.lower())
    return cleaned == <CURSOR>


assert is_palindrome("A man, a plan, a canal: Panama")
''', []),
    ("matrix", '''def transpose(matrix):
    """Rows become columns."""
    return [list(row) for row in zip(*matrix)]


def matmul(a, b):
    """The product of two matrices given as lists of rows."""
    bt = transpose(b)
    result = []
    for row in a:
        <CURSOR>
    return result


print(matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]]))
''', []),
    ("retry", '''import time


def retry(func, attempts=3, delay=0.5):
    """Call func until it returns without raising, at most attempts times, sleeping delay seconds between tries."""
    last = None
    for i in range(attempts):
        try:
            return func()
        except Exception as exc:
            <CURSOR>
    raise last


print(retry(lambda: 42))
''', []),
]


def infill(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One /infill request (not streamed, as llama.vscode sends it): the answer and the timings."""
    req = urllib.request.Request(url.rstrip("/") + "/infill", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        got = json.loads(r.read())
    timings = got.get("timings") or {}
    return {"completion": got.get("content", ""), "tokens": int(got.get("tokens_predicted", 0)),
            "prompt_tokens": got.get("tokens_evaluated"), "prompt": got.get("prompt"),
            "stop_type": got.get("stop_type"),
            "prompt_ms": timings.get("prompt_ms"), "server_tokens_per_s": timings.get("predicted_per_second"),
            "client_s": round(time.perf_counter() - t0, 4), "edge_spec": got.get("edge_spec")}


def parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except SyntaxError:
        return False


def run_cases(url: str, args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    rows = []
    for name, case, extra in CASES:
        cur = editor.Cursor.parse(case)
        body = editor.request(cur, extra, n_predict=args.n_predict, indent=not args.no_indent,
                              t_max_predict_ms=args.t_max_predict_ms)
        body.update(temperature=0, top_k=1)  # greedy on both servers (module docstring)
        try:
            got = infill(url, body)
        except urllib.error.HTTPError as exc:  # e.g. 400 context_length_exceeded: a failed case, said as such
            got = {"error": f"{exc.code}: {exc.read().decode(errors='replace')[:300]}", "completion": "", "tokens": 0,
                   "prompt": None, "prompt_tokens": None, "stop_type": None, "prompt_ms": None,
                   "server_tokens_per_s": None}
        put = editor.inserted(cur, got["completion"])
        file = cur.doc[:cur.offset] + (put or "") + cur.doc[cur.offset:]
        got.update(case=name, n_indent=body.get("n_indent", 0), inserted=put, parses=parses(file))
        print(f"  {name}: parses={got['parses']} stop={got['stop_type']} tokens={got['tokens']} "
              f"{got['completion']!r} -> {put!r}", file=log, flush=True)
        rows.append(got)
    return rows


class EdgeServer:
    """``edge-spec serve BUNDLE`` on a free port, as a subprocess (the URL read from its first line)."""

    def __init__(self, bundle: str, drafting: str, threads: int, context: int) -> None:
        cmd = [sys.executable, "-m", "edge_spec", "serve", bundle, "--port", "0", "--quiet", "--drafting", drafting,
               "--threads", str(threads), "--max-context", str(context)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()
        deadline = time.monotonic() + 1200
        while not (m := re.search(r"(http://\S+)/v1 serves", "".join(self.lines))):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("edge-spec serve did not start:\n" + "".join(self.lines))
            time.sleep(0.2)
        self.url = m.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", help="start edge-spec serve on this bundle (speculative, then plain)")
    ap.add_argument("--url", help="a running edge-spec serve (instead of --bundle)")
    ap.add_argument("--plain-url", help="a running edge-spec serve with --drafting none, to compare with --url")
    ap.add_argument("--llama-server", action="store_true", help="also run llama-server on --gguf")
    ap.add_argument("--gguf", default=os.environ.get("EDGE_SPEC_CODER_GGUF"), help="the target GGUF for llama-server")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--n-predict", type=int, default=editor.N_PREDICT)
    ap.add_argument("--t-max-predict-ms", type=int, default=editor.T_MAX_PREDICT_MS,
                    help="llama.vscode's default 500; 0 = no time limit")
    ap.add_argument("--no-indent", action="store_true", help="send no n_indent (what it buys)")
    ap.add_argument("--out", default=str(HERE / "results" / "infill.json"))
    args = ap.parse_args(argv)
    if not args.bundle and not args.url:
        ap.error("pass --bundle BUNDLE (the script starts the servers) or --url URL (a running edge-spec serve)")
    if args.llama_server and not args.gguf:
        ap.error("--llama-server needs --gguf FILE (the bundle's target GGUF)")
    out: dict[str, Any] = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           "machine": platform.processor() or platform.machine(), "args": vars(args), "runs": {}}
    for label, drafting, url in (("edge-spec speculative", "auto", args.url), ("edge-spec plain", "none",
                                                                                args.plain_url)):
        if url is None and args.bundle is None:
            continue
        print(f"{label}:", flush=True)
        server = EdgeServer(args.bundle, drafting, args.threads, args.context) if url is None else None
        try:
            out["runs"][label] = run_cases(url or server.url, args, sys.stdout)
        finally:
            if server is not None:
                server.stop()
    if args.llama_server:
        print("llama-server:", flush=True)
        with LlamaServer(Path(args.gguf), threads=args.threads, context=args.context) as ls:
            out["runs"]["llama-server"] = run_cases(f"http://127.0.0.1:{ls.port}", args, sys.stdout)
    spec, plain = out["runs"].get("edge-spec speculative"), out["runs"].get("edge-spec plain")
    if spec and plain:
        out["plain_equals_speculative"] = sum(a["completion"] == b["completion"] for a, b in zip(spec, plain))
        out["plain_agrees_with_speculative"] = sum(  # a time limit may end one at an earlier line break
            a["completion"].startswith(b["completion"]) or b["completion"].startswith(a["completion"])
            for a, b in zip(spec, plain))
    if spec and "llama-server" in out["runs"]:
        out["same_prompt_as_llama_server"] = sum(a["prompt"] == b["prompt"] and a["prompt_tokens"] == b["prompt_tokens"]
                                                 for a, b in zip(spec, out["runs"]["llama-server"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print("\n| system | ast.parse ok | stop types | median prompt ms | median tok/s | tokens |\n"
          "|---|---|---|---|---|---|")
    for label, rows in out["runs"].items():
        stops = ", ".join(f"{k} {v}" for k, v in sorted(Counter(str(r["stop_type"]) for r in rows).items()))
        print(f"| {label} | {sum(r['parses'] for r in rows)}/{len(rows)} | {stops} | "
              f"{_median([r['prompt_ms'] for r in rows])} | {_median([r['server_tokens_per_s'] for r in rows])} | "
              f"{sum(r['tokens'] for r in rows)} |")
    for key in ("plain_equals_speculative", "plain_agrees_with_speculative", "same_prompt_as_llama_server"):
        if key in out:
            print(f"{key}: {out[key]}/{len(CASES)}")
    print(f"written: {args.out}")
    return 0


def _median(values: list[Any]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    return round(vals[len(vals) // 2], 1) if vals else None


if __name__ == "__main__":
    sys.exit(main())
