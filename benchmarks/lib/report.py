"""Turn a run_all results dict into ratios, claims, plots and the Markdown table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import bandwidth

MiB = 2**20
EDGE_AR, EDGE_SD, EDGE_SD_UNTRIMMED = "edge_spec_ar T=0", "edge_spec_sd trimmed T=0", "edge_spec_sd untrimmed T=0"
ORT_AR = "ort_genai_ar T=0"


def _tps(systems: dict[str, Any], name: str) -> float | None:
    return (systems.get(name) or {}).get("tokens_per_s")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def best_of(systems: dict[str, Any], prefix: str, temp: str = "T=0") -> str | None:
    """The fastest measured system whose name starts with ``prefix`` (any k, spinning on or off)."""
    names = [n for n in systems if n.startswith(prefix) and n.endswith(" " + temp) and _tps(systems, n)]
    return max(names, key=lambda n: _tps(systems, n)) if names else None


def verify_ms(sd: dict[str, Any]) -> float | None:
    """Mean wall time of one target (verify) pass, from the system's own counters."""
    st = sd.get("spec_stats")
    if st and st.get("rounds"):
        return st["total_target_ms"] / st["rounds"]
    es = sd.get("engine_stats")
    if es and es.get("target_passes"):
        return 1e3 * es["target_seconds"] / es["target_passes"]  # includes the prefill: a slight overestimate
    return None


def theory(sd: dict[str, Any], ar: dict[str, Any], draft_ms: float | None) -> dict[str, Any] | None:
    """α from measured tokens per target pass, c = drafter step / target AR step, speedup = E/(γc+1).

    Also the verify-aware version E/(γc + v), v = measured verify pass / AR step: on CPU a
    (γ+1)-token pass costs more than one step (GUIDE §3), which the textbook formula ignores."""
    gamma, tpp = sd.get("gamma"), sd.get("tokens_per_target_pass")
    ar_step_ms = 1e3 / ar["decode_tokens_per_s"] if ar.get("decode_tokens_per_s") else None
    if not gamma or not tpp or not draft_ms or not ar_step_ms:
        return None
    g = max(1, round(float(gamma)))
    alpha = bandwidth.alpha_from_tokens_per_pass(tpp, g)
    c = draft_ms / ar_step_ms
    th = bandwidth.theoretical_speedup(alpha, g, c)
    measured = _ratio(sd.get("tokens_per_s"), ar.get("tokens_per_s"))
    vms = verify_ms(sd)
    v = vms / ar_step_ms if vms else None
    th_v = bandwidth.expected_tokens(alpha, g) / (g * c + v) if v else None
    return {"gamma": g, "alpha": alpha, "c": c, "expected_tokens": bandwidth.expected_tokens(alpha, g),
            "theoretical_speedup": th, "measured_speedup": measured,
            "share_of_theory": measured / th if measured else None,
            "verify_cost_in_steps": v, "verify_aware_speedup": th_v,
            "share_of_verify_aware": measured / th_v if measured and th_v else None}


def same_greedy(results: dict[str, Any]) -> dict[str, Any] | None:
    """Do the demo and bench targets' int4 graphs produce the same greedy tokens (ORT GenAI AR, first repeat)?"""
    pairs = results["pairs"]
    if "demo" not in pairs or "bench" not in pairs:
        return None
    a = (pairs["demo"]["systems"].get(ORT_AR) or {}).get("runs") or []
    b = (pairs["bench"]["systems"].get(ORT_AR) or {}).get("runs") or []
    ta = {r["prompt"]: r["token_ids"] for r in a if "token_ids" in r}
    tb = {r["prompt"]: r["token_ids"] for r in b if "token_ids" in r}
    rows = []
    for i in sorted(set(ta) & set(tb)):
        x, y = ta[i], tb[i]
        first = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), None)
        rows.append({"prompt": i, "identical": x == y, "first_difference": first, "tokens": min(len(x), len(y))})
    return {"prompts": rows, "identical": sum(r["identical"] for r in rows), "of": len(rows)}


