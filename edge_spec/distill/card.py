"""MODEL_CARD.md for a distilled drafter, rendered from its training report (numbers measured, never typed)."""

from __future__ import annotations

from pathlib import Path


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def render_card(report: dict, command: str | None = None) -> str:
    """Markdown model card from the ``training.json`` report written by :func:`edge_spec.distill.distill`."""
    t, d, data, tr = report["target"], report["drafter"], report["data"], report["train"]
    final, first = tr["final"], tr["history"][0]
    lines = [
        "# Distilled drafter (edge-spec distill)",
        "",
        f"A speculative-decoding drafter for `{t['path']}` (sha256 `{t['sha256']}`), trained by "
        "`edge-spec distill`. It is "
        f"{d['layers']} of the target's {t['layers']} decoder layers (initialised from target layers "
        f"{d['layers_from']}), fine-tuned to match the target's distribution, on the target's own embedding "
        "and tied LM head, which are **not stored here** (the bundle shares the target's copy; "
        "`edge_spec.distill.materialize.full_checkpoint` writes a self-contained HF checkpoint).",
        "",
        f"* Stored parameters: {d['params_stored']:,} (fp16, {2 * d['params_stored'] / 2**20:.1f} MiB); shared "
        f"with the target: {d['params_shared']:,}.",
        f"* Data: {data['train_tokens']:,} answer tokens written by the target for {data['train_sequences']:,} "
        f"prompts (T=0 / 0.7 / 1.0: {', '.join(f'{v:,}' for v in data['train_tokens_by_temperature'].values())}), "
        f"{data['generation_seconds'] / 60:.1f} min of generation; held out: {data['heldout_sequences']} "
        f"prompts, {data['heldout_tokens']:,} tokens.",
        f"* Training: {tr['steps']} steps of {tr['config']['batch_seqs']} sequences, top-k forward KL, lr "
        f"{tr['config']['lr']}, {tr['seconds'] / 60:.1f} min on {report['device']} ({report['threads']} "
        f"thread(s){_bf16(report)}), seed {report['seed']}, torch {report['torch']}.",
        "",
        "## Held-out numbers (torch, against the target in fp32 (a GGUF dequantized); drafter weights in fp16)",
        "",
        "| | before training (target layers as they are) | after training |",
        "|---|---|---|",
        f"| greedy agreement = greedy acceptance per token ({final['greedy_positions']:,} positions) | "
        f"{_pct(first['greedy_agreement'])} | **{_pct(final['greedy_agreement'])}** |",
        f"| T=0.7 expected acceptance E[Σ min(p,q)] ({final['t07_positions']:,} positions; lower bound, "
        f"exact ≤ +{final['accept_t07_p_tail']:.3f}) | {_pct(first['accept_t07'])} | **{_pct(final['accept_t07'])}** |",
        f"| top-1 agreement on all held-out answers | {_pct(first['agreement_all'])} | "
        f"{_pct(final['agreement_all'])} |",
        f"| KD loss (top-k forward KL) | {first['kd_loss']:.3f} | {final['kd_loss']:.3f} |",
        "",
        "These are proxies measured in torch; acceptance through an exported bundle (quantized graphs) is "
        "measured by the benchmarks.",
        "",
        "## Training curve (held-out)",
        "",
        "| step | greedy agreement | T=0.7 acceptance | KD loss |",
        "|---|---|---|---|",
    ]
    lines += [f"| {h['step']} | {h['greedy_agreement']:.3f} | {h['accept_t07']:.3f} | {h['kd_loss']:.3f} |"
              for h in tr["history"]]
    if command:
        lines += ["", "## Reproduce", "", "```bash", command, "```"]
    return "\n".join(lines) + "\n"


