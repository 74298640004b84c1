"""Loopback load test of ``edge-spec serve`` (issue 16): correctness, latency and memory under a bounded load.

    python benchmarks/serve_load.py [--bundle demo] [--sequential 200] [--clients 8] [--per-client 10]
                                    [--max-tokens 32] [--max-context 1024] [--json out.json]

One server process (``python -m edge_spec serve BUNDLE --port 0 --quiet``), the official ``openai``
client, greedy requests on a pool of conversations (one-turn chat prompts, and two-turn ones that
re-send the first answer, so KV reuse across turns is exercised):

1. reference: ``Engine.chat`` greedy on every conversation of the pool, in this process, before the
   server starts (same bundle, same context);
2. warm-up (not counted): every conversation of the pool once, and one streaming request per client at
   once; then the server's RSS and peak RSS (VmHWM) are read;
3. ``--sequential`` chat requests one after another (non-streaming);
4. ``--clients`` threads at once, each ``--per-client`` streaming requests (they queue: one engine);
5. SIGINT: the server must exit 0.

Reported: errors (any exception or non-200), responses that differ from the reference, p50/p95
latency (and time to first token when streaming), completion tokens/s end to end, the server's RSS
sampled every 50 ms and its peak RSS after warm-up vs at the end. Exit status 1 when an error, a
mismatch or peak-RSS growth over ``--rss-limit-mib`` (5) happened. A benchmark, not a test: run it
on the real demo (first use exports it, ~1.5 min).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from benchmarks.lib.prompts import CHAT_PROMPTS, chat_messages  # noqa: E402

FOLLOW_UP = "Now say that again in one short sentence."
MiB = 1 << 20


def conversations(engine: Any, n_single: int, n_double: int, max_tokens: int) -> list[dict[str, Any]]:
    """The pool, each with its reference reply (greedy ``Engine.chat``); two-turn ones re-send the first answer."""
    pool = []
    for prompt in CHAT_PROMPTS[:n_single]:
        msgs = chat_messages(prompt)
        pool.append({"messages": msgs, "want": engine.chat(msgs, max_new_tokens=max_tokens, temperature=0).text})
    for first in pool[:n_double]:
        msgs = first["messages"] + [{"role": "assistant", "content": first["want"]},
                                    {"role": "user", "content": FOLLOW_UP}]
        pool.append({"messages": msgs, "want": engine.chat(msgs, max_new_tokens=max_tokens, temperature=0).text})
    return pool


class Server:
    """The server subprocess and a thread sampling its RSS."""

    def __init__(self, bundle: str, max_context: int, threads: int) -> None:
        cmd = [sys.executable, "-m", "edge_spec", "serve", bundle, "--port", "0", "--quiet",
               "--max-context", str(max_context), "--threads", str(threads)]
        self.command = " ".join(cmd[1:])
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()
        deadline = time.monotonic() + 600
        while not (m := re.search(r"(http://\S+/v1) serves", "".join(self.lines))):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start:\n" + "".join(self.lines))
            time.sleep(0.1)
        self.url = m.group(1)
        self.samples: list[tuple[float, int]] = []  # (time, RSS bytes)
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        import psutil

        p = psutil.Process(self.proc.pid)
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), p.memory_info().rss))
            except psutil.Error:
                return
            time.sleep(0.05)

    def peak_rss(self) -> int:
        """VmHWM: the most the process has held so far."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024

    def stop(self) -> int:
        self._stop.set()
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs[0] if xs else 0.0)


def sequential(client: Any, model: str, pool: list[dict[str, Any]], n: int, max_tokens: int) -> dict[str, Any]:
    lat, tokens, errors, mismatches, engine_tps = [], 0, [], [], []
    t0 = time.perf_counter()
    for i in range(n):
        conv = pool[i % len(pool)]
        t = time.perf_counter()
        try:
            r = client.chat.completions.create(model=model, messages=conv["messages"], max_tokens=max_tokens,
                                               temperature=0)
        except Exception as exc:  # every failure is counted and shown, the run goes on
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        lat.append(time.perf_counter() - t)
        tokens += r.usage.completion_tokens
        engine_tps.append(r.model_extra["edge_spec"]["tokens_per_second"])
        if r.choices[0].message.content != conv["want"]:
            mismatches.append({"i": i, "got": r.choices[0].message.content, "want": conv["want"]})
    wall = time.perf_counter() - t0
    return {"requests": n, "errors": errors, "mismatches": mismatches, "wall_s": wall, "completion_tokens": tokens,
            "tokens_per_s": tokens / wall, "latency_p50_s": pct(lat, 50), "latency_p95_s": pct(lat, 95),
            "engine_tokens_per_s_mean": statistics.fmean(engine_tps) if engine_tps else 0.0}


