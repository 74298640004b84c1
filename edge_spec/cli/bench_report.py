"""Tables, the Markdown report and the plots of ``edge-spec bench`` (matplotlib is imported lazily)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from edge_spec.cli import common

MiB = common.MiB
SAMPLINGS = (("greedy", 0.0), ("T=0.7", 0.7))


SPREAD_NOTE = ("tok/s: all runs of a row pooled; in brackets the lowest and highest tok/s of one repeat "
               "(n = {n}) over the same prompts, measured after an unrecorded warm-up.")


def _range(r: dict[str, Any], key: str) -> str:
    lo, hi = r.get(key, (0.0, 0.0))
    return f" ({lo:.0f}–{hi:.0f})"


def table(rows: list[dict[str, Any]], md: bool = False) -> str:
    head = ["category", "sampling", "AR tok/s (min–max)", "spec tok/s (min–max)", "speedup", "acceptance",
            "tokens/pass"]
    body = [[r["category"], r["sampling"], f"{r['ar_tps']:.1f}" + _range(r, "ar_range"),
             f"{r['sd_tps']:.1f}" + _range(r, "sd_range"), f"{r['speedup']:.2f}x",
             f"{r['acceptance']:.0%}", f"{r['tokens_per_pass']:.2f}"] for r in rows]
    return _grid(head, body, md)


def _grid(head: list[str], body: list[list[str]], md: bool) -> str:
    if md:
        return "\n".join("| " + " | ".join(c) + " |" for c in [head, ["---"] * len(head), *body])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in [head, *body])


def sweep_table(points: list[dict[str, Any]], md: bool = False) -> str:
    head = ["budget", "mode", "context", "max γ", "planned", "peak RSS", "≤ budget", "tok/s median (min–max)",
            "acceptance"]
    body = []
    for p in points:
        b = f"{p['budget'] / MiB:.1f} MiB"
        if not p["ok"]:
            body.append([b, "refused", "-", "-", "-", f"{p['peak_rss'] / MiB:.1f} MiB", "-", "-", "-"])
            continue
        body.append([b, p["mode"], str(p["max_context"]), str(p["draft_length"]), f"{p['planned'] / MiB:.1f} MiB",
                     f"{p['peak_rss'] / MiB:.1f} MiB", "yes" if p["peak_rss"] <= p["budget"] else "NO",
                     f"{p.get('tps_median', p['tokens_per_second']):.1f} ({p.get('tps_min', 0):.0f}–"
                     f"{p.get('tps_max', 0):.0f})", f"{p['acceptance']:.0%}"])
    return _grid(head, body, md)


# ------------------------------------------------------------------------------ outputs
def plots(out: Path, rows: list[dict[str, Any]], points: list[dict[str, Any]] | None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(dict.fromkeys(r["category"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(SAMPLINGS)
    for j, (sampling, _) in enumerate(SAMPLINGS):
        sel = {r["category"]: r for r in rows if r["sampling"] == sampling}
        xs = [i + (j - (len(SAMPLINGS) - 1) / 2) * width for i in range(len(cats))]
        axes[0].bar(xs, [sel[c]["speedup"] for c in cats], width, label=sampling)
        axes[1].bar(xs, [sel[c]["acceptance"] for c in cats], width, label=sampling)
    axes[0].axhline(1.0, color="gray", linestyle="--", linewidth=1)
    axes[0].set_ylabel("speedup (speculative / AR tok/s)")
    axes[1].set_ylabel("acceptance rate")
    axes[1].set_ylim(0, 1)
    for ax in axes:
        ax.set_xticks(range(len(cats)), cats)
        ax.legend()
    fig.suptitle("edge-spec: speculative vs autoregressive, per prompt category")
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=110)
    plt.close(fig)
    images = ["bench.png"]
    ok = [p for p in points or [] if p["ok"]]
    if ok:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        xs = [p["budget"] / MiB for p in ok]
        med = [p.get("tps_median", p["tokens_per_second"]) for p in ok]
        spread = [[m - p.get("tps_min", m) for m, p in zip(med, ok)],
                  [p.get("tps_max", m) - m for m, p in zip(med, ok)]]
        axes[0].errorbar(xs, med, yerr=spread, fmt="o-", capsize=3)  # median and min–max over the repeats
        for p, x, m in zip(ok, xs, med):
            axes[0].annotate(p["mode"], (x, m), fontsize=8, textcoords="offset points",
                             xytext=(0, 6), ha="center")
        refused = [p["budget"] / MiB for p in points or [] if not p["ok"]]
        if refused:
            axes[0].plot(refused, [0] * len(refused), "x", color="red", label="refused by the planner")
            axes[0].legend()
        axes[0].set_ylim(bottom=0)
        axes[0].set_ylabel("tokens/s (greedy; median, min–max over repeats)")
        axes[1].plot(xs, [p["peak_rss"] / MiB for p in ok], "o-", label="peak RSS")
        axes[1].plot(xs, [p["planned"] / MiB for p in ok], "s--", label="planned")
        axes[1].plot(xs, xs, ":", color="gray", label="budget")
        axes[1].set_ylabel("MiB")
        axes[1].legend()
        for ax in axes:
            ax.set_xlabel("memory budget (MiB)")
        fig.suptitle("edge-spec: throughput and peak RSS against the memory budget (one process per point)")
        fig.tight_layout()
        fig.savefig(out / "sweep.png", dpi=110)
        plt.close(fig)
        images.append("sweep.png")
    return images


def report(res: dict[str, Any], images: list[str], have_plot: bool) -> str:
    import platform

    import onnxruntime

    import edge_spec

    s = res["settings"]
    lines = [f"# edge-spec bench: {Path(res['bundle']).name}", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; edge-spec {edge_spec.__version__}, onnxruntime "
             f"{onnxruntime.__version__}, Python {platform.python_version()}",
             f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, device {s['device']}",
             f"- bundle: `{res['bundle']}`; budget {s['memory_budget'] or 'none'}",
             f"- prompts: {s['prompts']} ({s['n_prompts']}), {s['max_new_tokens']} new tokens per run, stop tokens "
             f"ignored (fixed length), {s['repeats']} repeat(s), AR and speculative interleaved; draft length "
             f"{s['draft_length']}",
             "", "```", res["plan"], "```", "", "## Throughput", "", table(res["rows"], md=True), "",
             "speedup = speculative tok/s / AR tok/s over the same prompts and seeds; acceptance = accepted / "
             "drafted tokens; tokens/pass = tokens committed per target pass (mean accepted length + 1 when "
             "drafting).", ""]
    if "bench.png" in images:
        lines += ["![speedup and acceptance per category](bench.png)", ""]
    elif not have_plot:
        lines += ["(no plot: matplotlib is not installed)", ""]
    lines += ["## Draft lengths", "", "Steps per drafted length γ (speculative runs):", "",
              _grid(["category", "sampling", "γ histogram (γ:steps)"],
                    [[r["category"], r["sampling"], common.gamma_hist(r["gamma_hist"])] for r in res["rows"]], True),
              "", "## Memory", "",
              f"Peak RSS of the benchmark process (VmHWM): {common.mib(res['peak_rss_bytes'])}.", ""]
    if res["sweep"] is not None:
        lines += ["## Memory budget sweep", "",
                  "Each budget ran in a fresh process (greedy, speculative as the plan allows).", "",
                  sweep_table(res["sweep"], md=True), ""]
        if "sweep.png" in images:
            lines += ["![throughput and peak RSS against the budget](sweep.png)", ""]
    return "\n".join(lines) + "\n"
