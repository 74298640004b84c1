"""The bundle manifest (``edge_spec.json``): one typed, versioned description of a bundle.

A bundle is a directory::

    BUNDLE/
      edge_spec.json            this manifest
      tokenizer/                tokenizer.json, tokenizer_config.json (+ chat template)
      target/                   model.onnx, model.onnx.data, genai_config.json
      drafter/                  model.onnx, model.onnx.data, id_map.npy (when trimmed)
      ngrams.npz                the static n-gram draft table (when exported with --ngrams)

or, packaged for ONNX Runtime Mobile (``edge-spec package``), ``model.ort`` graphs (no external data)
and ``required_operators.config`` at the root.

Everything the runtime's memory planner needs is in the manifest; the runtime never
opens the graphs to learn sizes. The schema is documented in ``docs/manifest.md`` —
keep that file true to this module. Only the standard library is imported here, so
both the lean runtime and the exporter can use it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from edge_spec.errors import BundleError, EdgeSpecError

MANIFEST_NAME = "edge_spec.json"
FORMAT = "edge-spec-bundle"
SCHEMA_VERSION = 9
PRECISIONS = ("int4", "int8", "fp16", "fp32")
NGRAM_ENTRY_BYTES = 12  # NgramSpec: an 8-byte n-gram hash + a 4-byte token id per entry
GRAPH_FORMATS = ("onnx", "ort")  # ModelSpec.graph_format: an ONNX protobuf or an ORT-format flatbuffer


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


@dataclass(frozen=True)
class TokenizerSpec:
    files: tuple[str, ...]  # relative paths; files[0] is tokenizer.json
    vocab_size: int
    bos_token_id: int | None
    stop_token_ids: tuple[int, ...]  # EOS and end-of-turn tokens
    special_token_ids: tuple[int, ...]
    chat: ChatFormat | None


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------ reading
def _build(cls: type, data: Any, where: str) -> Any:
    """Construct dataclass ``cls`` from JSON, rejecting unknown and missing keys."""
    if not isinstance(data, dict):
        raise BundleError(f"The manifest field '{where}' should be an object; re-export the bundle.")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise BundleError(f"The manifest field '{where}' has unknown key '{unknown[0]}'; re-export the bundle "
                          "with this edge-spec version.")
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is not MISSING or f.default_factory is not MISSING:
                continue
            raise BundleError(f"The manifest is missing '{where}.{f.name}'; re-export the bundle.")
        _check_type(data[f.name], str(f.type), f"{where}.{f.name}")
        kwargs[f.name] = data[f.name]
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise BundleError(f"The manifest field '{where}' is malformed ({exc}); re-export the bundle.") from None


_SCALARS = {"int": (int,), "str": (str,), "float": (int, float), "bool": (bool,)}


def _check_type(value: Any, annotation: str, where: str) -> None:
    """Scalar fields must have their declared JSON type (``"six"`` is not a layer count, ``true`` not a number)."""
    kinds = [k.strip() for k in annotation.split("|")]
    if "None" in kinds and value is None:
        return
    allowed = tuple(t for k in kinds for t in _SCALARS.get(k, ()))
    if len(allowed) != len([k for k in kinds if k != "None"]) or not allowed:
        return  # containers and nested objects are checked where they are built
    if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
        want = " or ".join(k for k in kinds if k != "None") + (" or null" if "None" in kinds else "")
        raise BundleError(f"The manifest field '{where}' should be {want} but is {json.dumps(value)[:40]}; "
                          "the manifest was edited or damaged, re-export the bundle.")


def _at_least(value: int, low: int, where: str) -> None:
    if value < low:
        raise BundleError(f"The manifest field '{where}' is {value} but must be >= {low}; the manifest was edited "
                          "or damaged, re-export the bundle.")


def kv_bytes_per_token(layers: int, kv_heads: int, head_size: int, dtype: str) -> int:
    """K and V bytes one context position needs in every layer: 2 x layers x kv_heads x head_size x dtype bytes."""
    return 2 * layers * kv_heads * head_size * (2 if dtype == "float16" else 4)


def _check_model(spec: ModelSpec, where: str) -> None:
    """Ranges and the identities between fields; the graph itself is checked when its session is created."""
    for name in ("num_layers", "num_attention_heads", "num_kv_heads", "head_size", "hidden_size", "vocab_size",
                 "full_vocab_size", "max_context", "kv_bytes_per_token"):
        _at_least(getattr(spec, name), 1, f"{where}.{name}")
    for name in ("weight_bytes", "load_bytes", "pad_rows"):
        _at_least(getattr(spec, name), 0, f"{where}.{name}")
    for name in ("load_peak_bytes", "gather_bytes"):
        if getattr(spec, name) is not None:
            _at_least(getattr(spec, name), 0, f"{where}.{name}")
    if spec.quantization.io_dtype not in ("float32", "float16"):
        raise BundleError(f"The manifest field '{where}.quantization.io_dtype' is "
                          f"{spec.quantization.io_dtype!r} but must be float32 or float16; re-export the bundle.")
    if spec.quantization.kv_dtype not in (None, "float32", "float16"):
        raise BundleError(f"The manifest field '{where}.quantization.kv_dtype' is "
                          f"{spec.quantization.kv_dtype!r} but must be float32, float16 or null; re-export the bundle.")
    kv = kv_bytes_per_token(spec.num_layers, spec.num_kv_heads, spec.head_size, spec.quantization.kv_cache_dtype)
    if spec.kv_bytes_per_token != kv:
        raise BundleError(f"The manifest field '{where}.kv_bytes_per_token' is {spec.kv_bytes_per_token} but "
                          f"2 x layers x kv_heads x head_size x dtype bytes is {kv}; re-export the bundle.")
    if spec.num_attention_heads % spec.num_kv_heads or spec.vocab_size > spec.full_vocab_size:
        raise BundleError(f"The manifest's '{where}' has inconsistent heads ({spec.num_attention_heads} / "
                          f"{spec.num_kv_heads} KV) or vocabulary ({spec.vocab_size} of {spec.full_vocab_size}); "
                          "re-export the bundle.")
    if spec.graph_format not in GRAPH_FORMATS:
        raise BundleError(f"The manifest field '{where}.graph_format' is {spec.graph_format!r} but must be 'onnx' or "
                          "'ort'; upgrade edge-spec or re-export the bundle.")
    if spec.kind not in ("decoder", "eagle3"):
        raise BundleError(f"The manifest field '{where}.kind' is {spec.kind!r} but must be 'decoder' or 'eagle3'; "
                          "upgrade edge-spec or re-export the bundle.")
    layers = spec.feature_layers
    if layers is not None and (not isinstance(layers, list) or not layers or not all(
            isinstance(j, int) and not isinstance(j, bool) and j >= 0 for j in layers)
            or not isinstance(spec.feature_dim, int) or spec.feature_dim < 1):
        raise BundleError(f"The manifest fields '{where}.feature_layers' / 'feature_dim' must be a non-empty list of "
                          "layer ids >= 0 and a width >= 1; re-export the bundle.")
    if spec.kind == "eagle3" and layers is None:
        raise BundleError(f"The manifest's '{where}' is an eagle3 drafter without feature_layers; re-export the "
                          "bundle.")
    if not spec.workspace_bytes or min(spec.workspace_bytes) < 1 or min(spec.workspace_bytes.values()) < 0:
        raise BundleError(f"The manifest field '{where}.workspace_bytes' must map pass sizes >= 1 to byte counts "
                          ">= 0; re-export the bundle.")


def _model(data: Any, where: str) -> ModelSpec:
    spec = _build(ModelSpec, data, where)
    try:
        spec = ModelSpec(**{
            **asdict(spec),
            "quantization": _build(Quantization, data["quantization"], f"{where}.quantization"),
            "data_files": tuple(spec.data_files),
            "workspace_bytes": {int(k): int(v) for k, v in spec.workspace_bytes.items()},
        })
    except (AttributeError, ValueError, TypeError) as exc:
        raise BundleError(f"The manifest field '{where}' is malformed ({exc}); re-export the bundle.") from None
    _check_model(spec, where)
    return spec


def manifest_from_json(data: Any) -> Manifest:
    """Validate and type a parsed manifest; raises :class:`BundleError` with one sentence."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BundleError("This is not an edge-spec manifest (format is not 'edge-spec-bundle'); "
                          "pass a directory written by 'edge-spec export'.")
    version = data.get("version")
    if not isinstance(version, int):
        raise BundleError("The manifest has no integer 'version'; re-export the bundle.")
    if version > SCHEMA_VERSION:
        raise BundleError(f"The bundle uses manifest version {version} but this edge-spec reads up to "
                          f"version {SCHEMA_VERSION}; upgrade edge-spec (pip install -U edge-spec).")
    base = _build(Manifest, data, "manifest")
    tok = _build(TokenizerSpec, data["tokenizer"], "tokenizer")
    chat = None
    if tok.chat is not None:
        c = _build(ChatFormat, tok.chat, "tokenizer.chat")
        try:
            chat = ChatFormat(roles={str(r): (str(v[0]), str(v[1])) for r, v in c.roles.items()},
                              generation_prompt=str(c.generation_prompt), template=c.template,
                              prefixes={str(k): str(v) for k, v in c.prefixes.items()},
                              trimmed=tuple(str(r) for r in c.trimmed), end=str(c.end), verified=int(c.verified))
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"The manifest field 'tokenizer.chat' is malformed ({exc}); re-export the bundle.") \
                from None
    for name in ("files", "stop_token_ids", "special_token_ids"):
        if not isinstance(getattr(tok, name), list):
            raise BundleError(f"The manifest field 'tokenizer.{name}' should be a list; re-export the bundle.")
    _at_least(tok.vocab_size, 1, "tokenizer.vocab_size")
    for name, want in (("files", str), ("stop_token_ids", int), ("special_token_ids", int)):
        for x in getattr(tok, name):
            if isinstance(x, bool) or not isinstance(x, want) or want is int and not 0 <= x < tok.vocab_size:
                raise BundleError(f"The manifest field 'tokenizer.{name}' holds {json.dumps(x)[:40]}, not "
                                  + ("a path" if want is str else f"a token id in [0, {tok.vocab_size})")
                                  + "; re-export the bundle.")
    if not tok.files:
        raise BundleError("The manifest field 'tokenizer.files' is empty; re-export the bundle.")
    tok = TokenizerSpec(files=tuple(tok.files), vocab_size=tok.vocab_size, bos_token_id=tok.bos_token_id,
                        stop_token_ids=tuple(tok.stop_token_ids), special_token_ids=tuple(tok.special_token_ids),
                        chat=chat)
    target = _model(data["target"], "target")
    drafter = None if data.get("drafter") is None else _model(data["drafter"], "drafter")
    if drafter is not None and drafter.kind == "eagle3" and (
            drafter.feature_layers != target.feature_layers or drafter.feature_dim != target.feature_dim):
        raise BundleError(f"The drafter reads the target's layers {drafter.feature_layers} but the target outputs "
                          f"{target.feature_layers or 'none'}; the manifest does not match its graphs, re-export it.")
    sampling = data.get("sampling")
    if sampling is not None:
        try:
            from edge_spec.runtime.sampling import SamplingConfig

            SamplingConfig(**{k: v for k, v in sampling.items() if k != "source"})
        except (AttributeError, TypeError, EdgeSpecError) as exc:
            raise BundleError(f"The manifest field 'sampling' is malformed ({exc}); re-export the bundle.") from None
    return Manifest(
        sampling=sampling,
        target=target,
        drafter=drafter,
        tokenizer=tok,
        vocab_trim=None if data.get("vocab_trim") is None else _build(VocabTrim, data["vocab_trim"], "vocab_trim"),
        sources={k: _build(SourceModel, v, f"sources.{k}") for k, v in (data.get("sources") or {}).items()},
        created_by=base.created_by, created_at=base.created_at, version=version,
        notes=dict(base.notes), shared_initializers=_shared(data.get("shared_initializers") or []),
        ngrams=_ngrams(data.get("ngrams"), tok.vocab_size),
    )