def greedy_agreement(systems: dict[str, Any], reference: str = ORT_AR) -> dict[str, str]:
    """For every greedy system: on how many prompts its tokens equal ``reference``'s (same graph, first repeat)."""
    ref = {r["prompt"]: r["token_ids"] for r in (systems.get(reference) or {}).get("runs", []) if "token_ids" in r}
    out = {}
    for name, r in systems.items():
        if name == reference or not name.endswith(" T=0") or name.startswith("hf_"):
            continue
        mine = {x["prompt"]: x["token_ids"] for x in r.get("runs", []) if "token_ids" in x}
        common = sorted(set(ref) & set(mine))
        if common:
            out[name] = f"{sum(ref[i] == mine[i] for i in common)}/{len(common)}"
    return out


def analyse(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    bw = results["bandwidth"]["bytes_per_s"]
    n_prompt = sum(len(p["text"]) for p in results["prompts"]) // max(1, len(results["prompts"])) // 3  # ~3 B/token
    for pair, pr in results["pairs"].items():
        s = pr["systems"]
        a: dict[str, Any] = {}
        sizes = pr.get("sizes") or {}
        if sizes:
            ctx = n_prompt + results["environment"]["settings"]["max_new_tokens"] // 2
            a["ar_ceiling_tokens_per_s"] = bandwidth.ar_ceiling(bw, sizes["weight_bytes"], sizes["kv_bytes_per_token"],
                                                                ctx)
            a["bytes_per_token"] = bandwidth.bytes_per_token(sizes["weight_bytes"], sizes["kv_bytes_per_token"], ctx)
        ort_spec, ort_ar = best_of(s, "ort_genai_spec"), best_of(s, "ort_genai_ar") or ORT_AR
        a["ort_best_spec"], a["ort_best_ar"] = ort_spec, ort_ar
        if ort_spec:
            st = s[ort_spec].get("spec_stats") or {}
            dms = st.get("total_draft_ms", 0) / st["draft_forward_passes"] if st.get("draft_forward_passes") else None
            a["ort_theory"] = theory(s[ort_spec], s.get(ort_ar, {}), dms)
        if _tps(s, EDGE_SD):
            a["edge_theory"] = theory(s[EDGE_SD], s.get(EDGE_AR, {}), s[EDGE_SD].get("drafter_ms_per_token"))
        fixed = best_of(s, "edge_spec_sd trimmed gamma=")
        if fixed:
            a["edge_fixed_gamma_theory"] = theory(s[fixed], s.get(EDGE_AR, {}), s[fixed].get("drafter_ms_per_token"))
        a["ratios"] = {
            "edge SD / edge AR (greedy)": _ratio(_tps(s, EDGE_SD), _tps(s, EDGE_AR)),
            "edge SD / ORT GenAI speculative (greedy, best k)": _ratio(_tps(s, EDGE_SD), _tps(s, ort_spec or "")),
            "edge AR / ORT GenAI AR (greedy, best config)": _ratio(_tps(s, EDGE_AR), _tps(s, ort_ar)),
            "trimmed / untrimmed drafter (edge SD greedy)": _ratio(_tps(s, EDGE_SD), _tps(s, EDGE_SD_UNTRIMMED)),
            "edge SD share of theoretical speedup": (a.get("edge_theory") or {}).get("share_of_theory"),
            "ORT GenAI speculative / ORT GenAI AR (greedy, best configs)":
                _ratio(_tps(s, ort_spec or ""), _tps(s, ort_ar)),
            "transformers assisted / transformers AR": _ratio(_tps(s, "hf_assisted T=0"), _tps(s, "hf_ar T=0")),
            "ORT GenAI AR / AR ceiling": _ratio(_tps(s, ort_ar), a.get("ar_ceiling_tokens_per_s")),
            "edge AR / AR ceiling": _ratio(_tps(s, EDGE_AR), a.get("ar_ceiling_tokens_per_s")),
        }
        sweep = pr.get("budget_sweep") or []
        fitted = [p for p in sweep if p.get("budget") and "peak_rss" in p and "refused" not in p]
        a["greedy_tokens_equal_to_ort_genai_ar"] = greedy_agreement(s)
        oracle = pr.get("oracle") or {}
        if oracle and "skipped" not in oracle:
            a["oracle_theory"] = {}
            for name, r in oracle.items():
                if name.startswith("edge"):
                    a["oracle_theory"][name] = theory(r, s.get(EDGE_AR, {}), r.get("drafter_ms_per_token"))
                else:
                    st = r.get("spec_stats") or {}
                    dms = st["total_draft_ms"] / st["draft_forward_passes"] if st.get("draft_forward_passes") else None
                    a["oracle_theory"][name] = theory(r, s.get(ort_ar, {}), dms)
        a["sweep_all_within_budget"] = all(p["peak_rss"] <= p["budget"] for p in fitted) if fitted else None
        out[pair] = a
    out["greedy_demo_vs_bench_int4"] = same_greedy(results)
    bench = out.get("bench", {}).get("ratios", {})
    targets = [("edge SD / edge AR (greedy)", 2.5), ("edge SD / ORT GenAI speculative (greedy, best k)", 1.3),
               ("edge AR / ORT GenAI AR (greedy, best config)", 0.95),
               ("trimmed / untrimmed drafter (edge SD greedy)", 1.15),
               ("edge SD share of theoretical speedup", 0.90)]
    claims = [{"claim": f"{name} >= {goal}", "value": bench.get(name),
               "met": None if bench.get(name) is None else bench[name] >= goal} for name, goal in targets]
    within = out.get("bench", {}).get("sweep_all_within_budget")
    claims.append({"claim": "peak RSS <= budget at every sweep point", "value": within, "met": within})
    out["claims_bench_target"] = claims
    return out


# ------------------------------------------------------------------------------ plots
def plots(results: dict[str, Any], outdir: Path, stem: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    pairs = results["pairs"]
    fig, axes = plt.subplots(1, len(pairs), figsize=(6.5 * len(pairs), 4.8), squeeze=False)
    for ax, (pair, pr) in zip(axes[0], pairs.items()):
        items = [(n, r["tokens_per_s"]) for n, r in pr["systems"].items() if r.get("tokens_per_s")]
        colors = ["tab:green" if n.startswith("edge") else "tab:blue" if n.startswith("ort") else "tab:gray"
                  for n, _ in items]
        ax.barh([n for n, _ in items], [v for _, v in items], color=colors)
        ceiling = results["analysis"].get(pair, {}).get("ar_ceiling_tokens_per_s")
        if ceiling:
            ax.axvline(ceiling, color="k", ls="--", lw=1, label=f"AR bandwidth ceiling {ceiling:.0f}")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(f"{pair} target: tokens/s (median)")
        ax.tick_params(axis="y", labelsize=8)
        ax.set_xscale("log")
    fig.tight_layout()
    p = outdir / f"{stem}_throughput.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    sweep = (pairs.get("bench") or {}).get("budget_sweep") or []
    pts = [q for q in sweep if q.get("budget") and q.get("tokens_per_s")]
    if pts:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        x = [q["budget"] / MiB for q in pts]
        ax.plot(x, [q["tokens_per_s"] for q in pts], "o-", color="tab:green", label="edge-spec SD tokens/s")
        ax.set_xlabel("memory_budget (MiB)")
        ax.set_ylabel("tokens/s")
        ax2 = ax.twinx()
        ax2.plot(x, [q["peak_rss"] / MiB for q in pts], "s--", color="tab:red", label="edge-spec peak RSS")
        ax2.plot(x, x, ":", color="gray", label="RSS = budget")
        ort = (pairs["bench"]["systems"].get(ORT_AR) or {}).get("peak_rss")
        if ort:
            ax2.axhline(ort / MiB, color="tab:blue", lw=1, label="ORT GenAI AR peak RSS (default)")
        ax2.set_ylabel("peak RSS (MiB)")
        refused = [q["budget"] / MiB for q in sweep if q.get("refused")]
        for r in refused:
            ax.axvline(r, color="k", lw=0.8, ls="-.")
        ax.set_title("bench target: budget sweep" + (f" (refused at {refused[0]:.0f} MiB)" if refused else ""))
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="best")
        fig.tight_layout()
        p = outdir / f"{stem}_budget_sweep.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


# ------------------------------------------------------------------------------ markdown
def _f(v: Any, fmt: str = "{:.1f}") -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return fmt.format(v)


def markdown(results: dict[str, Any], pngs: list[Path]) -> str:
    env = results["environment"]
    v = env["versions"]
    lines = [f"Command: `{env['command']}` — {env['date']} — git {env['git']}",
             f"Machine: {env['cpu']}, {env['cores']} cores, load average at start "
             f"{', '.join(f'{x:.1f}' for x in env['load_average_at_start'])}; threads per system: "
             f"{env['settings']['threads']}",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
             f"Prompts: {len(results['prompts'])} ({', '.join(sorted({p['kind'] for p in results['prompts']}))}), "
             f"max_new_tokens {env['settings']['max_new_tokens']}, medians over {env['settings']['repeats']} "
             "repeat(s)", ""]
    if results.get("edge_spec_skipped"):
        lines += [f"**edge-spec systems skipped:** {results['edge_spec_skipped']}", ""]
    bw = results["bandwidth"]
    lines += [f"Copy bandwidth: {bw['bytes_per_s'] / 1e9:.1f} GB/s (numpy copy of {bw['array_megabytes']} MB, "
              "read + write counted)", ""]
    chk = results.get("bench_target_check") or {}
    if chk:
        lines += [f"Bench target vs demo target (torch fp32): max |Δlogit| {chk['max_abs_logit_diff']:.2e}, "
                  f"greedy continuations equal: {_f(chk['greedy_equal'])}; parameters "
                  f"{chk['parameters']['bench'] / 1e6:.1f} M (demo {chk['parameters']['source'] / 1e6:.1f} M)", ""]
    same = results["analysis"].get("greedy_demo_vs_bench_int4")
    if same:
        firsts = [r["first_difference"] for r in same["prompts"] if r["first_difference"] is not None]
        lines += [f"Bench vs demo target, int4 graphs (ORT GenAI greedy): {same['identical']}/{same['of']} prompts "
                  "give identical tokens" + (f"; first differences at tokens {firsts}" if firsts else ""), ""]
    hashes = env.get("model_hashes")
    if hashes:
        lines += ["Weights: " + ", ".join(f"{k} {v}" for k, v in hashes.items()), ""]
    for pair, pr in results["pairs"].items():
        an = results["analysis"].get(pair, {})
        lines += [f"### {pair} target ({pr['peer_graphs']})", "",
                  f"AR ceiling from bandwidth: {_f(an.get('ar_ceiling_tokens_per_s'))} tokens/s "
                  f"({_f((an.get('bytes_per_token') or 0) / MiB, '{:.1f}')} MiB read per token)", "",
                  "| system | tokens/s | decode tokens/s | TTFT ms | new tokens | acceptance | tokens/target pass "
                  "| peak RSS MiB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in pr["systems"].items():
            if r.get("error") or r.get("refused"):
                lines.append(f"| {name} | {r.get('error') or r.get('refused')} |  |  |  |  |  |  |")
                continue
            lines.append(f"| {name} | {_f(r.get('tokens_per_s'))} | {_f(r.get('decode_tokens_per_s'))} | "
                         f"{_f(r.get('ttft_ms'))} | {_f(r.get('mean_new_tokens'))} | "
                         f"{_f(r.get('acceptance'), '{:.2f}')} | {_f(r.get('tokens_per_target_pass'), '{:.2f}')} | "
                         f"{_f((r.get('peak_rss') or 0) / MiB, '{:.0f}')} |")
        lines += ["", "| ratio (same run) | value |", "|---|---:|"]
        lines += [f"| {k} | {_f(val, '{:.2f}')} |" for k, val in an.get("ratios", {}).items()]
        agree = an.get("greedy_tokens_equal_to_ort_genai_ar")
        if agree:
            lines.append("\nGreedy tokens identical to ORT GenAI AR on the same graph (prompts): "
                         + ", ".join(f"{k.removesuffix(' T=0')} {v}" for k, v in agree.items()))
        for who in ("edge_theory", "edge_fixed_gamma_theory", "ort_theory"):
            th = an.get(who)
            if th:
                label = who.replace("_theory", "").replace("_", " ")
                lines.append(f"\n{label} theory: α={th['alpha']:.2f}, γ={th['gamma']}, c={th['c']:.3f}, "
                             f"E={th['expected_tokens']:.2f}, theoretical speedup {th['theoretical_speedup']:.2f}×, "
                             f"measured {_f(th['measured_speedup'], '{:.2f}')}×; verify pass = "
                             f"{_f(th['verify_cost_in_steps'], '{:.2f}')} AR steps → verify-aware theory "
                             f"{_f(th['verify_aware_speedup'], '{:.2f}')}×")
        oracle = pr.get("oracle")
        if oracle and "skipped" not in oracle:
            lines += ["", "Oracle drafter (the demo target drafts for the bench target: same function, α ≈ 1):", "",
                      "| system | tokens/s | acceptance | tokens/target pass | × own AR (same run) | c "
                      "| theory × | share of theory | verify pass / AR step | verify-aware theory × | share |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for name, r in oracle.items():
                ar = _tps(pr["systems"], EDGE_AR if name.startswith("edge") else (an.get("ort_best_ar") or ORT_AR))
                th = (an.get("oracle_theory") or {}).get(name) or {}
                lines.append(f"| {name} | {_f(r.get('tokens_per_s'))} | {_f(r.get('acceptance'), '{:.2f}')} | "
                             f"{_f(r.get('tokens_per_target_pass'), '{:.2f}')} | "
                             f"{_f(_ratio(r.get('tokens_per_s'), ar), '{:.2f}')} | {_f(th.get('c'), '{:.3f}')} | "
                             f"{_f(th.get('theoretical_speedup'), '{:.2f}')} | "
                             f"{_f(th.get('share_of_theory'), '{:.2f}')} | "
                             f"{_f(th.get('verify_cost_in_steps'), '{:.2f}')} | "
                             f"{_f(th.get('verify_aware_speedup'), '{:.2f}')} | "
                             f"{_f(th.get('share_of_verify_aware'), '{:.2f}')} |")
        sweep = pr.get("budget_sweep")
        if sweep:
            lines += ["", "| memory_budget MiB | tokens/s | peak RSS MiB | within budget | note |",
                      "|---:|---:|---:|---|---|"]
            for q in sweep:
                b = q.get("budget")
                lines.append(f"| {_f(b / MiB if b else None, '{:.0f}')} | {_f(q.get('tokens_per_s'))} | "
                             f"{_f((q.get('peak_rss') or 0) / MiB, '{:.0f}')} | "
                             f"{_f(q['peak_rss'] <= b) if b and q.get('tokens_per_s') else '–'} | "
                             f"{(q.get('refused') or q.get('error') or '')[:90]} |")
        lines.append("")
    lines += ["### Targets (bench target)", "", "| claim | value | met |", "|---|---:|---|"]
    for c in results["analysis"].get("claims_bench_target", []):
        val = _f(c["value"]) if isinstance(c["value"], bool) else _f(c["value"], "{:.2f}")
        lines.append(f"| {c['claim']} | {val} | {_f(c['met']) if c['met'] is not None else 'not measured'} |")
    root = Path(__file__).resolve().parents[2]
    lines += [""] + [f"![{p.stem}]({p.resolve().relative_to(root) if p.resolve().is_relative_to(root) else p})"
                     for p in pngs] + [""]
    return "\n".join(lines)

