"""A bundle: the directory ``edge-spec export`` writes and the runtime loads, described by its manifest.

Its layout::

    BUNDLE/
      edge_spec.json            this manifest
      tokenizer/                tokenizer.json, tokenizer_config.json (+ chat template)
      target/                   model.onnx, model.onnx.data, genai_config.json
      drafter/                  model.onnx, model.onnx.data, id_map.npy (when trimmed)
      ngrams.npz                the static n-gram draft table (when exported with --ngrams)

or, packaged for ONNX Runtime Mobile (``edge-spec package``), ``model.ort`` graphs (no external data)
and ``required_operators.config`` at the root.

The manifest (``edge_spec.json``), its schema and writing it: ``manifest.py``; a model's fill-in-the-middle tokens:
``fim.py``; reading it back, checked:
``read.py``. Both import only the standard library, so the lean runtime and the exporter use them alike. Every
public name of both is importable from here.
"""

from __future__ import annotations

from edge_spec.bundle.fim import FIM_GGUF_KEYS, FIM_TEXTS, find_fim
from edge_spec.bundle.manifest import (
    DRAFTING_DEFAULTS,
    FORMAT,
    GRAPH_FORMATS,
    MANIFEST_NAME,
    NGRAM_ENTRY_BYTES,
    PRECISIONS,
    SCHEMA_VERSION,
    SHARED_DTYPES,
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
    write_manifest,
)
from edge_spec.bundle.read import manifest_from_json, read_manifest

__all__ = [
    "DRAFTING_DEFAULTS", "FIM_GGUF_KEYS", "FIM_TEXTS", "FORMAT", "GRAPH_FORMATS", "MANIFEST_NAME",
    "NGRAM_ENTRY_BYTES", "PRECISIONS",
    "SCHEMA_VERSION", "SHARED_DTYPES", "ChatFormat", "FimTokens", "Manifest", "ModelSpec", "NgramSpec",
    "Quantization", "SharedInitializer", "SourceModel", "TokenizerSpec", "VocabTrim", "bundle_files", "find_fim",
    "kv_bytes_per_token", "manifest_from_json", "read_manifest", "write_manifest",
]