def _ngrams(data: Any, vocab_size: int) -> NgramSpec | None:
    if data is None:
        return None
    spec = _build(NgramSpec, data, "ngrams")
    for name in ("entries", "bytes", "sequences", "tokens"):
        _at_least(getattr(spec, name), 0, f"ngrams.{name}")
    _at_least(spec.min_n, 1, "ngrams.min_n")
    _at_least(spec.max_n, spec.min_n, "ngrams.max_n")
    _at_least(spec.min_count, 1, "ngrams.min_count")
    if spec.bytes != NGRAM_ENTRY_BYTES * spec.entries:
        raise BundleError(f"The manifest field 'ngrams.bytes' is {spec.bytes} but {spec.entries} entries take "
                          f"{NGRAM_ENTRY_BYTES * spec.entries} (8-byte key + 4-byte id); re-export the bundle.")
    if spec.guess_bytes not in (0, 4 * vocab_size):
        raise BundleError(f"The manifest field 'ngrams.guess_bytes' is {spec.guess_bytes} but must be 0 or "
                          f"{4 * vocab_size} (one int32 per token of the vocabulary); re-export the bundle.")
    return spec


def _shared(items: Any) -> tuple[SharedInitializer, ...]:
    if not isinstance(items, list):
        raise BundleError("The manifest field 'shared_initializers' should be a list; re-export the bundle.")
    out = []
    for i, item in enumerate(items):
        where = f"shared_initializers[{i}]"
        t = _build(SharedInitializer, item, where)
        shape = t.shape if isinstance(t.shape, list) else None
        if shape is None or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise BundleError(f"The manifest field '{where}.shape' should be a list of sizes; re-export the bundle.")
        _at_least(t.offset, 0, f"{where}.offset")
        size = {"uint8": 1, "int8": 1, "float16": 2, "float32": 4, "int64": 8}.get(t.dtype)
        if size is None or math.prod(shape) * size != t.length:
            raise BundleError(f"The manifest field '{where}' has dtype {t.dtype!r} and shape {shape} that do not "
                              f"make {t.length} bytes; re-export the bundle.")
        out.append(SharedInitializer(t.name, t.file, t.offset, t.length, t.dtype, tuple(shape)))
    return tuple(out)


