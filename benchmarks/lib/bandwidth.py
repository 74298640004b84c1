"""Memory bandwidth, the autoregressive ceiling it implies, and the speculative-decoding theory.

* :func:`copy_bandwidth` — bytes moved per second by a large numpy copy (read + write
  counted), on 1 thread and on ``threads`` threads (numpy releases the GIL in ``copyto``).
* :func:`bytes_per_token` — what one decode step must read: every weight byte plus the
  K/V of the context so far (from the bundle manifest, or from graph files + config).
* :func:`ar_ceiling` — tokens/s if a decode step were pure weight streaming.
* :func:`expected_tokens`, :func:`theoretical_speedup`, :func:`alpha_from_tokens_per_pass`
  — E = (1 − α^(γ+1)) / (1 − α) and speedup = E / (γ·c + 1) (GUIDE §4).

``python benchmarks/lib/bandwidth.py [--bundle B | --model-dir D]`` prints the numbers.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def copy_bandwidth(megabytes: int = 256, repeats: int = 5, threads: int = 1) -> float:
    """Best-of-``repeats`` copy bandwidth in bytes/s (2 x array bytes per copy: read + write)."""
    n = megabytes * (1 << 20) // 8
    src = np.arange(n, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    chunks = np.array_split(np.arange(n), threads)
    bounds = [(int(c[0]), int(c[-1]) + 1) for c in chunks if len(c)]
    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=np.copyto, args=(dst[a:b], src[a:b])) for a, b in bounds]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def measure_bandwidth(megabytes: int = 256, threads: int = 2) -> dict[str, float]:
    one = copy_bandwidth(megabytes, threads=1)
    many = copy_bandwidth(megabytes, threads=threads) if threads > 1 else one
    return {"copy_bytes_per_s_1thread": one, f"copy_bytes_per_s_{threads}threads": many,
            "bytes_per_s": max(one, many), "array_megabytes": megabytes}


def bytes_per_token(weight_bytes: int, kv_bytes_per_token: int, context: int) -> int:
    """Bytes one decode step reads: all weights + the K/V cache of ``context`` tokens."""
    return int(weight_bytes + kv_bytes_per_token * context)


def model_bytes_from_manifest(bundle: Path, which: str = "target") -> dict[str, int]:
    data = json.loads((bundle / "edge_spec.json").read_text())
    spec = data[which]
    return {"weight_bytes": int(spec["weight_bytes"]), "kv_bytes_per_token": int(spec["kv_bytes_per_token"])}


def model_bytes_from_dir(model_dir: Path, kv_dtype_bytes: int = 4) -> dict[str, int]:
    """For a builder-style dir (genai_config.json + graph + external data): file bytes and KV bytes/token."""
    cfg = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    graph = model_dir / cfg["filename"]
    weight = sum(f.stat().st_size for f in graph.parent.iterdir() if f.name.startswith(graph.name))
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_size"] * kv_dtype_bytes
    return {"weight_bytes": weight, "kv_bytes_per_token": kv}


def ar_ceiling(bandwidth: float, weight_bytes: int, kv_bytes_per_token: int, context: int) -> float:
    """Upper bound on autoregressive tokens/s when each step streams every byte once."""
    return bandwidth / bytes_per_token(weight_bytes, kv_bytes_per_token, context)


def expected_tokens(alpha: float, gamma: int) -> float:
    """E = (1 − α^(γ+1)) / (1 − α): tokens per target pass with i.i.d. acceptance α."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def theoretical_speedup(alpha: float, gamma: int, c: float) -> float:
    """E / (γ·c + 1), c = drafter step time / target step time."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def alpha_from_tokens_per_pass(tokens_per_pass: float, gamma: int) -> float:
    """The i.i.d. α whose E(α, γ) equals the measured tokens per target pass (bisection)."""
    lo, hi = 0.0, 1.0
    target = min(max(tokens_per_pass, 1.0), gamma + 1.0)
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, gamma) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--model-dir", type=Path, help="builder-style dir with genai_config.json")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--megabytes", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    out: dict[str, Any] = measure_bandwidth(args.megabytes, args.threads)
    sizes = None
    if args.bundle:
        sizes = model_bytes_from_manifest(args.bundle)
    elif args.model_dir:
        sizes = model_bytes_from_dir(args.model_dir)
    if sizes:
        out.update(sizes, context=args.context,
                   ar_ceiling_tokens_per_s=ar_ceiling(out["bytes_per_s"], sizes["weight_bytes"],
                                                      sizes["kv_bytes_per_token"], args.context))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