def render_eagle_card(report: dict, command: str | None = None) -> str:
    """Markdown model card of an EAGLE-3 head from its ``training.json`` report."""
    t, d, data, tr = report["target"], report["drafter"], report["data"], report["train"]
    final, first = tr["final"], tr["history"][0]
    depths = len(final["greedy"])
    head = " | ".join(f"depth {i + 1}" for i in range(depths))
    lines = [
        "# EAGLE-3 head (edge-spec distill --kind eagle3)",
        "",
        f"A feature drafter for `{Path(t['path']).name}` (sha256 `{t['sha256']}`): one decoder layer that reads "
        "the target's "
        f"residual stream entering layers {d['aux_layers']} (vLLM's aux-layer ids; {t['layers']} = the last layer's "
        "output) and the target's own embedding (not stored here), and predicts over a draft vocabulary of "
        f"{d['draft_vocab']:,} tokens ({_pct(d['draft_vocab_coverage'])} of held-out answer tokens). Published "
        "EAGLE-3 layout (config.json + model.safetensors with fc / midlayer / norm / lm_head / d2t / t2d).",
        "",
        f"* Stored parameters: {d['params_stored']:,} (fp16, {2 * d['params_stored'] / 2**20:.1f} MiB)"
        + (f"; MLP {d['mlp']:,} units." if d.get("mlp") else "."),
        f"* Data: {data['train_tokens']:,} answer tokens {_writers(data)} for {data['train_sequences']:,} "
        f"prompts, {_generation_seconds(data) / 60:.1f} min of generation; held out: {data['heldout_sequences']} "
        f"prompts, {data['heldout_tokens']:,} tokens. Features recomputed in {report['features_seconds'] / 60:.1f} "
        "min (teacher-forced passes).",
        f"* Training: {tr['steps']} steps of {tr['config']['batch_seqs']} sequences, training-time test over "
        f"{tr['config']['depth']} draft step{'s' if tr['config']['depth'] != 1 else ''}, top-k forward KL, "
        f"lr {tr['config']['lr']}, {tr['seconds'] / 60:.1f} min "
        f"on {report['device']} ({report['threads']} thread(s){_bf16(report)}), seed {report['seed']}, torch "
        f"{report['torch']}.",
        *_continued(report),
        "",
        "## Held-out acceptance (torch, fp16 head against the fp32 target; each depth given the earlier drafts right)",
        "",
        f"| | {head} |",
        "|---|" + "---|" * depths,
        f"| greedy, before training ({first['greedy_positions']:,} positions) | "
        + " | ".join(f"{x:.3f}" for x in first["greedy"]) + " |",
        "| greedy, after training | " + " | ".join(f"**{x:.3f}**" for x in final["greedy"]) + " |",
        *_t07_rows(first, final, depths),
        "",
        "## Training curve (held-out, depth 1 / 2 / 3)",
        "",
        "| step | greedy | T=0.7 |",
        "|---|---|---|",
    ]
    lines += [f"| {h['step']} | {' / '.join(f'{x:.3f}' for x in h['greedy'][:3])} | "
              f"{' / '.join(f'{x:.3f}' for x in h['t07'][:3]) if h.get('t07_positions') else '—'} |"
              for h in tr["history"]]
    if command:
        lines += ["", "## Reproduce", "", "```bash", command, "```"]
    return "\n".join(lines) + "\n"


def _t07_rows(first: dict, final: dict, depths: int) -> list[str]:
    """The card's T=0.7 rows; one row saying so when the held-out answers hold no sampled ones (nothing measured)."""
    if not first.get("t07_positions") and not final.get("t07_positions"):
        return ["| T=0.7 E[Σ min(p,q)]: no held-out answer was sampled at T=0.7 | "
                + " | ".join(["not measured"] * depths) + " |"]
    return [f"| T=0.7 E[Σ min(p,q)] before ({first['t07_positions']:,} positions) | "
            + " | ".join(f"{x:.3f}" for x in first["t07"]) + " |",
            "| T=0.7 after training | " + " | ".join(f"**{x:.3f}**" for x in final["t07"]) + " |"]


def _generation_seconds(data: dict) -> float:
    """Generation time of the data: this run's, or the answers files' (``--data``) when it generated none."""
    return data["generation_seconds"] or float((data.get("answers") or {}).get("generation_seconds") or 0.0)


def _writers(data: dict) -> str:
    """Who wrote the answers: the target, except the tokens of ``--data`` files whose meta names another source
    (teacher-forced text: the features and the teacher's distribution are still the target's)."""
    other = [f for f in (data.get("answers") or {}).get("files", []) if f.get("source")]
    if not other:
        return "written by the target"
    parts = "; ".join(f"{f.get('train_tokens', 0):,} in `{f['file']}`: {f['source']}" for f in other)
    return f"written by the target, except text from other writers read teacher-forced ({parts})"


def _continued(report: dict) -> list[str]:
    """The card line for a head continued from an earlier one (``--init-from``); none otherwise."""
    prior = report.get("init_from")
    if not prior:
        return []
    minutes = f", {prior['seconds'] / 60:.1f} min" if prior.get("seconds") else ""
    tokens = f" on {prior['train_tokens']:,} tokens" if prior.get("train_tokens") else ""
    return [f"* Continued from `{prior['path']}` ({prior.get('steps')} steps{minutes}{tokens}); \"before training\" "
            "below is that head."]


def _bf16(report: dict) -> str:
    """", bf16 matmuls" for a run trained under bfloat16 autocast (older reports have no precision: fp32)."""
    return ", bf16 matmuls" if report.get("precision") == "bf16" else ""
