"""Typed user configuration (frozen dataclasses) and the result/stat types the engine returns."""

from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from edge_spec.errors import EdgeSpecError
from edge_spec.runtime.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from edge_spec.runtime.sampling import SamplingConfig, draft_sampling

if TYPE_CHECKING:
    from edge_spec.runtime.speculative import Step


def is_whole(x: object) -> bool:
    """An int (numpy ints too), not a bool and not a float that happens to be whole."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


DEFAULT_CONFIDENCE = 0.3  # Kangaroo: stop drafting when the drafter's top probability falls below this


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings (not included in the text)
    stop_token_ids: tuple[int, ...] | None = None  # None = the bundle's stop tokens; () = none
    # llama-server's stops for code completion (runtime/stops.py): lines after the first need this much indentation
    # (0 = off), and after this many ms a line break ends the generation (0 = off)
    n_indent: int = 0
    t_max_predict_ms: float = 0
    speculative: bool = True
    draft_length: int | None = None  # None = adaptive (bounded by the plan); int = fixed gamma
    confidence_threshold: float | None = None  # None = 0.3 when adaptive, off with a fixed draft_length
    # sampled drafts' temperature: None = DRAFT_TEMPERATURE_RATIO (0.7) x temperature; 0 = the drafter's argmax.
    # Output is exact for any value; it only changes how often drafts are accepted.
    draft_temperature: float | None = None
    # None: off (nothing computed). k in 0..20: each token's log-probability and its k likeliest alternatives, from
    # the distribution it was drawn from (runtime/logprobs.py), on StreamEvent.logprobs / Result.logprobs
    logprobs: int | None = None

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise EdgeSpecError(f"stop={self.stop!r} must be a string or a list of strings.")
        object.__setattr__(self, "stop", tuple(stop))
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            if not isinstance(ids, (list, tuple)) or not all(is_whole(t) for t in ids):
                raise EdgeSpecError(f"stop_token_ids={self.stop_token_ids!r} must be whole numbers (token ids).")
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.seed is not None and (not is_whole(self.seed) or self.seed < 0):
            raise EdgeSpecError(f"seed={self.seed!r} must be a whole number >= 0 (or None for a fresh one).")
        if not is_whole(self.max_new_tokens) or self.max_new_tokens < 1:
            raise EdgeSpecError(f"max_new_tokens={self.max_new_tokens!r} must be a positive integer.")
        if self.draft_length is not None and (not is_whole(self.draft_length) or self.draft_length < 0):
            raise EdgeSpecError(f"draft_length={self.draft_length!r} must be None (adaptive) or an integer >= 0.")
        if not is_whole(self.n_indent) or self.n_indent < 0:
            raise EdgeSpecError(f"n_indent={self.n_indent!r} must be a whole number >= 0 (spaces or tabs a line "
                                "after the first needs; 0 = off).")
        t = self.t_max_predict_ms
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < math.inf:
            raise EdgeSpecError(f"t_max_predict_ms={t!r} must be a number of milliseconds >= 0 (0 = off).")
        if any(not s for s in self.stop):
            raise EdgeSpecError("stop strings must be non-empty.")
        if not isinstance(self.speculative, bool):
            raise EdgeSpecError(f"speculative={self.speculative!r} must be True or False.")
        c = self.confidence_threshold
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= 1):
            raise EdgeSpecError(f"confidence_threshold={c!r} must be None or a number in [0, 1].")
        lp = self.logprobs
        if lp is not None and (not is_whole(lp) or not 0 <= lp <= MAX_TOP_LOGPROBS):
            raise EdgeSpecError(f"logprobs={lp!r} must be None (off) or a whole number of alternatives in "
                                f"[0, {MAX_TOP_LOGPROBS}].")
        _ = self.sampling  # validates temperature / top_k / top_p / min_p
        dt = self.draft_temperature
        if dt is not None and (isinstance(dt, bool) or not isinstance(dt, (int, float)) or not 0 <= dt < math.inf):
            raise EdgeSpecError(f"draft_temperature={dt!r} must be None (0.7 x temperature) or a finite number >= 0.")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p, self.min_p)  # checks types: no float('hot')

    @property
    def draft_sampling(self) -> SamplingConfig:
        """How sampled drafts are drawn: the target's filters at ``draft_temperature``."""
        return draft_sampling(self.sampling, self.draft_temperature)

    @property
    def threshold(self) -> float:
        if self.confidence_threshold is not None:
            return self.confidence_threshold
        return 0.0 if self.draft_length is not None else DEFAULT_CONFIDENCE

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> GenerationConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EdgeSpecError(f"Unknown generation option '{unknown[0]}'; valid options: {', '.join(sorted(known))}.")
        return cls(**data)

    @classmethod
    def merged(cls, config: GenerationConfig | dict[str, Any] | None, **overrides: Any) -> GenerationConfig:
        """``config`` (a GenerationConfig, a dict of its options, or None: the defaults) with every override that
        is not None put over it: how ``Engine.generate(prompt, config, temperature=...)`` reads its arguments."""
        if config is None:
            base: dict[str, Any] = {}
        elif isinstance(config, GenerationConfig):
            base = {f: getattr(config, f) for f in config.__dataclass_fields__}
        elif isinstance(config, dict):
            cls.from_mapping(config)  # rejects unknown keys with a clear sentence
            base = dict(config)
        else:
            raise EdgeSpecError(f"config must be a GenerationConfig or a dict, not {type(config).__name__}.")
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(base)


