"""The bundle manifest (``edge_spec.json``): one typed, versioned description of a bundle, and writing it.

Everything the runtime's memory planner needs is in the manifest; the runtime never
opens the graphs to learn sizes. The schema is documented in ``docs/manifest.md`` —
keep that file true to this module. Reading a manifest back, checked field by field, is
``read.py``'s. Only the standard library is imported here, so both the lean runtime and
the exporter can use it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "edge_spec.json"
FORMAT = "edge-spec-bundle"
SCHEMA_VERSION = 13
PRECISIONS = ("int4", "int8", "fp16", "fp32")
NGRAM_ENTRY_BYTES = 12  # NgramSpec: an 8-byte n-gram hash + a 4-byte token id per entry
GRAPH_FORMATS = ("onnx", "ort")  # ModelSpec.graph_format: an ONNX protobuf or an ORT-format flatbuffer
# Manifest.drafting: what drafting="auto" runs. hybrid = the drafter model, and prompt lookup where the text repeats
DRAFTING_DEFAULTS = ("hybrid", "model", "lookup")


@dataclass(frozen=True)
class Quantization:
    """How the graph's MatMul weights are stored (MatMulNBits for int4/int8)."""

    precision: str  # one of PRECISIONS
    block_size: int | None = None  # int4/int8 block size along K
    accuracy_level: int | None = None  # MatMulNBits accuracy_level (0, 1 = fp32, 4 = int8 activations)
    io_dtype: str = "float32"  # dtype of logits (and of the KV cache unless kv_dtype says otherwise)
    # dtype of the KV cache tensors (past_key_values / present) when it differs from io_dtype: an fp32 graph
    # with "float16" casts q/k/v to fp16 around GroupQueryAttention and keeps half the KV bytes. None: io_dtype.
    kv_dtype: str | None = None

    @property
    def kv_cache_dtype(self) -> str:
        """The dtype of the KV buffers the runtime allocates: ``kv_dtype`` or, when absent, ``io_dtype``."""
        return self.kv_dtype or self.io_dtype


@dataclass(frozen=True)
class ModelSpec:
    """One ONNX decoder graph and everything needed to budget and drive it."""

    graph: str  # path of model.onnx (or model.ort, see graph_format) relative to the bundle root
    data_files: tuple[str, ...]  # external-data files next to the graph (relative paths)
    architecture: str  # Hugging Face architecture, e.g. "LlamaForCausalLM"
    quantization: Quantization
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    hidden_size: int
    vocab_size: int  # width of the logits this graph outputs (trimmed for a trimmed drafter)
    full_vocab_size: int  # tokenizer / target vocabulary size
    max_context: int  # tokens the KV buffer may hold
    weight_bytes: int  # bytes of initializers (graph + external data) on disk
    load_bytes: int  # resident bytes added by creating the ORT session (measured at export)
    kv_bytes_per_token: int  # 2 (K and V) * layers * kv_heads * head_size * dtype bytes
    workspace_bytes: dict[int, int]  # k new tokens (1..16) -> peak bytes of one forward pass
    input_names: dict[str, str]  # input_ids, attention_mask, past_key (%d), past_value (%d)
    output_names: dict[str, str]  # logits, present_key (%d), present_value (%d)
    genai_config: str | None = None  # ORT GenAI config, relative path (target only)
    # Passes of at least this many rows give every row bit-identical logits whatever the pass size
    # (measured at export, edge_spec/export/invariance.py): 1 = any pass, a 1-token step included. Bundles
    # before version 9 say 2 and the runtime pads shorter passes to it. None: not batch-invariant.
    batch_invariant_rows: int | None = None
    # Rows the graph itself appends to a 1-token pass (copies of its token, dropped before the output;
    # export/invariance.py): what makes a 1-token step the first row of a 2-row pass. Their keys/values
    # land past the pass, so the KV buffers hold this many scratch positions beyond max_context.
    pad_rows: int = 0
    # Peak RSS added while creating the session (before the weights it repacked are let go): what loading needs
    # at once. None (bundles exported before it was measured): load_bytes, measured with those pages resident.
    load_peak_bytes: int | None = None
    # Bytes of the memory-mapped tables the graph reads by row (the embedding's Gather): let go after load like
    # the rest of the mapped weights, they come back a page per token seen, at most all of them. The planner
    # counts them whole. None: older bundles, whose load_bytes kept them resident.
    gather_bytes: int | None = None
    # Per weight tensor, for graphs edge-spec builds itself (GGUF, distilled drafters): name, gguf_type,
    # onnx_op, bits, block, exact, max_abs_err, bytes. Empty for ORT GenAI builder graphs.
    tensors: list[dict[str, Any]] = field(default_factory=list)
    # "decoder": tokens in, logits out. "eagle3": a feature drafter (EAGLE-3 head): also reads the target's
    # features (input ``target_hidden``) and its own previous output (``prev_hidden``), writes ``hidden_out``.
    kind: str = "decoder"
    # The residual streams the graph outputs (a target, output ``hidden_states``) or reads (an eagle3 drafter):
    # layer ids, 0 = the embeddings, j = the input of layer j, num_layers = the last layer's output before the
    # final norm. ``feature_dim`` = their count x the target's hidden size (float16 on the wire). None: no features.
    feature_layers: list[int] | None = None
    feature_dim: int | None = None
    # "onnx": an ONNX protobuf (its weights in ``data_files``). "ort": ONNX Runtime's own flatbuffer format, the one
    # ONNX Runtime Mobile loads (``edge-spec package``): graph optimizations applied, weights inside the file.
    # Absent (bundles before version 6): "onnx".
    graph_format: str = "onnx"
    # Kernel libraries of edge-spec's own the graph needs besides ONNX Runtime (edge_spec/kernels.py):
    # ["edge_spec.kquant"] for graphs exported with --gguf-mode kquant. Absent (before version 11): none.
    custom_ops: list[str] = field(default_factory=list)
    # Data files (of ``data_files``) that hold only tables the graph reads by row (an untied embedding's Gather):
    # the runtime lets their pages go after every pass, so only the rows of one pass are resident, and the plan
    # counts that much of them (runtime/memory.py, ``RowTables``). Absent (before version 13): none, counted whole.
    row_tables: list[str] = field(default_factory=list)

    @property
    def load_peak(self) -> int:
        """Peak bytes the session's creation adds (``load_peak_bytes``, else ``load_bytes``)."""
        return max(self.load_bytes, self.load_peak_bytes or 0)

    def logits_bytes(self, positions: int) -> int:
        """Bytes of a float32 logits buffer for ``positions`` query positions."""
        return positions * self.vocab_size * 4

    def workspace_for(self, k: int) -> int:
        """Measured workspace of a k-token pass; beyond the measured range, extrapolate linearly."""
        if k in self.workspace_bytes:
            return self.workspace_bytes[k]
        top = max(self.workspace_bytes)
        if k < min(self.workspace_bytes):
            return self.workspace_bytes[min(self.workspace_bytes)]
        per = max(0, self.workspace_bytes[top] - self.workspace_bytes.get(top - 1, self.workspace_bytes[top]))
        return self.workspace_bytes[top] + per * (k - top)


