"""Does the demo chat well at its defaults? Factual answers and loops, edge-spec vs llama.cpp on the same GGUF.

    python benchmarks/chat_quality.py --bundle demo --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        [--seeds 5] [--tokens 64] [--loop-tokens 128] [--out results.json]

Two measurements, each at the systems' *default* chat settings, over the same prompt token ids (the bundle's
chat template, the model's default system prompt):

* **Factual questions** (``FACTS``: 24 questions with a known short answer): each asked once per seed; a reply
  is correct when it contains one of the accepted answers (case-insensitive, word-bounded). edge-spec samples
  as ``edge-spec chat`` does by default (the model's recommended settings from the manifest, else llama.cpp's:
  T 0.8, top-k 40, top-p 0.95, min-p 0.05; speculative decoding on, as chat runs); llama.cpp's ``llama-server``
  gets no sampling parameter at all, so it uses its own defaults. Also both greedy, for reference.
* **Loops**: the first 6 prompts of ``lib.prompts.CHAT_PROMPTS`` (those of vs_llamacpp.py), ``--loop-tokens``
  tokens, stop tokens honoured; a reply loops when some 8-gram of its tokens occurs 3 or more times.

Seeds are 0..N-1 for both systems (the two samplers are different programs: the same seed does not mean the
same draw). A benchmark, not a test: it needs the real model and a llama.cpp build (benchmarks/build_llamacpp.sh).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.lib.prompts import CHAT_PROMPTS, chat_messages  # noqa: E402

# (question, accepted answers): short facts a 135M chat model may know; the answers are matched as whole words
FACTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", ("Paris",)),
    ("What is the capital of Japan?", ("Tokyo",)),
    ("What is the capital of Italy?", ("Rome",)),
    ("What is the capital of Germany?", ("Berlin",)),
    ("What is the capital of Spain?", ("Madrid",)),
    ("What is the largest planet in our solar system?", ("Jupiter",)),
    ("Which planet is known as the Red Planet?", ("Mars",)),
    ("What is the chemical symbol for gold?", ("Au",)),
    ("What is the chemical formula of water?", ("H2O", "H₂O")),
    ("How many days are there in a week?", ("seven", "7")),
    ("How many legs does a spider have?", ("eight", "8")),
    ("Who wrote Romeo and Juliet?", ("Shakespeare",)),
    ("What is the tallest mountain in the world?", ("Everest",)),
    ("What is the largest ocean on Earth?", ("Pacific",)),
    ("At what temperature in degrees Celsius does water boil at sea level?", ("100",)),
    ("What gas do plants absorb from the air for photosynthesis?", ("carbon dioxide", "CO2", "CO₂")),
    ("What is the closest star to Earth?", ("Sun",)),
    ("How many continents are there?", ("seven", "7")),
    ("What is the freezing point of water in degrees Celsius?", ("0", "zero")),
    ("Who painted the Mona Lisa?", ("Leonardo", "da Vinci")),
    ("What is the largest mammal?", ("blue whale",)),
    ("How many hours are there in a day?", ("24", "twenty-four", "twenty four")),
    ("What is the square root of 81?", ("9", "nine")),
    ("Which language is spoken in Brazil?", ("Portuguese",)),
)
LOOP_PROMPTS = CHAT_PROMPTS[:6]
LOOP_N, LOOP_REPEATS = 8, 3


def correct(reply: str, answers: tuple[str, ...]) -> bool:
    """A reply is correct when it contains one of ``answers`` as whole words (case-insensitive)."""
    return any(re.search(rf"(?<![\w]){re.escape(a)}(?![\w])", reply, re.IGNORECASE) for a in answers)


def loops(ids: list[int], n: int = LOOP_N, times: int = LOOP_REPEATS) -> bool:
    """True when some n-gram of ``ids`` occurs ``times`` times or more."""
    grams = Counter(tuple(ids[i:i + n]) for i in range(len(ids) - n + 1))
    return bool(grams) and max(grams.values()) >= times


def chat_settings(manifest) -> dict:
    """The sampling ``edge-spec chat`` uses by default: the model's recommended settings, else llama.cpp's."""
    from edge_spec.cli.common import _SAMPLING_KEYS, LLAMA_CPP_SAMPLING

    recommended = {k: v for k, v in (manifest.sampling or {}).items() if k in _SAMPLING_KEYS}
    return {"settings": {**LLAMA_CPP_SAMPLING, **recommended},
            "source": (manifest.sampling or {}).get("source") or "llama.cpp's"}


def edge_replies(engine, prompts: list[list[int]], seeds: list[int | None], tokens: int
                 ) -> list[list[tuple[list[int], str]]]:
    """edge-spec at ``edge-spec chat``'s defaults (``seeds`` None = greedy): per prompt, per seed (ids, text)."""
    from edge_spec.runtime.config import GenerationConfig

    settings = chat_settings(engine.manifest)["settings"]
    out = []
    for ids in prompts:
        row = []
        for seed in seeds:
            cfg = GenerationConfig(max_new_tokens=tokens, seed=seed, **settings) if seed is not None else \
                GenerationConfig(max_new_tokens=tokens, temperature=0.0)
            engine.reset()
            r = engine.generate(ids, cfg)
            row.append((list(r.token_ids), r.text))
        out.append(row)
    return out


