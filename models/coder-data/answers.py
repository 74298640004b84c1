"""The coder pair's target answers ``prompts.txt`` through edge-spec's runtime: an answers file for its n-gram table.

    python models/coder-data/answers.py --bundle coder --out models/coder-data/answers.npz --minutes 25 \
        [--shard 0/2 --threads 1] [--skip models/coder-data/answers.npz]   # two shards on a core each, then:
        --merge A.npz B.npz --out answers-2.npz   # --skip: the prompts earlier files answered

The answers are the bundle's target graph's own greedy text (``drafting="lookup"``: the same tokens as plain
decoding), so the table predicts what the runtime writes. Prompts go in a fixed shuffled order; the file is
rewritten every few answers and a rerun answers only the prompts it lacks, so a run can stop at any time (the
``--minutes`` budget) and go on later. The file is distill's answers format (token ids only, edge_spec/distill/ids.py),
which ``edge-spec export --ngrams`` reads — and ``edge-spec distill --data`` too.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MAX_NEW_TOKENS = 320


def _load_done(out: Path) -> tuple[list, dict]:
    from edge_spec.distill.ids import read

    if not out.exists():
        return [], {}
    train, _held, meta = read(out)
    return train, meta


def answer(args: argparse.Namespace) -> int:
    from edge_spec import Engine
    from edge_spec.distill.ids import pack
    from edge_spec.distill.sequence import Sequence

    prompts = [ln for ln in (HERE / "prompts.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
    order = list(range(len(prompts)))
    random.Random(0).shuffle(order)
    shard, shards = (int(x) for x in args.shard.split("/"))
    order = [i for k, i in enumerate(order) if k % shards == shard]
    seqs, meta = _load_done(args.out)
    done = set(meta.get("prompt_indices", []))
    for f in args.skip or []:  # prompts another answers file holds already (an earlier batch of this set)
        done |= set(_load_done(f)[1].get("prompt_indices", []))
    engine = Engine.load(args.bundle, threads=args.threads, drafting="lookup", max_context=1024)
    empty = np.zeros((0, 0), np.int32)
    indices = list(meta.get("prompt_indices", []))
    t0, spent = time.monotonic(), float(meta.get("generation_seconds", 0.0))
    for n, i in enumerate(x for x in order if x not in done):
        if time.monotonic() - t0 > 60 * args.minutes:
            break
        ids = engine.encode_chat([{"role": "user", "content": prompts[i]}])
        r = engine.generate(ids, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0)
        seqs.append(Sequence(np.asarray(ids + list(r.token_ids), np.int32), len(ids), 0.0, empty,
                             empty.astype(np.float16), np.zeros((0, 2), np.float32)))
        indices.append(i)
        if (n + 1) % 8 == 0:
            _write(pack, seqs, args.out, indices, spent + time.monotonic() - t0)
            print(f"{len(seqs)} answers, {sum(len(s.ids) - s.prompt_len for s in seqs):,} tokens", flush=True)
    _write(pack, seqs, args.out, indices, spent + time.monotonic() - t0)
    print(f"done: {len(seqs)} answers in {args.out}")
    return 0


def _write(pack, seqs: list, out: Path, indices: list[int], seconds: float) -> None:
    from edge_spec.pairs import PAIRS

    pack(seqs, [], out, {"target_sha256": PAIRS["coder"].target.sha256, "generation_seconds": round(seconds, 1),
                         "origin": "models/coder-data/prompts.txt answered greedily by the coder bundle's target "
                                   "(models/coder-data/answers.py)", "prompt_indices": indices})


def merge(args: argparse.Namespace) -> int:
    from edge_spec.distill.ids import pack, read

    seqs, indices, seconds = [], [], 0.0
    for f in args.merge:
        train, _held, meta = read(f)
        seqs += train
        indices += meta.get("prompt_indices", [])
        seconds += float(meta.get("generation_seconds", 0.0))
    _write(pack, seqs, args.out, indices, seconds)
    print(json.dumps({"answers": len(seqs), "tokens": sum(len(s.ids) - s.prompt_len for s in seqs)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default="coder")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shard", default="0/1", help="i/n: answer every n-th prompt of the order from the i-th")
    ap.add_argument("--skip", type=Path, nargs="+", metavar="ANSWERS_NPZ",
                    help="leave out the prompts these answers files hold (the batches answered before)")
    ap.add_argument("--merge", type=Path, nargs="+", help="merge these answers files into --out instead")
    args = ap.parse_args(argv)
    return merge(args) if args.merge else answer(args)


if __name__ == "__main__":
    sys.exit(main())