@dataclass(frozen=True)
class VocabTrim:
    """The drafter's LM head keeps ``kept`` rows; ``id_map[i]`` is the target id of draft id i."""

    id_map: str  # relative path of an int32 .npy array, shape [kept]
    kept: int
    full: int
    coverage: float  # share of target-produced calibration tokens inside the kept set
    calibration_tokens: int  # tokens the target generated for the count
    lm_head_bytes_before: int
    lm_head_bytes_after: int


@dataclass(frozen=True)
class ChatFormat:
    """A chat template flattened to strings, so the runtime needs no Jinja (docs/manifest.md).

    A conversation renders as, message by message, ``prefix + content + suffix``, then
    ``generation_prompt`` (or ``end`` without one). ``roles[r] = (prefix, suffix)``; when
    ``prefixes`` is set (``verified > 0``), the prefix of a message comes from ``prefixes["PREV>ROLE"]``
    instead, PREV being the previous message's role or ``^`` at the start: that is how a default
    system block (SmolLM2, Qwen2.5), a BOS written by the template (Llama-3, Gemma) or a system
    message folded into the first user turn (Gemma-3) is expressed. ``template`` keeps the Jinja."""

    roles: dict[str, tuple[str, str]]
    generation_prompt: str
    template: str | None = None
    prefixes: dict[str, str] = field(default_factory=dict)  # "PREV>ROLE" -> prefix; a missing pair is refused
    trimmed: tuple[str, ...] = ()  # roles whose content the template strips (Jinja "| trim")
    end: str = ""  # appended after the last message when no generation prompt is asked for
    verified: int = 0  # conversations checked token for token against apply_chat_template at export (0: legacy)
    # Tools (version 10): the special-token strings apply_chat_template passes the template (bos_token, ...), and
    # how many tool conversations the Jinja rendering (runtime/template.py) matched apply_chat_template(tools=...)
    # on, token for token; 0: the template does not render tools in the <tool_call> syntax, or predates the check
    variables: dict[str, str] = field(default_factory=dict)
    tools_verified: int = 0


@dataclass(frozen=True)
class FimTokens:
    """The model's fill-in-the-middle tokens (ids), as llama.cpp finds them: the GGUF's
    ``tokenizer.ggml.fim_*_token_id`` keys where present, else the tokenizer's tokens by their text
    (``<|fim_prefix|>``, ``<fim-prefix>``, ``<PRE>``, ...; :mod:`edge_spec.bundle.fim`). The repo-level
    ones (``repo_name``: ``<|repo_name|>``, ``file_sep``: ``<|file_sep|>``) and ``pad`` exist only in some
    models (Qwen2.5-Coder has all six). ``source``: "gguf" when any id came from the GGUF's keys, else
    "tokenizer"."""

    prefix: int
    suffix: int
    middle: int
    pad: int | None = None
    repo_name: int | None = None
    file_sep: int | None = None
    source: str = "tokenizer"


