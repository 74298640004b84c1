"""Reading a bundle's manifest: ``edge_spec.json`` parsed, every field checked against the schema of
``manifest.py`` (types, ranges, the identities between fields) and every file it names found, or one sentence
(:class:`~edge_spec.errors.BundleError`) saying what is wrong and what to do.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from edge_spec.bundle.manifest import (
    DRAFTING_DEFAULTS,
    FORMAT,
    GRAPH_FORMATS,
    MANIFEST_NAME,
    NGRAM_ENTRY_BYTES,
    SCHEMA_VERSION,
    ChatFormat,
    FimTokens,
    Manifest,
    ModelSpec,
    NgramSpec,
    Quantization,
    SharedInitializer,
    SourceModel,
    TokenizerSpec,
    VocabTrim,
    bundle_files,
    kv_bytes_per_token,
)
from edge_spec.errors import BundleError, EdgeSpecError


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
    if not isinstance(spec.custom_ops, list) or not all(isinstance(x, str) for x in spec.custom_ops):
        raise BundleError(f"The manifest field '{where}.custom_ops' must be a list of kernel library names; "
                          "re-export the bundle.")
    if not isinstance(spec.row_tables, list) or not set(spec.row_tables) <= set(spec.data_files):
        raise BundleError(f"The manifest field '{where}.row_tables' must list some of its data_files; re-export the "
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
                              trimmed=tuple(str(r) for r in c.trimmed), end=str(c.end), verified=int(c.verified),
                              variables={str(k): str(v) for k, v in c.variables.items()},
                              tools_verified=int(c.tools_verified))
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
                        chat=chat, fim=_fim(tok.fim, tok.vocab_size))
    target = _model(data["target"], "target")
    drafter = None if data.get("drafter") is None else _model(data["drafter"], "drafter")
    if drafter is not None and drafter.kind == "eagle3" and (
            drafter.feature_layers != target.feature_layers or drafter.feature_dim != target.feature_dim):
        raise BundleError(f"The drafter reads the target's layers {drafter.feature_layers} but the target outputs "
                          f"{target.feature_layers or 'none'}; the manifest does not match its graphs, re-export it.")
    sampling = data.get("sampling")
    if sampling is not None:
        try:
            from edge_spec.sampling_config import SamplingConfig

            SamplingConfig(**{k: v for k, v in sampling.items() if k != "source"})
        except (AttributeError, TypeError, EdgeSpecError) as exc:
            raise BundleError(f"The manifest field 'sampling' is malformed ({exc}); re-export the bundle.") from None
    drafting = data.get("drafting")
    if drafting is not None and drafting not in DRAFTING_DEFAULTS:
        raise BundleError(f"The manifest field 'drafting' is {json.dumps(drafting)[:40]}, not one of "
                          f"{', '.join(DRAFTING_DEFAULTS)}; re-export the bundle.")
    return Manifest(
        drafting=drafting,
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


def _fim(data: Any, vocab_size: int) -> FimTokens | None:
    if data is None:
        return None
    spec = _build(FimTokens, data, "tokenizer.fim")
    for name in ("prefix", "suffix", "middle", "pad", "repo_name", "file_sep"):
        x = getattr(spec, name)
        if x is not None and (not 0 <= x < vocab_size):
            raise BundleError(f"The manifest field 'tokenizer.fim.{name}' is {x}, not a token id in [0, {vocab_size}); "
                              "re-export the bundle.")
    if spec.source not in ("gguf", "tokenizer"):
        raise BundleError(f"The manifest field 'tokenizer.fim.source' is {spec.source!r} but must be 'gguf' or "
                          "'tokenizer'; re-export the bundle.")
    return spec


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