def concurrent(make_client: Any, model: str, pool: list[dict[str, Any]], clients: int, per_client: int,
               max_tokens: int) -> dict[str, Any]:
    lat, ttft, errors, mismatches = [], [], [], []
    tokens = [0]
    lock = threading.Lock()

    def run(c: int) -> None:
        client = make_client()
        for j in range(per_client):
            conv = pool[(c * per_client + j) % len(pool)]
            t = time.perf_counter()
            first = None
            parts, used = [], 0
            try:
                for chunk in client.chat.completions.create(model=model, messages=conv["messages"],
                                                            max_tokens=max_tokens, temperature=0, stream=True,
                                                            stream_options={"include_usage": True}):
                    if chunk.choices and chunk.choices[0].delta.content:
                        first = first or time.perf_counter()
                        parts.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        used = chunk.usage.completion_tokens
            except Exception as exc:  # counted and shown
                with lock:
                    errors.append(f"client {c}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            with lock:
                lat.append(time.perf_counter() - t)
                if first is not None:
                    ttft.append(first - t)
                tokens[0] += used
                if "".join(parts) != conv["want"]:
                    mismatches.append({"client": c, "j": j, "got": "".join(parts), "want": conv["want"]})

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"requests": clients * per_client, "errors": errors, "mismatches": mismatches, "wall_s": wall,
            "completion_tokens": tokens[0], "tokens_per_s": tokens[0] / wall, "latency_p50_s": pct(lat, 50),
            "latency_p95_s": pct(lat, 95), "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default="demo")
    ap.add_argument("--sequential", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--single", type=int, default=20, help="one-turn conversations in the pool")
    ap.add_argument("--double", type=int, default=10, help="two-turn conversations in the pool")
    ap.add_argument("--rss-limit-mib", type=float, default=5.0)
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()

    import openai

    from edge_spec import Engine

    t = time.perf_counter()
    engine = Engine.load(args.bundle, max_context=args.max_context, threads=args.threads)
    pool = conversations(engine, args.single, args.double, args.max_tokens)
    ref_s = time.perf_counter() - t
    del engine
    print(f"reference: {len(pool)} conversations by Engine.chat in {ref_s:.1f}s", flush=True)

    server = Server(args.bundle, args.max_context, args.threads)
    served = "demo" if args.bundle == "demo" else Path(args.bundle).resolve().name

    def make_client() -> Any:
        return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=300)

    try:
        # warm-up: every conversation once (every prompt length: ONNX Runtime's arena grows to the largest pass)
        # and one round of concurrent streams (the streaming path), none of it counted
        warm = sequential(make_client(), served, pool, len(pool), args.max_tokens)
        warm_streams = concurrent(make_client, served, pool, args.clients, 1, args.max_tokens)
        warm["errors"] += warm_streams["errors"]
        time.sleep(0.5)
        rss_warm, peak_warm = server.samples[-1][1], server.peak_rss()
        t_warm = time.monotonic()
        print(f"warm-up: {len(pool) + args.clients} requests, {len(warm['errors'])} errors; "
              f"RSS {rss_warm / MiB:.1f} MiB, peak {peak_warm / MiB:.1f} MiB", flush=True)
        seq = sequential(make_client(), served, pool, args.sequential, args.max_tokens)
        print(f"sequential: {json.dumps({k: v for k, v in seq.items() if k not in ('mismatches', 'errors')})}",
              flush=True)
        conc = concurrent(make_client, served, pool, args.clients, args.per_client, args.max_tokens)
        print(f"concurrent: {json.dumps({k: v for k, v in conc.items() if k not in ('mismatches', 'errors')})}",
              flush=True)
        time.sleep(0.5)
        peak_end = server.peak_rss()
        after = [rss for ts, rss in server.samples if ts >= t_warm]
        health = json.loads(urllib.request.urlopen(server.url.removesuffix("/v1") + "/health").read())
    finally:
        rc = server.stop()
    memory = {"rss_after_warmup_mib": rss_warm / MiB, "rss_max_after_warmup_mib": max(after) / MiB,
              "rss_end_mib": after[-1] / MiB, "peak_after_warmup_mib": peak_warm / MiB, "peak_end_mib": peak_end / MiB,
              "peak_growth_mib": (peak_end - peak_warm) / MiB, "rss_growth_mib": (max(after) - rss_warm) / MiB,
              "samples": len(after)}
    report = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": " ".join(sys.argv),
        "server_command": server.command, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load "
                                                     f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end",
        "versions": {p: version(p) for p in ("edge-spec", "onnxruntime", "starlette", "uvicorn", "openai", "httpx")}
        | {"python": platform.python_version()},
        "pool": len(pool), "reference_s": ref_s, "sequential": seq, "concurrent": conc, "memory": memory,
        "server_health": health, "server_exit_code": rc}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("sequential", "concurrent")}, indent=1))
    for name, part in (("sequential", seq), ("concurrent", conc)):
        for e in part["errors"][:5]:
            print(f"{name} error: {e}")
        for m in part["mismatches"][:5]:
            print(f"{name} mismatch: {json.dumps(m)[:400]}")
    failed = seq["errors"] or conc["errors"] or seq["mismatches"] or conc["mismatches"] or rc != 0 or \
        memory["peak_growth_mib"] > args.rss_limit_mib or memory["rss_growth_mib"] > args.rss_limit_mib
    print("FAILED" if failed else "OK: 0 errors, every response equal to Engine.chat, RSS flat")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
