"""One model, one distribution: speculation must not change what the bundle writes.

    python benchmarks/one_distribution.py --bundle demo [--prompts 50] [--tokens 96] [--code] [--threads 2]
    python benchmarks/one_distribution.py --bundle demo --sampled 4000   # + the sampled cells (~25 min on the demo)

Greedy, per prompt (chat prompts, or ``--code`` ones, rendered with the bundle's chat template): the default engine
(speculative), the engine with no drafter loaded (``drafting="none"``, what ``--no-speculation`` runs) and plain
ONNX Runtime running the bundle's target graph by itself (:func:`plain_ort_greedy`: 1-token steps, no IO binding,
the KV it returns fed back) — all three must write the same tokens.

Speed (``--against OLD_BUNDLE``): the same prompts through this bundle and an older export of the same model
(before graphs padded themselves), speculative and with no drafter, the four engines alternating prompt by prompt
(order reversed every other prompt; thread pools do not spin, since four spinning pools in one process slow each
other down); the old bundle's drafter-less engine runs unpadded 1-token steps as edge-spec did before (its
speculative engine padded them to 2 rows). Tokens/s over whole requests, new / old.

Sampled (``--sampled N``): for each cell (context x temperature / top-p) N draws of the first two tokens from the
speculative engine and N from the drafter-less one (seeds disjoint), each against the exact joint probabilities
computed by plain ONNX Runtime (1-token passes; a chi-square with bins pooled to expected counts >= 5), and the two
samples against each other (a chi-square test of homogeneity on the same bins). Writes
``results/one_distribution_<bundle>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.lib.prompts import ALL_CHAT_PROMPTS, CODE_PROMPTS, chat_messages  # noqa: E402
from edge_spec import Engine  # noqa: E402
from edge_spec.bundle import ModelSpec  # noqa: E402
from edge_spec.demo import resolve_bundle  # noqa: E402
from edge_spec.runtime.sampling import SamplingConfig, probs  # noqa: E402

_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class PlainORT:
    """The bundle's target graph run by plain ONNX Runtime: no IO binding, no shared buffers, the present KV it
    returns fed back as the next past (cut to the valid length) — what any app running the graph alone does (with
    edge-spec's K-quant library registered when the manifest lists it in ``custom_ops``)."""

    def __init__(self, graph: Path, spec: ModelSpec, threads: int = 0) -> None:
        import onnxruntime as ort

        from edge_spec import kernels

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        kernels.register(so, spec.custom_ops)  # a kquant graph's ops: ONNX Runtime plus edge-spec's kernel library
        self.session = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
        self.spec = spec
        self.past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.names = [o.name for o in self.session.get_outputs()]

    def logits(self, prefix: list[int], steps: list[int]) -> np.ndarray:
        """Prefill ``prefix`` in one pass, then feed ``steps`` one token at a time; returns the logits
        [1 + len(steps), vocab] (float32) after the prefix and after each step."""
        s = self.spec
        past = {i.name: np.zeros((1, s.num_kv_heads, 0, s.head_size), _NP[i.type]) for i in self.past}
        out, n = [], 0
        for chunk in [prefix] + [[t] for t in steps]:
            feeds = {"input_ids": np.asarray([chunk], np.int64),
                     "attention_mask": np.ones((1, n + len(chunk)), np.int64), **past}
            res = dict(zip(self.names, self.session.run(None, feeds)))
            n += len(chunk)
            past = {k: res[k.replace("past_key_values.", "present.")][:, :, :n] for k in past}
            out.append(res["logits"][0, -1].astype(np.float32))
        return np.stack(out)

    def greedy(self, ids: list[int], new_tokens: int, stop: set[int]) -> list[int]:
        """Greedy decoding, 1-token steps: the argmax after the prompt, fed back, ``new_tokens`` times or to a stop."""
        s = self.spec
        past = {i.name: np.zeros((1, s.num_kv_heads, 0, s.head_size), _NP[i.type]) for i in self.past}
        chunk, n, got = list(ids), 0, []
        while len(got) < new_tokens:
            feeds = {"input_ids": np.asarray([chunk], np.int64),
                     "attention_mask": np.ones((1, n + len(chunk)), np.int64), **past}
            res = dict(zip(self.names, self.session.run(None, feeds)))
            n += len(chunk)
            past = {k: res[k.replace("past_key_values.", "present.")][:, :, :n] for k in past}
            tok = int(np.argmax(res["logits"][0, -1]))
            got.append(tok)
            if tok in stop:
                break
            chunk = [tok]
        return got


def greedy_agreement(bundle: str, prompts: list[str], tokens: int, threads: int, ort_every: int = 1) -> dict:
    spec_engine = Engine.load(bundle, threads=threads, max_context=1024)
    plain_engine = Engine.load(bundle, threads=threads, max_context=1024, drafting="none")
    m = spec_engine.manifest
    ort_run = PlainORT(resolve_bundle(bundle) / m.target.graph, m.target, threads)
    stop = set(m.tokenizer.stop_token_ids)
    rows, t_spec, t_plain, n_spec, n_plain = [], 0.0, 0.0, 0, 0
    for i, prompt in enumerate(prompts):
        ids = spec_engine.encode_chat(chat_messages(prompt))
        spec_engine.reset()
        plain_engine.reset()
        t0 = time.perf_counter()
        a = list(spec_engine.generate(ids, max_new_tokens=tokens, temperature=0).token_ids)
        t1 = time.perf_counter()
        b = list(plain_engine.generate(ids, max_new_tokens=tokens, temperature=0).token_ids)
        t2 = time.perf_counter()
        c = ort_run.greedy(ids, len(b), stop) if i % ort_every == 0 else None
        t_spec, t_plain, n_spec, n_plain = t_spec + t1 - t0, t_plain + t2 - t1, n_spec + len(a), n_plain + len(b)
        rows.append({"prompt": i, "tokens": len(b), "spec_eq_plain": a == b,
                     "plain_eq_ort": None if c is None else b == c})
        print(f"prompt {i}: {len(b)} tokens, speculative == no drafter: {a == b}, no drafter == plain ORT: "
              f"{'not run' if c is None else b == c}", flush=True)
    checked = [r for r in rows if r["plain_eq_ort"] is not None]
    return {"prompts": len(prompts), "tokens": tokens, "ort_checked": len(checked),
            "spec_eq_plain": sum(r["spec_eq_plain"] for r in rows),
            "plain_eq_ort": sum(r["plain_eq_ort"] for r in checked),
            "tok_s_speculative": round(n_spec / t_spec, 2), "tok_s_no_drafter": round(n_plain / t_plain, 2),
            "per_prompt": rows}


CELLS = (  # (name, raw text or chat prompt, temperature, top_p)
    ("story T=0.7", "Once upon a time there was", 0.7, 1.0),
    ("story T=1.0", "Once upon a time there was", 1.0, 1.0),
    ("chat T=0.7 top-p 0.9", "chat:Write a haiku about autumn leaves.", 0.7, 0.9),
    ("code T=1.0", "def fibonacci(n):\n", 1.0, 1.0),
)


def _bins(p: np.ndarray, n: int) -> np.ndarray:
    """Bin index per outcome: outcomes pooled, most likely first, into bins of expected count >= 5 (-1: p = 0)."""
    order = np.argsort(-p, kind="stable")
    order = order[p[order] > 0]
    e = p[order] * n
    _, first = np.unique(np.floor((np.cumsum(e) - e) / 5), return_inverse=True)  # runs of ~5 expected draws
    per = np.bincount(first, weights=e)
    label, acc, cur = np.empty(len(per), dtype=np.int64), 0.0, 0
    for j, x in enumerate(per):  # a run below 5 (after a single likely outcome) joins the next
        label[j] = cur
        acc += x
        if acc >= 5:
            cur, acc = cur + 1, 0.0
    if acc > 0 and cur > 0:
        label[label == cur] = cur - 1
    out = np.full(len(p), -1)
    out[order] = label[first]
    return out


def exact_joint(ort_run: PlainORT, ids: list[int], cfg: SamplingConfig, max_first: int = 400):
    """The exact joint p(x1, x2) of the first two tokens after ``ids``, from 1-token passes of plain ONNX Runtime:
    every x2 after each of the (at most ``max_first``) x1 with p(x1) >= 1e-5 — a set fixed before any draw — and the
    rest of the mass as one last outcome. Returns (p [n_first * vocab + 1], index(x1, x2) -> outcome, n_first)."""
    p1 = probs(ort_run.logits(ids, [])[:1].astype(np.float64), cfg)[0]
    firsts = [int(a) for a in np.argsort(-p1)[:max_first] if p1[a] >= 1e-5]
    vocab = len(p1)
    joint = np.concatenate([p1[a] * probs(ort_run.logits(ids, [a])[1:].astype(np.float64), cfg)[0] for a in firsts])
    where = {a: i * vocab for i, a in enumerate(firsts)}

    def index(a: int, b: int) -> int:
        return where[a] + b if a in where else len(joint)

    return np.append(joint, max(1.0 - joint.sum(), 0.0)), index, len(firsts)


def sampled_cell(spec_engine: Engine, plain_engine: Engine, ort_run: PlainORT, text: str, t: float, top_p: float,
                 n: int) -> dict:
    from scipy.stats import chi2_contingency, chisquare

    ids = spec_engine.encode_chat(chat_messages(text[5:])) if text.startswith("chat:") else \
        spec_engine.tokenizer.encode(text).ids
    cfg = SamplingConfig(t, top_p=top_p)
    cfg_gen = {"stop_token_ids": ()}
    draws = {}
    for name, eng, base in (("speculative", spec_engine, 0), ("no_drafter", plain_engine, 10 ** 6)):
        pairs = []
        for seed in range(base, base + n):
            r = eng.generate(ids, cfg_gen, max_new_tokens=2, temperature=t, top_p=top_p, seed=seed)
            pairs.append(tuple(r.token_ids[:2]))
        draws[name] = pairs
    p_all, index, firsts = exact_joint(ort_run, ids, cfg)
    bins = _bins(p_all, n)
    out: dict = {"draws": n, "temperature": t, "top_p": top_p, "first_tokens": firsts,
                 "distinct_outcomes": len({x for d in draws.values() for x in d})}
    counts = {}
    for name, d in draws.items():
        c = np.zeros(len(p_all))
        for a, b in d:
            c[index(a, b)] += 1
        if (c[p_all == 0] > 0).any():
            out[f"{name}_impossible_draws"] = int(c[p_all == 0].sum())
        k = bins.max() + 1
        obs = np.bincount(bins[bins >= 0], weights=c[bins >= 0], minlength=k)
        exp = np.bincount(bins[bins >= 0], weights=p_all[bins >= 0], minlength=k)
        out[f"{name}_vs_exact_p"] = float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
        counts[name] = obs
    table = np.vstack([counts["speculative"], counts["no_drafter"]])
    table = table[:, table.sum(0) > 0]
    out["speculative_vs_no_drafter_p"] = float(chi2_contingency(table)[1])
    out["total_variation"] = float(0.5 * np.abs(table[0] / n - table[1] / n).sum())
    return out


def speed_against(bundle: str, old: str, prompts: list[str], tokens: int, threads: int) -> dict:
    engines = {}
    for name, b in (("new", bundle), ("old", old)):
        engines[f"{name} speculative"] = Engine.load(b, threads=threads, spin=False, max_context=1024)
        plain = engines[f"{name} no drafter"] = Engine.load(b, threads=threads, spin=False, max_context=1024,
                                                            drafting="none")
        if name == "old":
            plain.target.min_rows = plain.target.guess_rows = 1  # as edge-spec ran it: no padding without a drafter
    tokens_made = dict.fromkeys(engines, 0)
    seconds = dict.fromkeys(engines, 0.0)
    for i, prompt in enumerate(prompts):
        order = list(engines) if i % 2 == 0 else list(engines)[::-1]
        for name in order:
            e = engines[name]
            ids = e.encode_chat(chat_messages(prompt))
            e.reset()
            t0 = time.perf_counter()
            r = e.generate(ids, max_new_tokens=tokens, temperature=0)
            seconds[name] += time.perf_counter() - t0
            tokens_made[name] += len(r.token_ids)
    tps = {k: round(tokens_made[k] / seconds[k], 2) for k in engines}
    out = {"tok_s": tps, "speculative_new_over_old": round(tps["new speculative"] / tps["old speculative"], 3),
           "no_drafter_new_over_old": round(tps["new no drafter"] / tps["old no drafter"], 3)}
    print(f"whole requests, {len(prompts)} prompts x {tokens}: {tps}; new/old speculative "
          f"{out['speculative_new_over_old']}, no drafter {out['no_drafter_new_over_old']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default="demo")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--code", action="store_true", help="code prompts (benchmarks/lib/prompts.py) instead of chat")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ort-every", type=int, default=1, help="plain ONNX Runtime on every n-th prompt (it is slow)")
    ap.add_argument("--sampled", type=int, default=0, help="draws per sampled cell (0: greedy only)")
    ap.add_argument("--skip-greedy", action="store_true")
    ap.add_argument("--against", help="an older export of the same model: whole-request speed, new / old")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    pool = CODE_PROMPTS if args.code else ALL_CHAT_PROMPTS
    report: dict = {"bundle": str(args.bundle), "date": time.strftime("%Y-%m-%d")}
    if not args.skip_greedy:
        report["greedy"] = greedy_agreement(args.bundle, list(pool[:args.prompts]), args.tokens, args.threads,
                                            args.ort_every)
        g = report["greedy"]
        print(f"greedy, {g['prompts']} prompts x {g['tokens']} tokens: speculative == no drafter on "
              f"{g['spec_eq_plain']}/{g['prompts']}, no drafter == plain ONNX Runtime on {g['plain_eq_ort']}/"
              f"{g['ort_checked']}; {g['tok_s_speculative']} vs {g['tok_s_no_drafter']} tok/s")
    if args.against:
        report["speed"] = speed_against(args.bundle, args.against, list(pool[:args.prompts]), args.tokens,
                                        args.threads)
        report["speed"]["against"] = args.against
    if args.sampled:
        spec_engine = Engine.load(args.bundle, threads=args.threads, max_context=256)
        plain_engine = Engine.load(args.bundle, threads=args.threads, max_context=256, drafting="none")
        m = spec_engine.manifest
        ort_run = PlainORT(resolve_bundle(args.bundle) / m.target.graph, m.target, args.threads)
        report["sampled"] = {}
        for name, text, t, top_p in CELLS:
            r = sampled_cell(spec_engine, plain_engine, ort_run, text, t, top_p, args.sampled)
            report["sampled"][name] = r
            print(f"{name}: speculative vs exact p {r['speculative_vs_exact_p']:.3g}"
                  f", no drafter vs exact p {r['no_drafter_vs_exact_p']:.3g}, speculative vs no drafter "
                  f"{r['speculative_vs_no_drafter_p']:.3g} (TV {r['total_variation']:.3f}, "
                  f"{r['distinct_outcomes']} outcomes)", flush=True)
    name = Path(str(args.bundle)).name.split("-")[0] + ("_code" if args.code else "")
    out = args.out or HERE / "results" / f"one_distribution_{name}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