@dataclass(frozen=True)
class LoadConfig:
    memory_budget: int | None = None  # bytes
    device: str = "cpu"
    drafter_device: str | None = None  # None = same as device
    strict: bool = False  # unavailable device -> error instead of CPU fallback
    max_context: int | None = None
    draft_length: int | None = None  # upper bound on gamma for the plan
    drafting: str = "auto"  # "auto" (the bundle's default) | "hybrid" (drafter + lookup) | "model" | "lookup" | "none"
    threads: int = 0  # the target's ONNX Runtime threads (0 = all physical cores)
    spin: bool | None = None  # ORT pool threads busy-wait between kernels; None = when the target has > 1 thread
    drafter_threads: int | None = None  # None = 1 (see runtime/options.py, "Threads")


@dataclass(frozen=True)
class StreamEvent:
    text: str  # newly final text (may be empty while a UTF-8 character or stop string is pending)
    token_ids: tuple[int, ...]
    from_drafter: tuple[bool, ...]  # per token: proposed by the drafter and accepted
    finish_reason: str | None = None  # set on the last event
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id when GenerationConfig.logprobs is set


@dataclass
class Stats:
    """Counters for one generation, or accumulated over an engine's life."""

    tokens: int = 0  # generated tokens
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV was kept from the previous call
    target_passes: int = 0  # decode-loop target passes (verify steps)
    drafted: int = 0  # all drafts (drafter model and prompt lookup)
    accepted: int = 0
    lookup_drafted: int = 0  # of which prompt-lookup drafts (hybrid drafting, or the lookup rung)
    lookup_accepted: int = 0
    table_drafted: int = 0  # of the lookup drafts, those from the bundle's n-gram table (no repeat in the context)
    table_accepted: int = 0
    guess_drafted: int = 0  # of the lookup drafts, the guesses in a 1-token step's second row
    guess_accepted: int = 0
    seconds: float = 0.0  # wall time of the generation(s)
    target_seconds: float = 0.0  # inside ONNX Runtime, target (incl. prefill)
    drafter_seconds: float = 0.0
    gamma_hist: Counter = field(default_factory=Counter)  # drafted length per step -> steps

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target pass (accepted drafts + the target's own token)."""
        return self.tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def overhead_share(self) -> float:
        """Share of wall time spent outside ONNX Runtime (Python loop, sampling, detokenizing)."""
        if not self.seconds:
            return 0.0
        return max(0.0, 1.0 - (self.target_seconds + self.drafter_seconds) / self.seconds)

    def count(self, step: Step) -> None:
        """Add one decode step (``speculative.Step``): its committed tokens, its target pass, its drafts by source."""
        self.tokens += len(step.tokens)
        self.target_passes += 1 if step.tokens else 0
        self.drafted += step.gamma
        self.accepted += step.accepted
        if step.lookup:
            self.lookup_drafted += step.gamma
            self.lookup_accepted += step.accepted
        if step.table:
            self.table_drafted += step.gamma
            self.table_accepted += step.accepted
        if step.guess:
            self.guess_drafted += step.gamma
            self.guess_accepted += step.accepted
        self.gamma_hist[step.gamma] += 1

    def add(self, other: Stats) -> None:
        for f in fields(self):
            if f.name == "gamma_hist":
                self.gamma_hist.update(other.gamma_hist)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gamma_hist"] = dict(sorted(self.gamma_hist.items()))
        for name in ("acceptance_rate", "mean_accepted_length", "tokens_per_second", "overhead_share"):
            d[name] = getattr(self, name)
        return d


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop_token", "stop_string", "length", "context_full", "indent", "time_limit"
    stats: Stats
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id when GenerationConfig.logprobs is set
