"""MODEL_CARD.md for a distilled drafter, rendered from its training report (numbers measured, never typed)."""

from __future__ import annotations


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
        f"thread(s)), seed {report['seed']}, torch {report['torch']}.",
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