@dataclass(frozen=True)
class TokenizerSpec:
    files: tuple[str, ...]  # relative paths; files[0] is tokenizer.json
    vocab_size: int
    bos_token_id: int | None
    stop_token_ids: tuple[int, ...]  # EOS and end-of-turn tokens
    special_token_ids: tuple[int, ...]
    chat: ChatFormat | None
    # fill-in-the-middle tokens; None: the model has none (bundles before version 10: derived from the tokenizer
    # at load, edge_spec.runtime.fim)
    fim: FimTokens | None = None


@dataclass(frozen=True)
class SourceModel:
    name: str  # path or hub id the user passed
    sha256: str  # hash over the checkpoint's weight and config files


SHARED_DTYPES = ("uint8", "int8", "float32", "float16", "int64")


@dataclass(frozen=True)
class SharedInitializer:
    """A weight tensor target and drafter both read, byte for byte the same (the shared embedding).

    The runtime maps ``length`` bytes at ``offset`` of ``file`` (bundle-relative, the target's copy) once
    and hands that one buffer to both ONNX Runtime sessions (``SessionOptions.add_initializer``), so the
    drafter does not load a second copy; ``load_bytes`` are measured that way."""

    name: str  # initializer name, the same in both graphs
    file: str  # bundle-relative external-data file, e.g. "target/embed.data"
    offset: int
    length: int
    dtype: str  # one of SHARED_DTYPES
    shape: tuple[int, ...]


@dataclass(frozen=True)
class NgramSpec:
    """A static n-gram draft table built from the target's own answers (:mod:`edge_spec.runtime.ngrams`).

    ``file`` (bundle-relative .npz) holds ``keys`` uint64 [entries] and ``next`` int32 [entries]; ``bytes`` is what
    they take loaded. Kept: n-grams of ``min_n``..``max_n`` answer-context tokens whose most frequent next token
    followed them at least ``min_count`` times and in at least ``min_share`` of their occurrences, counted over
    ``tokens`` answer tokens of ``sequences`` training (never held-out) conversations. ``guess_bytes`` (0 in bundles
    before version 8): the file's ``guess`` int32 [vocab], each token's most frequent next answer token unfiltered
    (-1: never seen), drafted only into a target pass's padding row, where a draft costs nothing."""

    file: str
    entries: int
    bytes: int
    min_n: int
    max_n: int
    min_count: int
    min_share: float
    sequences: int
    tokens: int
    guess_bytes: int = 0


@dataclass(frozen=True)
class Manifest:
    """The whole ``edge_spec.json``."""

    target: ModelSpec
    drafter: ModelSpec | None
    tokenizer: TokenizerSpec
    vocab_trim: VocabTrim | None
    sources: dict[str, SourceModel]  # "target" / "drafter" -> provenance
    created_by: str
    created_at: str
    format: str = FORMAT
    version: int = SCHEMA_VERSION
    notes: dict[str, Any] = field(default_factory=dict)  # export report (timings, kept share, ...)
    shared_initializers: tuple[SharedInitializer, ...] = ()  # loaded once for both sessions (absent: none)
    # The model's own recommended sampling settings (HF generation_config.json, GGUF general.sampling.*):
    # a subset of temperature / top_k / top_p / min_p, plus "source". None: the source carries none.
    sampling: dict[str, Any] | None = None
    ngrams: NgramSpec | None = None  # static n-gram drafts (absent: none)
    # (since version 12) what drafting="auto" runs, one of DRAFTING_DEFAULTS, chosen at export from measurements of
    # the pair (export --default-drafting); None: "hybrid"
    drafting: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def kv_bytes_per_token(layers: int, kv_heads: int, head_size: int, dtype: str) -> int:
    """K and V bytes one context position needs in every layer: 2 x layers x kv_heads x head_size x dtype bytes."""
    return 2 * layers * kv_heads * head_size * (2 if dtype == "float16" else 4)


def bundle_files(m: Manifest) -> list[str]:
    """Every file the manifest names, relative to the bundle root."""
    out = list(m.tokenizer.files)
    for spec in (m.target, m.drafter):
        if spec is not None:
            out.append(spec.graph)
            out.extend(spec.data_files)
    if m.vocab_trim is not None:
        out.append(m.vocab_trim.id_map)
    out.extend(t.file for t in m.shared_initializers if t.file not in out)
    if m.ngrams is not None:
        out.append(m.ngrams.file)
    return out


def write_manifest(bundle: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``edge_spec.json`` atomically (temp file + rename)."""
    path = Path(bundle) / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
