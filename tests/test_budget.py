"""The memory planner: exact arithmetic from a manifest, the degradation ladder, refusals, parsing."""

from __future__ import annotations

import pytest

from edge_spec.bundle import ChatFormat, Manifest, ModelSpec, Quantization, TokenizerSpec, VocabTrim
from edge_spec.errors import BudgetError, EdgeSpecError
from edge_spec.runtime.budget import MIN_CONTEXT, PREFILL_CHUNK, SLACK_BYTES, MiB, parse_budget, plan_memory

WS = {1: 1000, 2: 2000, 4: 4000, 8: 8000, 16: 16000}


def spec(vocab: int, load: int, kv: int) -> ModelSpec:
    return ModelSpec(graph="m.onnx", data_files=(), architecture="LlamaForCausalLM",
                     quantization=Quantization("int4", 32, 4), num_layers=2, num_attention_heads=4,
                     num_kv_heads=2, head_size=32, hidden_size=128, vocab_size=vocab, full_vocab_size=8192,
                     max_context=2048, weight_bytes=load, load_bytes=load, kv_bytes_per_token=kv,
                     workspace_bytes=WS, input_names={}, output_names={})


def manifest(trim: bool = True) -> Manifest:
    return Manifest(
        target=spec(8192, 100 * MiB, 6144), drafter=spec(1024 if trim else 8192, 20 * MiB, 1024),
        tokenizer=TokenizerSpec(("t.json",), 8192, None, (4,), (4,), ChatFormat({}, "")),
        vocab_trim=VocabTrim("id.npy", 1024, 8192, 0.99, 100, 1, 1) if trim else None,
        sources={}, created_by="t", created_at="t")


BASE = 50 * MiB
ATTN = 4 * PREFILL_CHUNK * 4  # attention scores per context token: heads x rows x 4 B


def fixed_spec(gamma: int = 8) -> int:
    t_rows, d_rows = max(PREFILL_CHUNK, gamma + 1), PREFILL_CHUNK
    return (BASE + 100 * MiB + 20 * MiB + t_rows * 8192 * 4 + d_rows * 1024 * 4
            + 2 * (t_rows * 8192 * 4 + gamma * 1024 * 4 + 1024 * 4 + gamma * 8192 * 4) + max(WS[16], WS[16])
            + SLACK_BYTES)


def test_parse_budget():
    assert parse_budget("600MB") == 600_000_000
    assert parse_budget("600 MiB") == 600 * MiB
    assert parse_budget("1.5GB") == 1_500_000_000
    assert parse_budget("2gib") == 2 << 30
    assert parse_budget(123456) == 123456
    assert parse_budget(None) is None
    for bad in ("lots", "600XB", "-5MB", "", 0, -3, True):
        with pytest.raises(EdgeSpecError, match="memory_budget"):
            parse_budget(bad)


def test_plan_exact_arithmetic_and_context_choice():
    m = manifest()
    per_token = 6144 + 1024 + ATTN
    budget = fixed_spec() + 1000 * per_token + 123
    plan = plan_memory(m, budget, BASE)
    assert plan.mode == "speculative" and plan.draft_length == 8
    assert plan.max_context == 1000  # the largest context that fits
    assert plan.total_bytes == fixed_spec() + 1000 * per_token <= budget
    items = dict(plan.items)
    assert items["target KV cache (1000 tokens x 6144 B)"] == 1000 * 6144
    assert items["drafter KV cache (1000 tokens x 1024 B)"] == 1000 * 1024
    assert items["target logits buffer (16 x 8192)"] == 16 * 8192 * 4
    assert items[f"attention scores of the largest pass at full context (1000 tokens x {ATTN} B)"] == 1000 * ATTN
    assert "speculative decoding with the drafter model" in plan.describe()
    # without a budget the context is the model's maximum
    assert plan_memory(m, None, BASE).max_context == 2048


def test_context_is_capped_by_user_and_model():
    plan = plan_memory(manifest(), 10**12, BASE, max_context=300)
    assert plan.max_context == 300
    assert plan_memory(manifest(), 10**12, BASE).max_context == 2048


def test_ladder_drafter_then_lookup_then_refusal():
    m = manifest()
    # too small for the drafter with a minimal context, enough for the target alone
    budget = fixed_spec(1) + MIN_CONTEXT * (6144 + 1024 + ATTN) - 1  # gamma = 1 is the smallest drafter plan
    plan = plan_memory(m, budget, BASE)
    assert plan.mode == "lookup" and plan.draft_length == 8
    assert any("prompt lookup" in n for n in plan.notes)
    assert "prompt-lookup" in plan.describe()
    assert plan.max_context >= MIN_CONTEXT
    # the lower bound: target only, minimal context, 2-token prefill passes
    t_rows = 2
    bound = (BASE + 100 * MiB + MIN_CONTEXT * (6144 + 2 * 4 * 4) + t_rows * 8192 * 4 + 2 * t_rows * 8192 * 4
             + WS[t_rows] + SLACK_BYTES)
    assert plan_memory(m, bound, BASE, drafting="none").mode == "ar"
    # between: lookup's 16-token verify buffers no longer fit, plain AR with smaller prefill passes does
    ar = plan_memory(m, bound + 64 * 1024, BASE)
    assert ar.mode == "ar" and ar.prefill_chunk < PREFILL_CHUNK and ar.target_rows == ar.prefill_chunk
    assert any("plain autoregressive" in n for n in ar.notes)
    assert ar.total_bytes <= bound + 64 * 1024  # every planned item, attention scores included, fits
    with pytest.raises(BudgetError) as err:
        plan_memory(m, bound - 1, BASE)
    msg = str(err.value)
    assert f"{bound / MiB:.1f} MiB" in msg and "target weights" in msg and "raise memory_budget" in msg
    assert msg.count(".") >= 1 and "\n" not in msg


