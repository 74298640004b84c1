"""The public API: ``Engine.load(bundle, memory_budget=...)`` then ``generate`` / ``stream`` / ``chat`` / ``infill``."""

from __future__ import annotations

import dataclasses
import os
import random
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edge_spec.bundle import Manifest
from edge_spec.demo import resolve_bundle
from edge_spec.errors import BundleError, EdgeSpecError
from edge_spec.runtime import chat as chat_mod
from edge_spec.runtime import fim as fim_mod
from edge_spec.runtime.budget import Plan, parse_budget, released_row_tables
from edge_spec.runtime.config import GenerationConfig, LoadConfig, Result, Stats, StreamEvent, is_whole
from edge_spec.runtime.detok import StreamDetokenizer, byte_table
from edge_spec.runtime.drafting import DraftPolicy
from edge_spec.runtime.memory import RowTables, drop_mapped_pages
from edge_spec.runtime.ngrams import NgramTable
from edge_spec.runtime.options import thread_plan
from edge_spec.runtime.prepare import Prompt, load_id_map, prepare
from edge_spec.runtime.providers import MIN_ROWS, resolve
from edge_spec.runtime.sampling import Noise, Rejection
from edge_spec.runtime.session import ModelSession, shared_initializers
from edge_spec.runtime.speculative import Decoder, decode
from edge_spec.runtime.stops import TextStops

__all__ = ["Engine", "GenerationConfig", "Result", "StreamEvent", "Stats", "Plan"]