def read_manifest(bundle: str | os.PathLike[str]) -> Manifest:
    """Read ``BUNDLE/edge_spec.json`` and check that every file it names exists."""
    root = Path(bundle)
    if not root.exists():
        raise BundleError(f"Bundle '{root}' does not exist; pass the directory written by 'edge-spec export'.")
    if not root.is_dir():
        raise BundleError(f"Bundle '{root}' is a file, not a directory; pass the directory written by "
                          "'edge-spec export'.")
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"'{root}' has no {MANIFEST_NAME}, so it is not an edge-spec bundle; "
                          "create one with 'edge-spec export'.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except PermissionError:
        raise _unreadable(root, MANIFEST_NAME) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc.__class__.__name__} at {getattr(exc, 'lineno', '?')}); "
                          "the bundle is corrupt, re-export it.") from None
    except OSError as exc:
        raise BundleError(f"{path} cannot be read ({exc.strerror or exc}); check the disk or copy the bundle "
                          "again.") from None
    manifest = manifest_from_json(data)
    for rel in bundle_files(manifest):
        if not (root / rel).is_file():
            raise BundleError(f"The bundle is missing '{rel}' named in its manifest; re-export the bundle.")
        if not os.access(root / rel, os.R_OK):
            raise _unreadable(root, rel)
    return manifest


def _unreadable(root: Path, rel: str) -> BundleError:
    """Not corruption, and re-exporting does not help: the files' owner must grant read access."""
    return BundleError(f"'{rel}' in the bundle '{root}' is not readable by this user (permission denied); ask its "
                       f"owner to run: chmod -R a+rX {root}")


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
