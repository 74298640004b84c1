"""``package_bundle``: an exported bundle -> the same bundle with ORT-format graphs, for ONNX Runtime Mobile.

ONNX Runtime Mobile loads models in ONNX Runtime's own flatbuffer format (``.ort``) and is built with only the
operators the app's models use. This converts each graph with ONNX Runtime's converter
(``onnxruntime.tools.convert_onnx_models_to_ort``: "Fixed" optimization style, level "all", the layout-specific
NCHWc transformer off so the file runs on ARM too), writes the operator lists a reduced build takes
(``required_operators.config`` for ``--include_ops_by_config``; ``required_operators_and_types.config`` with
``--enable_reduced_operator_type_support``), and re-measures memory, because an ``.ort`` file loads differently:
ONNX Runtime reads the whole file, weights included (the format has no external data), into memory and copies
the weights out of it, where an ``.onnx`` graph's weights are memory-mapped.

What stays the same: the graphs compute the same logits (the runtime applies the same optimizations to an
``.onnx`` graph at load; checked bit for bit by the tests and ``benchmarks/probes/ort_format.py``); the weights target
and drafter share (``shared_initializers``) are still mapped once from ``target/embed.data`` and handed to both
sessions (``SessionOptions.add_initializer`` overrides the copy inside each ``.ort`` file), so the runtime's
memory plan keeps that saving. An app on ONNX Runtime Mobile can do the same or let each session use its copy.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from edge_spec.bundle import SCHEMA_VERSION, Manifest, ModelSpec, find_fim, read_manifest, write_manifest
from edge_spec.errors import BundleError, ExportError

OPERATORS_CONFIG = "required_operators.config"
TYPED_OPERATORS_CONFIG = "required_operators_and_types.config"


def package_bundle(bundle: str | os.PathLike[str], out: str | os.PathLike[str], *, force: bool = False) -> Manifest:
    """Write ``out``: the bundle ``bundle`` with each graph converted to the ORT format, the reduced-build
    operator configs beside the manifest, and the manifest's memory fields measured on the new graphs.

    ``bundle`` is left untouched; ``out`` is written into a temp dir and renamed into place at the end."""
    from edge_spec.export.destination import finish, prepare_destination  # the exporter's atomic write

    src, dest = Path(bundle), Path(out)
    manifest = read_manifest(src)
    specs = {role: spec for role, spec in (("target", manifest.target), ("drafter", manifest.drafter)) if spec}
    if any(spec.graph_format != "onnx" for spec in specs.values()):
        raise ExportError(f"The bundle '{src}' already has ORT-format graphs; package the ONNX bundle it was made "
                          "from instead.")
    if any(spec.custom_ops for spec in specs.values()):
        raise ExportError(f"The bundle '{src}' runs on edge-spec's compiled K-quant kernels, which ONNX Runtime Mobile "
                          "cannot load; export it again with --gguf-mode split and package that bundle.")
    if dest.resolve() == src.resolve():
        raise ExportError(f"--out '{dest}' is the bundle itself; choose a new directory (the ONNX bundle is kept).")
    tools = _converter()
    t0 = time.perf_counter()
    tmp = prepare_destination(dest, force)
    try:
        _copy_side_files(src, tmp, manifest)
        graphs = {role: _convert(tools, src / spec.graph, tmp / role) for role, spec in specs.items()}
        for name, typed in ((OPERATORS_CONFIG, False), (TYPED_OPERATORS_CONFIG, True)):
            _write_config(tools, tmp, list(graphs.values()), name, typed)
        new = {role: _ort_spec(tmp, role, spec, graphs[role], manifest)
               for role, spec in specs.items()}
        import onnxruntime as ort

        notes = {k: v for k, v in manifest.notes.items() if k != "shared_embedding"}  # the drafter's link is gone
        notes["mobile"] = {"source_bundle": str(src), "onnxruntime": ort.__version__,
                           "optimization": "Fixed style, level all (NchwcTransformer off)",
                           "operator_configs": [OPERATORS_CONFIG, TYPED_OPERATORS_CONFIG],
                           "packaged_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           "package_seconds": round(time.perf_counter() - t0, 1)}
        tokenizer = manifest.tokenizer
        if manifest.version < 10:  # its FIM tokens were found at load; version 10 records them (None: none)
            from tokenizers import Tokenizer

            vocab = Tokenizer.from_file(str(src / tokenizer.files[0])).get_vocab(with_added_tokens=True)
            tokenizer = replace(tokenizer, fim=find_fim(vocab))
        packaged = replace(manifest, target=new["target"], drafter=new.get("drafter"), notes=notes,
                           tokenizer=tokenizer, version=SCHEMA_VERSION)  # graph_format is new in 6: older
        # readers must say "upgrade"
        write_manifest(tmp, packaged)
        read_manifest(tmp)  # every file it names is there
        finish(tmp, dest)
        return packaged
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"Writing the packaged bundle failed ({exc.strerror or exc}: {exc.filename or dest}); check "
                          "that the output location is writable and has space.") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class _Tools:
    """ONNX Runtime's converter and its config writer (they import ``onnx``: the export extra)."""

    def __init__(self) -> None:
        from onnxruntime.tools import convert_onnx_models_to_ort as convert
        from onnxruntime.tools.ort_format_model import create_config_from_models

        self.convert = convert.convert_onnx_models_to_ort
        self.fixed = convert.OptimizationStyle.Fixed
        self.create_config_from_models = create_config_from_models