class Engine:
    """A loaded bundle: target (+ drafter) sessions with preallocated KV, a memory plan, a tokenizer."""

    def __init__(self, manifest: Manifest, tokenizer: Tokenizer, plan: Plan, target: Any, drafter: Any | None,
                 id_map: np.ndarray | None, config: LoadConfig, devices: dict[str, str],
                 table: NgramTable | None = None) -> None:
        self.manifest, self.tokenizer, self.plan, self.config, self.devices = manifest, tokenizer, plan, config, devices
        self.target, self.drafter = target, drafter
        # hybrid drafting with a drafter: lookup drafts first when the context repeats itself
        self._hybrid = drafter is not None and plan.drafting == "hybrid"
        self._dec = Decoder(target, drafter, lookup=plan.mode == "lookup" or self._hybrid, id_map=id_map,
                            max_gamma=plan.draft_length, table=table)
        self._policy = DraftPolicy(plan.draft_length, free_drafts=drafter is None)
        # guesses in a 1-token step's second row: judged on their goodput where that row is not paid for anyway
        self._guesser = None if getattr(target, "guess_free", True) else DraftPolicy(1, free_drafts=True)
        self._lookup_policy = DraftPolicy(plan.draft_length, free_drafts=True) if self._hybrid else None
        self.stats = Stats()
        self.last_stats = Stats()
        self._owner: object | None = None
        self._bytes = byte_table(tokenizer)  # token id -> bytes for O(1) streaming detokenization
        self.bundle_dir: Path | None = None  # the bundle directory load() read (None: sessions handed in directly)
        self.fim = fim_mod.fim_tokens(manifest, tokenizer)  # fill-in-the-middle tokens (None: the model has none)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, bundle: str | os.PathLike[str], memory_budget: str | int | None = None, device: str = "cpu",
             drafter_device: str | None = None, strict: bool = False, *, max_context: int | None = None,
             draft_length: int | None = None, drafting: str = "auto", threads: int = 0, spin: bool | None = None,
             drafter_threads: int | None = None, prompt: Prompt | None = None,
             max_new_tokens: int | None = None) -> Engine:
        """Read the bundle, plan memory for ``memory_budget`` and create the sessions the plan asks for.

        ``bundle`` is a bundle directory, or ``"demo"`` for the demo pair (exported into the user
        cache on first use, which needs the export extras).

        Context: ``max_context`` when given; else, with ``max_new_tokens``, what that request needs
        (the tokens of ``prompt`` — text, token ids or chat messages — plus ``max_new_tokens``, rounded
        up to :data:`CONTEXT_STEP`), so a short request does not preallocate KV for the bundle's whole
        context; else the bundle's context (what fits the budget).

        Threads: ``threads`` for the target (0 = all physical cores), ``drafter_threads`` for the drafter (None =
        1); ``spin`` lets pool threads busy-wait between kernels (None = when the target has more than one
        thread). Why these defaults: runtime/options.py, "Threads"."""
        config = LoadConfig(parse_budget(memory_budget), device, drafter_device, strict, max_context,
                            draft_length, drafting, threads, spin, drafter_threads)
        (t_threads, t_spin), (d_threads, d_spin) = thread_plan(threads, spin, drafter_threads)
        root = resolve_bundle(bundle)  # "demo": the demo bundle, exported on first use
        t_device = resolve(device, strict, "target")  # e.g. "webgpu", "openvino:NPU" (runtime/providers.py)
        d_device = resolve(drafter_device or device, strict, "drafter")
        t_dev, d_dev = t_device.name, d_device.name
        manifest, tokenizer, plan = prepare(root, config, prompt, max_new_tokens)
        # One pass-shape rule for every mode (plain, speculative, no drafter): a graph that pads itself needs none
        # (batch_invariant_rows 1); older bundles (2) and some devices (MIN_ROWS) pad here, in every mode alike,
        # so that greedy speculative output equals what the bundle writes with no drafter loaded.
        min_rows = max(manifest.target.batch_invariant_rows or 1, MIN_ROWS.get(t_device.kind, 1))
        # One mapping of the weights both graphs read (the embedding), given to both sessions. Always, as at
        # export, where the target's load_bytes are measured with it and the drafter's beside the target.
        shared = shared_initializers(root, manifest) if t_dev == "cpu" and d_dev == "cpu" else {}
        # an EAGLE-3 drafter reads the target's features: only then does the target write them (into a history
        # buffer the plan counts); otherwise the graph's feature output stays unbound and costs nothing
        features = plan.mode == "speculative" and manifest.drafter is not None and manifest.drafter.kind == "eagle3"
        target = ModelSession(root / manifest.target.graph, manifest.target, device=t_device,
                              capacity=plan.max_context, max_rows=plan.target_rows, threads=t_threads,
                              min_rows=min_rows, initializers=shared, spin=t_spin, features=features)
        # The target is built and has run a pass: the weights it repacked need not stay resident (before the drafter
        # loads, so the two loads' transients do not add up); again after the drafter.
        drop_mapped_pages(root)
        drafter = id_map = None
        if plan.mode == "speculative":
            assert manifest.drafter is not None
            drafter = ModelSession(root / manifest.drafter.graph, manifest.drafter, device=d_device,
                                   capacity=plan.max_context, max_rows=plan.drafter_rows,
                                   threads=d_threads, initializers=shared, spin=d_spin)
            if manifest.vocab_trim is not None:
                id_map = load_id_map(root, manifest)
            elif manifest.drafter.vocab_size != manifest.target.vocab_size:
                raise BundleError("The drafter's vocabulary differs from the target's but the manifest has no "
                                  "vocab_trim id map; re-export the bundle.")
        if drafter is not None:
            drop_mapped_pages(root)
        for role, tables in released_row_tables(manifest, plan.mode).items():  # what the plan counted
            session = target if role == "target" else drafter
            if session is not None:
                session.row_tables = RowTables([root / f for f in tables])
        devices = {"target": t_dev, "drafter": d_dev if drafter is not None else "none"}
        table = None  # the n-gram table drafts wherever lookup drafts are made: the lookup rung, hybrid drafting
        if manifest.ngrams is not None and (plan.mode == "lookup" or plan.mode == "speculative"
                                            and plan.drafting == "hybrid"):
            n = manifest.ngrams
            table = NgramTable.load(root / n.file, n.min_n, n.max_n, manifest.target.vocab_size)
        engine = cls(manifest, tokenizer, plan, target, drafter, id_map, config, devices, table)
        engine.bundle_dir = root
        return engine

    @staticmethod
    def plan(bundle: str | os.PathLike[str], memory_budget: str | int | None = None, *,
             max_context: int | None = None, draft_length: int | None = None, drafting: str = "auto",
             prompt: Prompt | None = None, max_new_tokens: int | None = None) -> Plan:
        """The memory plan :meth:`load` would make for these arguments, without creating any session.

        Same steps as ``load`` up to planning (manifest, tokenizer and its warm-up, the process
        baseline measured at the same point), so ``edge-spec inspect --memory-budget`` and a real
        load agree."""
        config = LoadConfig(parse_budget(memory_budget), max_context=max_context, draft_length=draft_length,
                            drafting=drafting)
        return prepare(resolve_bundle(bundle), config, prompt, max_new_tokens)[2]

    # ------------------------------------------------------------------ public calls
    def generate(self, prompt: str | Sequence[int], config: GenerationConfig | dict[str, Any] | None = None, *,
                 max_new_tokens: int | None = None, temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None, seed: int | None = None,
                 stop: Sequence[str] | None = None,
                 speculative: bool | None = None, draft_length: int | None = None,
                 logprobs: int | None = None) -> Result:
        """Generate a completion of ``prompt`` (text, or token ids used as-is). ``logprobs`` (0..20; None: off): each
        token's log-probability and that many alternatives on ``Result.logprobs`` (runtime/logprobs.py)."""
        cfg = GenerationConfig.merged(config, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                      top_p=top_p, min_p=min_p, seed=seed, stop=stop, speculative=speculative,
                                      draft_length=draft_length, logprobs=logprobs)
        return self._collect(self._run(self._encode(prompt), cfg))

    def stream(self, prompt: str | Sequence[int], config: GenerationConfig | dict[str, Any] | None = None, *,
               max_new_tokens: int | None = None, temperature: float | None = None, top_k: int | None = None,
               top_p: float | None = None, min_p: float | None = None, seed: int | None = None,
               stop: Sequence[str] | None = None,
               speculative: bool | None = None, draft_length: int | None = None,
               logprobs: int | None = None) -> Iterator[StreamEvent]:
        """Like :meth:`generate`, yielding a :class:`StreamEvent` per decode step (with ``logprobs``: each event's
        ``logprobs``, one per token id). Breaking out is safe."""
        cfg = GenerationConfig.merged(config, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                      top_p=top_p, min_p=min_p, seed=seed, stop=stop, speculative=speculative,
                                      draft_length=draft_length, logprobs=logprobs)
        return self._run(self._encode(prompt), cfg)

    def chat(self, messages: Sequence[dict[str, Any]], config: GenerationConfig | dict[str, Any] | None = None, *,
             stream: bool = False, max_new_tokens: int | None = None, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
             seed: int | None = None,
             stop: Sequence[str] | None = None, speculative: bool | None = None,
             draft_length: int | None = None, logprobs: int | None = None,
             tools: Sequence[dict[str, Any]] | None = None, reply_prefix: str = "") -> Result | Iterator[StreamEvent]:
        """Render ``messages`` with the model's chat template (flattened at export) and answer as the assistant.

        The prompt ids are what ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``
        gives. KV is reused across turns: only tokens after the longest common prefix of those ids
        and the tokens the engine holds (last prompt + reply) are prefilled. A reply that fills the
        context ends with finish_reason "context_full" (no warning: :meth:`fit_chat` makes room).

        ``tools``, tool results and assistant ``tool_calls`` render the model's Jinja template as
        ``apply_chat_template(tools=...)`` (runtime/template.py); read calls with ``tool_calls.parse_tool_calls``.
        ``reply_prefix``: text the reply starts with (not in the returned text). ``logprobs``: see :meth:`generate`."""
        cfg = GenerationConfig.merged(config, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                      top_p=top_p, min_p=min_p, seed=seed, stop=stop, speculative=speculative,
                                      draft_length=draft_length, logprobs=logprobs)
        ids = self.encode_chat(messages, tools=tools, reply_prefix=reply_prefix)
        events = self._run(self._encode(ids), cfg, warn_full=False)
        return events if stream else self._collect(events)

    def infill(self, prefix: str, suffix: str, extra: Sequence[fim_mod.ExtraFile | dict[str, str]] = (),
               config: GenerationConfig | dict[str, Any] | None = None, *, prompt: str = "", stream: bool = False,
               max_new_tokens: int | None = None, temperature: float | None = None, top_k: int | None = None,
               top_p: float | None = None, min_p: float | None = None, seed: int | None = None,
               stop: Sequence[str] | None = None, speculative: bool | None = None,
               draft_length: int | None = None, logprobs: int | None = None, n_indent: int | None = None,
               t_max_predict_ms: float | None = None) -> Result | Iterator[StreamEvent]:
        """Write what goes between ``prefix`` and ``suffix`` (the text around an editor's cursor) after llama-server's
        /infill prompt (``runtime/fim.py``); ``extra``: other files, ``{"filename", "text"}`` dicts; ``prompt``: text
        the middle starts with. Options as :meth:`generate`; ``stream=True`` yields StreamEvents. llama-server's
        stops for editors (``runtime/stops.py``): ``n_indent`` (the cursor line's indentation: a later line with less
        ends the middle, cut after its indentation; finish_reason "indent") and ``t_max_predict_ms`` (after that
        long, the next line break ends it; "time_limit")."""
        cfg = GenerationConfig.merged(config, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                      top_p=top_p, min_p=min_p, seed=seed, stop=stop, speculative=speculative,
                                      draft_length=draft_length, logprobs=logprobs, n_indent=n_indent,
                                      t_max_predict_ms=t_max_predict_ms)
        ids = fim_mod.engine_ids(self.tokenizer, self.fim, prefix, suffix, extra, prompt, self._dec.capacity,
                                 cfg.max_new_tokens)
        if cfg.stop_token_ids is None:  # llama.cpp ends an infill on the FIM pad / repo / file-separator tokens too
            cfg = dataclasses.replace(cfg, stop_token_ids=fim_mod.stop_ids(self.fim, self.manifest.tokenizer))
        events = self._run(self._encode(ids), cfg)
        return events if stream else self._collect(events)

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The text of the conversation as the model's chat template renders it."""
        return chat_mod.render_any(self.manifest, messages, tools, add_generation_prompt)

    def encode_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None, reply_prefix: str = "") -> list[int]:
        """Token ids of the conversation, equal to ``apply_chat_template(messages, tools=tools, tokenize=True, ...)``
        (then ``reply_prefix`` encoded with it)."""
        return chat_mod.encode_any(self.tokenizer, self.manifest, messages, tools, add_generation_prompt,
                                   reply_prefix)

    def fit_chat(self, messages: Sequence[dict[str, Any]], reserve: int, tools: Sequence[dict[str, Any]] | None = None,
                 reply_prefix: str = "") -> tuple[list[dict[str, Any]], int]:
        """Drop the oldest turns (never the system prompt) so the prompt leaves ``reserve`` tokens for the reply.

        Returns (kept messages, number of messages dropped). When turns must go, the prompt is cut
        to half the context, so the following turns fit without another drop; KV is reused for the
        system prompt that stays (positions after it change, so the rest is prefilled again)."""
        cap = self._dec.capacity
        reserve = max(0, min(reserve, cap // 2))
        return chat_mod.fit_chat(messages, lambda m: len(self.encode_chat(m, tools=tools, reply_prefix=reply_prefix)),
                                 cap - reserve, cap // 2)

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes a token id stands for (b"" for special tokens such as end-of-turn)."""
        return self._bytes[token] if self._bytes is not None else self.tokenizer.decode([token]).encode()

    @property
    def supports_tools(self) -> bool:
        """The chat template renders tools in the ``<tool_call>`` syntax and the export verified it."""
        return self.manifest.tokenizer.chat is not None and self.manifest.tokenizer.chat.tools_verified > 0

    def reset(self) -> None:
        """Forget the conversation (KV cursors to 0). Learned step costs are kept."""
        self._owner = None
        self._dec.n = 0
        self._dec.sync_kv(0)

    @property
    def context(self) -> list[int]:
        """The committed tokens (prompt + output) the KV caches hold."""
        return [int(t) for t in self._dec.tok[:self._dec.n]]

    # ------------------------------------------------------------------ internals
    def _encode(self, prompt: str | Sequence[int]) -> np.ndarray:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt).ids
        elif isinstance(prompt, np.ndarray) and prompt.dtype.kind in "iu" and prompt.ndim == 1:
            ids = prompt.tolist()
        elif isinstance(prompt, (list, tuple)) and all(is_whole(t) for t in prompt):
            ids = [int(t) for t in prompt]
        else:  # 1.5 or 'a' as a token id is a bug in the caller: say so rather than truncate or crash
            raise EdgeSpecError(f"The prompt must be text or a list of int token ids, not {_preview(prompt)}.")
        if not ids:
            raise EdgeSpecError("The prompt is empty; pass some text.")
        if len(ids) > self._dec.capacity:
            raise EdgeSpecError(f"The prompt is {len(ids)} tokens but the plan's context holds "
                                f"{self._dec.capacity}; shorten it or raise memory_budget / max_context.")
        vocab = self.manifest.target.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise EdgeSpecError(f"Prompt token ids must lie in [0, {vocab}).")
        return np.asarray(ids, dtype=np.int64)

    def _run(self, ids: np.ndarray, cfg: GenerationConfig, warn_full: bool = True) -> Iterator[StreamEvent]:
        owner = object()
        self._owner = owner
        dec, t, d = self._dec, self.target, self.drafter
        st = Stats(prompt_tokens=len(ids))
        t_run0, d_run0 = t.run_seconds, (d.run_seconds if d is not None else 0.0)
        start = time.perf_counter()
        st.reused_tokens = dec.set_context(ids)
        stop_ids = frozenset(self.manifest.tokenizer.stop_token_ids if cfg.stop_token_ids is None
                             else cfg.stop_token_ids)
        speculate = cfg.speculative and self.plan.mode != "ar" and cfg.draft_length != 0
        policy = lookup_policy = None
        if speculate:
            policy = self._policy if cfg.draft_length is None else \
                DraftPolicy(self.plan.draft_length, fixed=cfg.draft_length, free_drafts=d is None)
            if self._hybrid:
                lookup_policy = self._lookup_policy if cfg.draft_length is None else \
                    DraftPolicy(self.plan.draft_length, fixed=cfg.draft_length, free_drafts=True)
        # A seed asks for reproducible text: the coupling makes it f(seed, prompt, settings) whatever the
        # draft lengths. Without one, the rejection rule accepts more drafts (1 - TV vs (1 - TV)/(1 + TV)).
        noise: Noise | Rejection = Rejection(random.Random()) if cfg.seed is None else \
            Noise(cfg.seed, self.manifest.target.vocab_size)
        ends = TextStops(StreamDetokenizer(self.tokenizer, table=self._bytes), cfg.stop, cfg.n_indent,
                         cfg.t_max_predict_ms)
        try:
            for step in decode(dec, cfg.sampling, policy, noise, cfg.max_new_tokens, stop_ids, cfg.threshold,
                               lookup_policy, cfg.draft_sampling, cfg.logprobs, self._guesser):
                if self._owner is not owner:
                    raise EdgeSpecError("This stream was superseded by a newer call on the same engine; "
                                        "finish or close a stream before starting another.")
                kept, finish = ends.feed(step.tokens, step.finish)  # token by token, as plain decoding meets them
                if kept < len(step.tokens):  # it ends inside a speculative step: its later tokens were never written
                    dec.n -= len(step.tokens) - kept
                    step = dataclasses.replace(step, tokens=step.tokens[:kept], from_drafter=step.from_drafter[:kept],
                                               accepted=min(step.accepted, kept),
                                               logprobs=None if step.logprobs is None else step.logprobs[:kept])
                st.count(step)
                if finish == "context_full" and warn_full:
                    warnings.warn(f"Generation stopped because the context is full ({dec.capacity} tokens, the "
                                  "plan's max_context); call reset() or load with a larger memory_budget or "
                                  "max_context.", RuntimeWarning, stacklevel=2)
                yield StreamEvent(ends.take(final=finish is not None), tuple(step.tokens), tuple(step.from_drafter),
                                  finish, tuple(step.logprobs or ()))
                if finish is not None:
                    return
        finally:
            dec.sync_kv()
            st.seconds = time.perf_counter() - start
            st.target_seconds = t.run_seconds - t_run0
            st.drafter_seconds = (d.run_seconds - d_run0) if d is not None else 0.0
            self.last_stats = st
            self.stats.add(st)
            if self._owner is owner:
                self._owner = None

    def _collect(self, events: Iterator[StreamEvent]) -> Result:
        texts, ids, lps, finish = [], [], [], "length"
        for ev in events:
            texts.append(ev.text)
            ids.extend(ev.token_ids)
            lps.extend(ev.logprobs)
            finish = ev.finish_reason or finish
        return Result("".join(texts), tuple(ids), finish, self.last_stats, tuple(lps))  # stats: set at the end

    def describe(self) -> str:
        return self.plan.describe() + f"\n  devices: target={self.devices['target']}, drafter={self.devices['drafter']}"


def _preview(x: object) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
