"""The memory model (SpecMemo-style): every byte a generation needs, from the manifest -> a plan or a refusal.

Resident bytes of a generation, as we account them:

* process baseline: the Python process with onnxruntime, numpy and the tokenizer loaded
  (measured by the engine right before it plans);
* per model: ``load_bytes`` (what creating the ORT session added, measured at export, after the mapped weights
  it repacked were let go), ``gather_bytes`` (the mapped embedding table, whose pages come back as tokens appear;
  a table in ``row_tables`` is let go after every pass, so one pass's rows count),
  KV ``kv_bytes_per_token x max_context`` (reserved at load; pages resident as passes fill them), logits buffer
  ``rows x vocab x 4`` (rows = the largest pass: max(prefill chunk, gamma + 1));
* sampling scratch: probabilities for the target rows, the drafter's gamma rows and each draft's
  q over target ids, twice (numpy temporaries of the same size live briefly during a transform);
* workspace: the measured peak of one forward pass of k tokens. Passes run one after another,
  so only the largest of them counts, not their sum; plus the attention scores of that pass,
  which grow with context (heads x rows x context x 4 B) and were measured at a 1-token past;
* slack: small Python objects and allocator rounding.

Rejected drafts cost nothing extra: the KV buffers hold ``max_context`` positions and drafts
are written past the cursor and rolled back, so the plan reserves no per-candidate memory.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from edge_spec.bundle import Manifest, ModelSpec
from edge_spec.errors import BudgetError, EdgeSpecError
from edge_spec.runtime.memory import FAULT_AROUND_BYTES, RELEASES_ROW_TABLES

MiB = 1 << 20
PREFILL_CHUNK = 16  # tokens per prefill pass; the export measures workspace for k <= 16
AR_CHUNKS = (16, 8, 4, 2)  # plain AR under a tight budget: smaller prefill passes, smaller buffers
MAX_DRAFT = 8  # default bound on gamma: int4 verify cost grows with k (GUIDE §3)
MIN_CONTEXT = 128  # a plan with fewer usable positions is not worth running
CONTEXT_STEP = 128  # a request-sized context is rounded up to this many positions
SLACK_BYTES = 6 * MiB
MODES = ("speculative", "lookup", "ar")

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_budget(value: str | int | float | None) -> int | None:
    """'600MB', '1.5 GiB', 600_000_000 -> bytes; None -> no budget."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise EdgeSpecError(f"memory_budget={value!r} is not a size; pass bytes (600000000) or a string like '600MB'.")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise EdgeSpecError(f"memory_budget={value!r} must be a positive, finite number of bytes; pass bytes or "
                                "a string like '600MB'.")
        return int(value)
    if not isinstance(value, str):
        raise EdgeSpecError(f"memory_budget={value!r} is not a size; pass bytes (an int) or a string like '600MB'.")
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise EdgeSpecError(f"memory_budget={value!r} is not a size; write it like '600MB', '600MiB' or '1.5GB'.")
    if not match.group(2):  # '600' as text is almost always meant as MB, not 600 bytes: make the unit explicit
        raise EdgeSpecError(f"memory_budget={value!r} has no unit; write {match.group(1)}MB or {match.group(1)}MiB "
                            f"(or {match.group(1)}B if you really mean bytes).")
    size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if size <= 0:
        raise EdgeSpecError(f"memory_budget={value!r} must be positive; write it like '600MB'.")
    return int(size)