def _converter() -> _Tools:
    try:
        return _Tools()
    except ImportError as exc:
        missing = (exc.name or "onnx").split(".")[0]
        raise ExportError(f"Packaging for ONNX Runtime Mobile needs ONNX Runtime's converter, which imports "
                          f"'{missing}'; install the export extra: pip install 'edge-spec[export]'.") from None


@contextlib.contextmanager
def _quiet():
    """The converter narrates every step on stdout and its config writer logs at INFO on stderr: silence both."""
    log = logging.getLogger("ort_format_model.utils")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        log.setLevel(level)


def _write_config(tools: _Tools, root: Path, graphs: list[Path], name: str, typed: bool) -> None:
    """The operators (``typed``: and their types) of all ``graphs``, as a reduced ONNX Runtime build reads them;
    its header names the graphs bundle-relative, not by the temp dir they were converted in."""
    path = root / name
    with _quiet():
        tools.create_config_from_models(graphs, path, typed)
    text = path.read_text(encoding="utf-8")
    for graph in graphs:
        text = text.replace(str(graph), graph.relative_to(root).as_posix())
    path.write_text(text, encoding="utf-8")


def _convert(tools: _Tools, graph: Path, role_dir: Path) -> Path:
    """``graph`` (an .onnx file) -> ``role_dir/<stem>.ort`` with ONNX Runtime's converter; returns the new path."""
    role_dir.mkdir(parents=True, exist_ok=True)
    try:
        with _quiet():
            tools.convert(graph, output_dir=role_dir, optimization_styles=[tools.fixed])
    except Exception as exc:  # ORT raises several unrelated types for a graph it cannot load
        why = str(exc).split("Status Message:", 1)[-1].strip().splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ExportError(f"ONNX Runtime could not convert '{graph}' to the ORT format ({why}); check that the bundle "
                          "loads ('edge-spec inspect') or re-export it.") from None
    for leftover in role_dir.glob("*.required_operators.config"):  # one per graph; the bundle gets one for all
        leftover.unlink()
    ort_file = role_dir / (graph.stem + ".ort")
    if not ort_file.is_file():
        raise ExportError(f"ONNX Runtime's converter wrote no '{ort_file.name}' for '{graph}'; re-export the bundle.")
    return ort_file


def _copy_side_files(src: Path, dest: Path, manifest: Manifest) -> None:
    """Tokenizer, id map, n-gram table, the target's genai_config.json and the shared weights' files: hard links
    where the file system allows (they are read-only), else copies."""
    files = list(manifest.tokenizer.files) + [t.file for t in manifest.shared_initializers]
    if manifest.vocab_trim is not None:
        files.append(manifest.vocab_trim.id_map)
    if manifest.ngrams is not None:
        files.append(manifest.ngrams.file)
    for rel in dict.fromkeys(files):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src / rel, target)
        except OSError:
            shutil.copy2(src / rel, target)
    extra = src / "tokenizer" / "chat_template.jinja"  # kept for people, not named in the manifest
    if extra.is_file() and not (dest / "tokenizer" / extra.name).exists():
        shutil.copy2(extra, dest / "tokenizer" / extra.name)


def _ort_spec(root: Path, role: str, spec: ModelSpec, graph: Path, manifest: Manifest) -> ModelSpec:
    """The manifest entry of the converted graph: format, file, size, and memory measured as the export measures it
    (in a fresh process, next to the loaded target for the drafter, with the shared weights mapped)."""
    from edge_spec.export import measure as measure_mod

    rel = graph.relative_to(root).as_posix()
    fields = {"graph": rel, "data_files": (), "graph_format": "ort", "weight_bytes": graph.stat().st_size,
              "genai_config": None, "row_tables": []}  # ORT GenAI loads .onnx graphs only; no data files to let go
    # The Gather tables the graph reads from memory-mapped files: only the shared ones are still mapped (the
    # target's copy); every other weight now lives in the session's heap and is counted in load_bytes.
    fields["gather_bytes"] = (spec.gather_bytes or 0) if role == "target" and manifest.shared_initializers else 0
    beside = None
    if role == "drafter":
        beside = (root / "target" / (Path(manifest.target.graph).stem + ".ort"), manifest.target.head_size)
    try:
        mem = measure_mod.measure_memory(graph, spec.max_context, spec.head_size,
                                         shared=[asdict(t) for t in manifest.shared_initializers], root=root,
                                         beside=beside)
    except RuntimeError as exc:
        raise BundleError(f"The converted {role} graph did not load for its memory measurement ({exc}); "
                          "re-export the bundle.") from None
    fields.update(load_bytes=int(mem["load_bytes"]), load_peak_bytes=int(mem["load_peak_bytes"]),
                  workspace_bytes=dict(mem["workspace_bytes"]))
    return replace(spec, **fields)