def test_drafting_choices():
    m = manifest()
    assert plan_memory(m, None, BASE, drafting="lookup").mode == "lookup"
    assert plan_memory(m, None, BASE, drafting="none").mode == "ar"
    assert plan_memory(m, None, BASE, draft_length=3).draft_length == 3
    with pytest.raises(EdgeSpecError):
        plan_memory(m, None, BASE, drafting="magic")
    with pytest.raises(EdgeSpecError):
        plan_memory(m, None, BASE, draft_length=99)


def test_auto_drafting_is_the_bundles_default():
    """drafting="auto" runs what the export chose (manifest ``drafting``), hybrid where it chose nothing; an explicit
    mode still wins, and the default never loads a drafter model it does not draft with."""
    import dataclasses

    plain = manifest()
    assert plan_memory(plain, None, BASE).mode == "speculative"
    assert plan_memory(plain, None, BASE).drafting == "hybrid"
    lookup = dataclasses.replace(plain, drafting="lookup")
    auto = plan_memory(lookup, None, BASE)
    assert (auto.mode, auto.drafting) == ("lookup", "lookup")
    assert not any("drafter" in what for what, _ in auto.items)  # no drafter weights or KV planned
    assert plan_memory(lookup, None, BASE, drafting="hybrid").mode == "speculative"
    model = plan_memory(dataclasses.replace(plain, drafting="model"), None, BASE)
    assert (model.mode, model.drafting) == ("speculative", "model")


def test_workspace_counts_the_largest_pass_only():
    plan = plan_memory(manifest(), None, BASE)
    assert dict(plan.items)["largest forward-pass workspace (passes run one at a time)"] == WS[16]


def test_loading_peak_is_within_the_budget_too():
    """Creating a session holds the weights it repacks (load_peak_bytes) until the mapped pages are let go: a plan
    is only made when the budget covers that peak as well; the refusal's bound includes it."""
    from dataclasses import replace

    from edge_spec.runtime.budget import load_floor

    m = manifest()
    big = replace(m, target=replace(m.target, load_peak_bytes=400 * MiB))  # loading needs far more than running
    floor = load_floor(big, "ar", BASE)
    assert floor == BASE + 400 * MiB + SLACK_BYTES
    plan = plan_memory(big, None, BASE)
    assert plan.load_peak_bytes == load_floor(big, "speculative", BASE) and plan.peak_bytes >= floor
    assert plan_memory(big, floor, BASE).mode in ("speculative", "lookup", "ar")
    assert plan_memory(m, floor - MiB, BASE).mode == "speculative"  # without the peak this budget is plenty
    with pytest.raises(BudgetError, match=f"at least {-(-floor // MiB)} MiB"):
        plan_memory(big, floor - MiB, BASE)
    # the drafter loads next to the settled target: its own peak counts from there
    d_big = replace(m, drafter=replace(m.drafter, load_peak_bytes=300 * MiB))
    spec_floor = load_floor(d_big, "speculative", BASE)
    assert spec_floor == BASE + 100 * MiB + 16 * 8192 * 4 + 300 * MiB + SLACK_BYTES
    assert plan_memory(d_big, spec_floor - MiB, BASE).mode == "lookup"  # the drafter cannot even be loaded


def test_row_tables_count_one_pass_of_rows():
    """An embedding in ``row_tables`` is let go after every pass (runtime/memory.py RowTables, Linux): the plan
    counts the pages one pass's rows can make resident (each row's group of 8 interleaved rows, the kernel's
    fault-around and a page), not the whole table; elsewhere, or without row_tables, the whole table."""
    from dataclasses import replace

    from edge_spec.runtime import budget
    from edge_spec.runtime.memory import FAULT_AROUND_BYTES

    m = manifest()
    table = 8192 * 864  # a 864-byte row per token of the full vocabulary
    whole = replace(m, target=replace(m.target, gather_bytes=table, data_files=("target/embed.data",)))
    rows = replace(whole, target=replace(whole.target, row_tables=["target/embed.data"]))
    key_whole = "target embedding table (mapped; pages resident as tokens appear, counted whole)"
    assert dict(plan_memory(whole, None, BASE).items)[key_whole] == table
    plan = plan_memory(rows, None, BASE)
    got = dict(plan.items).get("target embedding table (mapped; the rows of one pass: let go after each)")
    if budget.RELEASES_ROW_TABLES:
        assert got == plan.target_rows * (8 * 864 + FAULT_AROUND_BYTES + 4096) < table
        assert plan.total_bytes == plan_memory(whole, None, BASE).total_bytes - table + got
    else:
        assert got is None and dict(plan.items)[key_whole] == table
    # one embedding shared by both graphs (shared_initializers) that the drafter reads otherwise: neither lets it go
    from edge_spec.bundle import SharedInitializer
    from edge_spec.runtime.budget import released_row_tables

    shared = replace(rows, shared_initializers=(SharedInitializer("embed.weight", "target/embed.data", 0, table,
                                                                  "uint8", (8192, 864)),))
    assert released_row_tables(shared, "speculative") == {} and released_row_tables(shared, "ar") == (
        {"target": ["target/embed.data"]} if budget.RELEASES_ROW_TABLES else {})
    assert dict(plan_memory(shared, None, BASE).items)[key_whole] == table