def request_context(prompt_tokens: int, max_new_tokens: int) -> int:
    """KV positions one request needs: prompt + max_new_tokens, rounded up to a multiple of :data:`CONTEXT_STEP`.

    The last sampled token is never fed back, and rejected drafts are clipped to the room left
    (speculative.decode), so prompt + max_new_tokens positions always suffice."""
    if prompt_tokens < 0 or max_new_tokens < 1:
        raise EdgeSpecError(f"max_new_tokens={max_new_tokens} must be a positive integer.")
    need = prompt_tokens + max_new_tokens
    return max(MIN_CONTEXT, -(-need // CONTEXT_STEP) * CONTEXT_STEP)


@dataclass(frozen=True)
class Plan:
    """What the engine will allocate, and why each byte is there."""

    budget_bytes: int | None
    mode: str  # "speculative" (drafter model), "lookup" (prompt lookup drafts), "ar" (no drafts)
    max_context: int  # KV positions per model (prompt + generated tokens)
    draft_length: int  # upper bound on gamma (0 in "ar")
    prefill_chunk: int
    target_rows: int  # logits rows of the largest target pass
    drafter_rows: int
    items: tuple[tuple[str, int], ...]  # (what, bytes)
    notes: tuple[str, ...] = field(default=())  # degradations and why
    # RSS while the sessions are created, before the weights they repacked are let go (see load_floor); the plan
    # is only made when the budget covers it too
    load_peak_bytes: int = 0
    # the drafting the caller's mode resolves to: "hybrid" (drafter + lookup), "model", "lookup" or "none" (the
    # rungs above still say what fits); "auto" becomes the bundle's own default (resolve_drafting)
    drafting: str = "hybrid"

    @property
    def total_bytes(self) -> int:
        """Resident bytes while generating: the sum of the items."""
        return sum(b for _, b in self.items)

    @property
    def peak_bytes(self) -> int:
        """The most this plan holds at once: generating, or loading (``load_peak_bytes``)."""
        return max(self.total_bytes, self.load_peak_bytes)

    def describe(self) -> str:
        head = {"speculative": "speculative decoding with the drafter model",
                "lookup": "speculative decoding with prompt-lookup drafts (no drafter model)",
                "ar": "plain autoregressive decoding"}[self.mode]
        budget = "no budget" if self.budget_bytes is None else f"budget {self.budget_bytes / MiB:.1f} MiB"
        lines = [f"Plan: {head}; context {self.max_context} tokens, draft length <= {self.draft_length}; "
                 f"{self.total_bytes / MiB:.1f} MiB planned, {budget}."]
        width = max(len(what) for what, _ in self.items)
        lines += [f"  {what:<{width}}  {b / MiB:9.2f} MiB" for what, b in self.items]
        if self.load_peak_bytes:
            lines.append(f"  loading peaks at {self.load_peak_bytes / MiB:.1f} MiB (the weights being repacked are "
                         "resident until both sessions have run)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def released_row_tables(m: Manifest, mode: str) -> dict[str, list[str]]:
    """role -> the ``row_tables`` its session lets go after every pass (memory.RowTables), for the models ``mode``
    loads: each model's own, on Linux — unless the two graphs share their embedding (``shared_initializers``) and one
    of them reads it otherwise (a tied LM head): then neither lets it go. The plan counts exactly these."""
    specs = {"target": m.target}
    if mode == "speculative" and m.drafter is not None:
        specs["drafter"] = m.drafter
    if not RELEASES_ROW_TABLES:
        return {}
    if m.shared_initializers and not all(f"{r}/embed.data" in s.row_tables for r, s in specs.items()):
        return {}
    return {r: list(s.row_tables) for r, s in specs.items() if s.row_tables}


def _model_items(name: str, spec: ModelSpec, ctx: int, rows: int, released: bool = False) -> list[tuple[str, int]]:
    gather = [(f"{name} embedding table (mapped; pages resident as tokens appear, counted whole)",
               spec.gather_bytes)] if spec.gather_bytes else []
    if spec.gather_bytes and released:  # let go after each pass (memory.RowTables)
        # a row's read maps its group of 8 interleaved rows and the pages the kernel faults in around it
        per_row = 8 * -(-spec.gather_bytes // spec.full_vocab_size) + FAULT_AROUND_BYTES + 4096
        gather = [(f"{name} embedding table (mapped; the rows of one pass: let go after each)",
                   min(spec.gather_bytes, rows * per_row))]
    return [
        (f"{name} weights (session load)", spec.load_bytes), *gather,
        (f"{name} KV cache ({ctx} tokens x {spec.kv_bytes_per_token} B)", ctx * spec.kv_bytes_per_token),
        (f"{name} logits buffer ({rows} x {spec.vocab_size})", spec.logits_bytes(rows)),
    ]


def _layout(m: Manifest, mode: str, gamma: int, chunk: int,
            baseline: int) -> tuple[list[tuple[str, int]], int, int, int]:
    """Fixed items of a plan (everything except KV), bytes of KV per context token, and row counts."""
    t_rows = max(chunk, gamma + 1)
    d_rows = max(chunk, 2)
    items: list[tuple[str, int]] = [("process baseline (python, onnxruntime, tokenizer)", baseline)]
    released = released_row_tables(m, mode)
    items += _model_items("target", m.target, 0, t_rows, "target" in released)
    per_token = m.target.kv_bytes_per_token
    scratch = t_rows * m.target.vocab_size * 4
    work = [m.target.workspace_for(t_rows)]
    if mode == "speculative":
        d = m.drafter
        assert d is not None
        items += _model_items("drafter", d, 0, d_rows, "drafter" in released)
        per_token += d.kv_bytes_per_token
        scratch += gamma * d.vocab_size * 4 + (m.vocab_trim.kept * 4 if m.vocab_trim else 0)
        scratch += gamma * m.target.vocab_size * 4  # q of each draft over target ids (the rejection rule)
        work.append(d.workspace_for(d_rows))
        if d.kind == "eagle3":  # the target's feature history grows with context (float16), the rest is fixed
            per_token += 2 * int(d.feature_dim)
            items.append((f"feature drafter buffers ({t_rows} + {d_rows} rows of features, hidden states)",
                          2 * int(d.feature_dim) * (t_rows + 2 * d_rows) + 4 * d.hidden_size * (2 * d_rows + 1)))
    if mode != "ar" and m.ngrams is not None:  # loaded wherever lookup drafts are made (plain decoding: not at all)
        items.append((f"n-gram draft table ({m.ngrams.entries} entries)", m.ngrams.bytes + m.ngrams.guess_bytes))
    items = [(w, b) for w, b in items if "KV cache" not in w]
    per_token += _attention_per_token(m, mode, t_rows, d_rows)
    items.append(("sampling scratch (probabilities, x2 for temporaries)", 2 * scratch))
    items.append(("largest forward-pass workspace (passes run one at a time)", max(work)))
    items.append(("slack (small Python objects, allocator rounding)", SLACK_BYTES))
    return items, per_token, t_rows, d_rows


def _attention_per_token(m: Manifest, mode: str, t_rows: int, d_rows: int) -> int:
    """Attention scores of the largest pass grow with context: heads x rows x context x 4 B.

    The export measures workspace with a 1-token past, so this part is added per context token
    (the larger of the two models: passes run one at a time)."""
    per = m.target.num_attention_heads * t_rows * 4
    if mode == "speculative":
        per = max(per, m.drafter.num_attention_heads * d_rows * 4)
    return per


def load_floor(m: Manifest, mode: str, baseline: int) -> int:
    """RSS while loading: the target's session is created (its load peak: the mapped weights being repacked are
    all resident), then, speculating, the drafter's next to the settled target and its logits buffer."""
    t = m.target
    floor = baseline + t.load_peak
    if mode == "speculative" and m.drafter is not None:
        floor = max(floor, baseline + t.load_bytes + t.logits_bytes(PREFILL_CHUNK) + m.drafter.load_peak)
    return floor + SLACK_BYTES


def _kv_items(m: Manifest, mode: str, ctx: int, t_rows: int = PREFILL_CHUNK,
              d_rows: int = PREFILL_CHUNK) -> list[tuple[str, int]]:
    out = [(f"target KV cache ({ctx} tokens x {m.target.kv_bytes_per_token} B)", ctx * m.target.kv_bytes_per_token)]
    if mode == "speculative":
        d = m.drafter
        out.append((f"drafter KV cache ({ctx} tokens x {d.kv_bytes_per_token} B)", ctx * d.kv_bytes_per_token))
        if d.kind == "eagle3":
            out.append((f"target feature history ({ctx} tokens x {2 * d.feature_dim} B)", ctx * 2 * d.feature_dim))
    per = _attention_per_token(m, mode, t_rows, d_rows)
    out.append((f"attention scores of the largest pass at full context ({ctx} tokens x {per} B)", ctx * per))
    return out


DRAFTING = ("auto", "hybrid", "model", "lookup", "none")  # what callers may ask for


def resolve_drafting(drafting: str, m: Manifest) -> str:
    """``drafting`` as the engine runs it: "auto" is the bundle's default (the manifest's ``drafting``, which the
    export chose from measurements of the pair; "hybrid" where it names none); the other modes are as given."""
    if drafting not in DRAFTING:
        raise EdgeSpecError(f"drafting={drafting!r} is not one of {', '.join(map(repr, DRAFTING))}.")
    return (m.drafting or "hybrid") if drafting == "auto" else drafting


def plan_memory(m: Manifest, budget: int | None, baseline: int, *, max_context: int | None = None,
                draft_length: int | None = None, drafting: str = "auto") -> Plan:
    """Pick the richest mode, then the largest context and draft length that fit ``budget`` bytes.

    The ladder: drafter model -> prompt-lookup drafts -> plain AR; each step down is noted in the plan.
    ``drafting`` (:data:`DRAFTING`) is the richest mode the caller allows: "hybrid" (the drafter model, and prompt
    lookup where the text repeats), "model", "lookup", "none", or "auto", the bundle's default.
    """
    drafting = resolve_drafting(drafting, m)
    cap = m.target.max_context
    if m.drafter is not None:
        cap = min(cap, m.drafter.max_context)
    if max_context is not None:
        if max_context < 2:
            raise EdgeSpecError(f"max_context={max_context} is too small; ask for at least {MIN_CONTEXT} tokens.")
        cap = min(cap, max_context)
    gmax = MAX_DRAFT if draft_length is None else draft_length
    if not 0 <= gmax < PREFILL_CHUNK:
        raise EdgeSpecError(f"draft_length={draft_length} is out of range; use 1..{PREFILL_CHUNK - 1}.")
    min_ctx = min(MIN_CONTEXT, cap)

    ladder = []
    notes: list[str] = []
    if drafting in ("hybrid", "model"):
        if m.drafter is None:
            notes.append("the bundle has no drafter model, so drafts come from prompt lookup")
        else:
            ladder.append("speculative")
    if drafting != "none":
        ladder.append("lookup")
    ladder.append("ar")

    for mode in ladder:
        # Plain AR is the rung below lookup because it can also shrink its prefill passes (smaller
        # logits, probabilities and workspace); lookup verifies up to a full chunk of drafts.
        steps = [(0, c) for c in AR_CHUNKS] if mode == "ar" else \
            [(g, PREFILL_CHUNK) for g in range(max(gmax, 1), 0, -1)]
        floor = load_floor(m, mode, baseline)
        if budget is not None and budget < floor:
            steps = []  # cannot even load this rung's sessions
        for gamma, chunk in steps:
            items, per_token, t_rows, d_rows = _layout(m, mode, gamma, chunk, baseline)
            fixed = sum(b for _, b in items)
            ctx = cap if budget is None else min(cap, (budget - fixed) // per_token if budget > fixed else 0)
            if ctx >= min_ctx:
                if mode == "ar" and chunk < PREFILL_CHUNK:
                    notes.append(f"prompts are prefilled {chunk} tokens per pass to fit the budget")
                return Plan(budget_bytes=budget, mode=mode, max_context=int(ctx), draft_length=gamma,
                            prefill_chunk=chunk, target_rows=t_rows,
                            drafter_rows=d_rows if mode == "speculative" else 0,
                            items=tuple(items[:2] + _kv_items(m, mode, int(ctx), t_rows, d_rows) + items[2:]),
                            notes=tuple(notes), load_peak_bytes=floor, drafting=drafting)
        if mode == "speculative":
            notes.append("the drafter model does not fit the budget with a useful context, so drafts come "
                         "from prompt lookup (no model memory)")
        elif mode == "lookup":
            notes.append(f"prompt-lookup verification buffers ({PREFILL_CHUNK}-token passes) do not fit, so "
                         "decoding is plain autoregressive")

    items, per_token, _, _ = _layout(m, "ar", 0, AR_CHUNKS[-1], baseline)
    need = max(sum(b for _, b in items) + min_ctx * per_token, load_floor(m, "ar", baseline))
    parts = ", ".join(f"{b / MiB:.1f} MiB {w.split(' (')[0]}" for w, b in
                      items[:2] + _kv_items(m, "ar", min_ctx, AR_CHUNKS[-1]) + items[2:] if b)
    raise BudgetError(f"A memory budget of {budget / MiB:.1f} MiB cannot run this bundle: the smallest plan "
                      f"(target only, {min_ctx}-token context) needs {need / MiB:.1f} MiB ({parts}); "
                      f"raise memory_budget to at least {math.ceil(need / MiB)} MiB ({math.ceil(need / 1e6)} MB).")
