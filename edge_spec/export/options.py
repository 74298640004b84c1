"""What ``edge-spec export`` can be asked: weight precision (:class:`Quant`), the options of one export
(:class:`ExportOptions`) and the defaults behind them, with why. The pipeline and the builders it drives read these;
nothing here reads them back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edge_spec.errors import ExportError
from edge_spec.export import vocab_trim

DEFAULT_MAX_CONTEXT_CAP = 4096  # default max_context = min(checkpoint's positions, this)


@dataclass(frozen=True)
class Quant:
    """Weight precision and, for int4/int8, the MatMulNBits accuracy_level (see docs/export.md)."""

    precision: str
    accuracy_level: int | None = None

    @classmethod
    def parse(cls, text: str, role: str) -> Quant:
        """'int4', 'int4:1' (precision:accuracy_level), 'fp32', ..."""
        prec, _, level = text.partition(":")
        if prec not in ("int4", "int8", "fp16", "fp32"):
            raise ExportError(f"Unknown {role} quantization '{text}'; use int4, int8, fp16 or fp32, optionally "
                              "with ':ACCURACY_LEVEL' such as int4:4.")
        if not level:  # the accuracy level of the source's default (see default_level)
            return cls(prec, None)
        if prec not in ("int4", "int8") or level not in ("0", "1", "2", "3", "4"):
            raise ExportError(f"Bad {role} quantization '{text}': an accuracy level (0-4) applies only to int4 "
                              "and int8, e.g. int4:1.")
        return cls(prec, int(level))


# Why these defaults: docs/export.md. A Hugging Face target goes through the builder, which re-quantizes it:
# there the target keeps fp32 activations (level 1), whose k-token verify pass agrees with its 1-token steps.
# A GGUF target keeps the file's own weights, and at level 4 (int8 activations, as llama.cpp computes) it is
# ~2x faster and agrees with fp32 transformers on the file at least as often as llama.cpp on the same file
# (benchmarks/fidelity.py); its verify passes are batch-invariant from 2 rows, so greedy speculative decoding
# still equals greedy plain decoding. The drafter only proposes, so it takes the fastest kernels.
DEFAULT_ACCURACY = {"target": 1, "drafter": 4}
GGUF_TARGET_ACCURACY = 4
DEFAULT_QUANT = {"target": "int4", "drafter": "int4"}
# An EAGLE-3 head is small (~9M weights, a tenth of the demo target's) and was trained in float: int4 rounding costs
# it a tenth of its accepted drafts (demo, chat prompts, greedy: 0.40 -> 0.36), int8 nothing measurable, for 4.75 MB
# more (BENCHMARKS.md, "The head's precision, measured again"). A distilled layer drafter keeps int4.
EAGLE_DEFAULT_QUANT = "int8"
# KV cache of the graphs edge-spec builds itself (GGUF targets, distilled drafters, EAGLE-3 heads): fp16, as
# llama.cpp's default, half the bytes of fp32 (docs/export.md, "KV cache precision"). Builder graphs keep fp32.
OWN_KV_DTYPE = "float16"


def default_level(role: str, ckpt: object) -> int:
    """The MatMulNBits accuracy level of ``role`` when the user gave none: see DEFAULT_ACCURACY above."""
    if role == "target" and getattr(ckpt, "kind", None) == "gguf":  # own_build.Source of a GGUF file
        return GGUF_TARGET_ACCURACY
    return DEFAULT_ACCURACY[role]


def own_kv_dtype(opts: ExportOptions) -> str:
    """The KV dtype of a graph our own builder makes: the option, or OWN_KV_DTYPE for "auto"."""
    return OWN_KV_DTYPE if opts.kv_dtype == "auto" else opts.kv_dtype


@dataclass(frozen=True)
class ExportOptions:
    # accuracy level None: the source's default (default_level): GGUF target 4, Hugging Face target 1, drafter 4
    target_quant: Quant = field(default_factory=lambda: Quant("int4"))
    drafter_quant: Quant | None = None  # None: the drafter's default: int8 for a head, else int4
    trim_vocab: int | str | None = "auto"  # K, "auto", or None (off)
    trim_share: float = vocab_trim.DEFAULT_SHARE
    calibration: Path | None = None  # prompts file; None = calibrate.DEFAULT_PROMPTS
    max_context: int | None = None
    execution_provider: str = "cpu"
    block_size: int = 32
    force: bool = False
    trust_remote_code: bool = False
    measure_memory: bool = True
    lm_head: str | None = None  # HF builder path: "int8" or "fp32" keeps the LM head above the body precision
    # auto | kquant | split | exact | fast | compact: how GGUF tensors are encoded (own_build.Policy); auto = kquant
    # where edge-spec's K-quant kernels run (edge_spec/kernels.py), else split
    gguf_mode: str = "auto"
    # KV cache of graphs edge-spec builds: "auto" (= OWN_KV_DTYPE, float16), float16 or float32; builder graphs: fp32
    kv_dtype: str = "auto"
    ngrams: tuple[Path, ...] = ()  # answers files of edge-spec distill: build a static n-gram draft table from them
    default_drafting: str | None = None  # the manifest's ``drafting``: what drafting="auto" runs (None: hybrid)