def llamacpp_replies(gguf: Path, prompts: list[list[int]], seeds: list[int | None], tokens: int, detok
                     ) -> list[list[tuple[list[int], str]]]:
    """llama.cpp's server at its default sampling (no sampler parameter sent; ``seeds`` None = greedy)."""
    from benchmarks.lib.llamacpp import LlamaServer

    out = []
    with LlamaServer(gguf, threads=2, context=4096) as srv:
        for ids in prompts:
            row = []
            for seed in seeds:
                r = srv.complete(ids, tokens, temperature=None if seed is not None else 0.0, seed=seed or 0)
                got = [int(t) for t in r["tokens"]]
                row.append((got, detok(got)))
            out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default="demo")
    ap.add_argument("--gguf", type=Path, help="the bundle's GGUF, for llama.cpp (omit to run edge-spec alone)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64, help="reply length for the factual questions")
    ap.add_argument("--loop-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    from edge_spec.bundle import read_manifest
    from edge_spec.demo import resolve_bundle
    from edge_spec.runtime.chat import encode_chat

    root = resolve_bundle(args.bundle)
    m = read_manifest(root)
    tok = Tokenizer.from_file(str(root / m.tokenizer.files[0]))
    stops = set(m.tokenizer.stop_token_ids)

    def ids_of(q: str) -> list[int]:
        return [int(t) for t in encode_chat(tok, m.tokenizer.chat, chat_messages(q))]

    def detok(ids: list[int]) -> str:
        return tok.decode([t for t in ids if t not in stops], skip_special_tokens=True)

    seeds: list[int | None] = [None, *range(args.seeds)]  # None: greedy, for reference
    facts = [ids_of(q) for q, _ in FACTS]
    loop_ids = [ids_of(q) for q in LOOP_PROMPTS]
    from edge_spec import Engine

    engine = Engine.load(root)  # as edge-spec chat loads it: the bundle's context, speculation on
    systems = {"edge-spec": lambda p, n: edge_replies(engine, p, seeds, n)}
    if args.gguf is not None:
        systems["llama.cpp"] = lambda p, n: llamacpp_replies(args.gguf, p, seeds, n, detok)
    info = chat_settings(m)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "bundle": str(root), "seeds": args.seeds,
                     "edge_settings": info, "systems": {}}
    for name, run in systems.items():
        t0 = time.time()
        fact_rows = run(facts, args.tokens)
        loop_rows = run(loop_ids, args.loop_tokens)
        res = {"facts_correct": {}, "loops": {}, "examples": {}, "seconds": 0.0}
        for j, seed in enumerate(seeds):
            key = "greedy" if seed is None else f"seed {seed}"
            res["facts_correct"][key] = sum(correct(row[j][1], ans) for row, (_, ans) in zip(fact_rows, FACTS))
            res["loops"][key] = sum(loops(row[j][0]) for row in loop_rows)
        res["examples"] = {q: [row[j][1][:120] for j in range(len(seeds))] for (q, _), row in zip(FACTS[:3], fact_rows)}
        sampled = [res["facts_correct"][f"seed {s}"] for s in range(args.seeds)]
        res["facts_sampled_total"] = sum(sampled)
        res["loops_sampled_total"] = sum(res["loops"][f"seed {s}"] for s in range(args.seeds))
        res["seconds"] = round(time.time() - t0, 1)
        results["systems"][name] = res
    n, k = len(FACTS), args.seeds
    print(f"\n{n} factual questions x {k} seeds at default chat settings ({args.tokens} tokens); loops: "
          f"{len(LOOP_PROMPTS)} prompts x {k} seeds x {args.loop_tokens} tokens (an 8-gram {LOOP_REPEATS}+ times)")
    print(f"| system | correct, sampled (of {n * k}) | correct, greedy (of {n}) | looping replies, sampled (of "
          f"{len(LOOP_PROMPTS) * k}) | looping, greedy (of {len(LOOP_PROMPTS)}) |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results["systems"].items():
        print(f"| {name} | {r['facts_sampled_total']} | {r['facts_correct']['greedy']} | {r['loops_sampled_total']} "
              f"| {r['loops']['greedy']} |")
    print(f"edge-spec settings: {info}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
