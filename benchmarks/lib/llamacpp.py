"""llama.cpp as a peer: its server on loopback, fed token ids, greedy or sampled.

The binaries come from benchmarks/build_llamacpp.sh (or ``$LLAMA_CPP_BIN``). Prompts go in as
token ids, so llama.cpp sees exactly the tokens the other systems see; the server's
``/completion`` returns the generated ids (``return_tokens``) and its own timings.

:func:`run` measures one configuration: plain decoding, draft-model speculative decoding
(``--spec-type draft-simple``: a llama-architecture draft GGUF is *not* used unless the type is
named; without it the server decodes plainly and reports no drafts), or its n-gram mode
(``--spec-type ngram-simple``: the latest earlier match of the last n tokens, like edge-spec's
prompt-lookup rung).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any


def bin_dir() -> Path | None:
    """Directory of the llama.cpp binaries, or None when they are not built."""
    candidates = [os.environ.get("LLAMA_CPP_BIN"),
                  str(Path(os.environ.get("LLAMA_CPP_HOME", Path.home() / ".cache/edge-spec/llama.cpp")) / "build/bin")]
    for c in candidates:
        if c and (Path(c) / "llama-server").is_file():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``llama-server`` on 127.0.0.1 for one GGUF; use as a context manager."""

    def __init__(self, gguf: Path, *, threads: int = 2, context: int = 4096, extra: list[str] | None = None) -> None:
        root = bin_dir()
        if root is None:
            raise RuntimeError("llama.cpp is not built; run benchmarks/build_llamacpp.sh or set LLAMA_CPP_BIN.")
        self.port = _free_port()
        self.cmd = [str(root / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                    "-t", str(threads), "-tb", str(threads), "-c", str(context), "-np", "1", "--no-webui",
                    *(extra or [])]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaServer:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {' '.join(self.cmd)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("llama-server did not become healthy within 120 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def complete(self, ids: list[int], n_predict: int, *, temperature: float | None = 0.0, seed: int = 0,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Generate after ``ids``; returns the server's JSON (``tokens``, ``timings``, ...). ``temperature`` 0:
        greedy; > 0: plain sampling from p/T, as the other systems do; None: the server's default sampling."""
        body = {"prompt": ids, "n_predict": n_predict, "seed": seed,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        if temperature == 0:
            body.update({"temperature": 0.0, "top_k": 1, "samplers": ["top_k"]})
        elif temperature is not None:
            body.update({"temperature": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                         "samplers": ["temperature"]})
        body.update(extra or {})
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())


def proc_memory(pid: int) -> dict[str, int]:
    """Bytes from /proc/PID/status: peak (VmHWM), resident now, and its anonymous / file-backed parts.

    llama.cpp maps the GGUF (weights are file-backed pages) and allocates KV cache and compute
    buffers anonymously, so ``RssAnon`` is its generation memory plus a small heap."""
    keys = {"VmHWM": "peak_rss", "VmRSS": "rss", "RssAnon": "rss_anon", "RssFile": "rss_file"}
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name = line.split(":", 1)[0]
            if name in keys:
                out[keys[name]] = int(line.split()[1]) * 1024
    return out


def server_args(mode: str, *, threads: int, draft: Path | None = None, draft_max: int = 8,
                ngram_n: int = 3) -> list[str]:
    """Extra llama-server arguments for ``mode``: "ar", "draft" (draft-model SD) or "ngram" (n-gram lookup)."""
    if mode == "ar":
        return []
    if mode == "draft":
        if draft is None:
            raise ValueError("draft-model speculative decoding needs a draft GGUF")
        return ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max),
                "--spec-draft-n-min", "0", "-td", str(threads), "-tbd", str(threads)]
    if mode == "ngram":  # n-gram of 3 (edge-spec's lookup uses 3..1), drafts up to draft_max tokens
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(ngram_n),
                "--spec-ngram-simple-size-m", str(draft_max), "--spec-draft-n-max", str(draft_max)]
    raise ValueError(f"unknown llama.cpp mode {mode!r}")


def run(gguf: Path, ids: list[list[int]], *, tokens: int, temperature: float, repeats: int, threads: int,
        context: int, mode: str = "ar", draft: Path | None = None, draft_max: int = 8,
        poll: int | None = None, spec_args: list[str] | None = None) -> dict[str, Any]:
    """One llama.cpp configuration over all prompts: median tokens/s over repeats, TTFT, memory, acceptance.

    tokens/s counts every generated token over prompt + generation time (the server's own timings,
    so HTTP overhead is excluded); ``token_ids`` are the first repeat's outputs. ``poll`` is llama.cpp's
    ``--poll`` (0: worker threads sleep instead of busy-waiting; None: its default, 50)."""
    extra = server_args(mode, threads=threads, draft=draft, draft_max=draft_max) + list(spec_args or [])
    if poll is not None:
        extra += ["--poll", str(poll)]
    with LlamaServer(gguf, threads=threads, context=context, extra=extra) as srv:
        srv.complete(ids[0], 8, temperature=temperature)  # warm-up
        per_repeat, ttft, drafted, accepted, outs = [], [], 0, 0, []
        for rep in range(repeats):
            n_tok, secs = 0, 0.0
            for i, p in enumerate(ids):
                r = srv.complete(p, tokens, temperature=temperature, seed=i, extra={"ignore_eos": True})
                t = r["timings"]
                n_tok += int(t["predicted_n"])
                secs += (t["prompt_ms"] + t["predicted_ms"]) / 1e3
                ttft.append(t["prompt_ms"] + t["predicted_per_token_ms"])
                drafted += int(t.get("draft_n", 0) or 0)  # absent when nothing was drafted
                accepted += int(t.get("draft_n_accepted", 0) or 0)
                if rep == 0:
                    outs.append([int(x) for x in r.get("tokens", [])])
            per_repeat.append(n_tok / secs)
        mem = proc_memory(srv.pid)
    speculative = mode != "ar"
    return {"tokens_per_s": statistics.median(per_repeat), "tokens_per_s_repeats": per_repeat,
            "ttft_ms": statistics.median(ttft), **mem, "token_ids": outs, "command": " ".join(srv.cmd),
            "drafted": drafted if speculative else None,
            "acceptance": (accepted / drafted if drafted else 0.0) if speculative else None}
