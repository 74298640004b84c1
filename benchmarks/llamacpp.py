"""llama.cpp as a peer: its server on loopback, fed token ids, greedy or sampled.

The binaries come from benchmarks/build_llamacpp.sh (or ``$LLAMA_CPP_BIN``). Prompts go in as
token ids, so llama.cpp sees exactly the tokens the other systems see; the server's
``/completion`` returns the generated ids (``return_tokens``) and its own timings.
"""

from __future__ import annotations

import json
import os
import socket
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

    def complete(self, ids: list[int], n_predict: int, *, temperature: float = 0.0, seed: int = 0,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Generate after ``ids``; returns the server's JSON (``tokens``, ``timings``, ...)."""
        body = {"prompt": ids, "n_predict": n_predict, "temperature": temperature, "seed": seed,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        if temperature == 0:
            body.update({"top_k": 1, "samplers": ["top_k"]})
        else:  # plain sampling from p/T, as the other systems do
            body.update({"top_k": 0, "top_p": 1.0, "min_p": 0.0, "samplers": ["temperature"]})
        body.update(extra or {})
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())
