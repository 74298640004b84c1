"""``export_bundle``: target + drafter checkpoints -> a complete, measured edge-spec bundle.

Stages: check, build (+quantize), calibrate, trim, measure, write. Everything is written
into a temp dir next to the destination and renamed into place at the end; any failure,
Ctrl-C included, removes the temp dir, so a bundle on disk is always complete.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from edge_spec import __version__, kernels
from edge_spec.bundle import (
    DRAFTING_DEFAULTS,
    Manifest,
    SourceModel,
    TokenizerSpec,
    VocabTrim,
    write_manifest,
)
from edge_spec.errors import EdgeSpecError, ExportError
from edge_spec.export import (
    build,
    calibrate,
    eagle_graph,
    graph_writer,
    invariance,
    ngrams,
    own_build,
    tokenizer_check,
    vocab_trim,
)
from edge_spec.export import gguf as gguf_src
from edge_spec.export.bundle_tokenizer import TOKENIZER_FILES, recommended_sampling, write_tokenizers
from edge_spec.export.destination import finish, prepare_destination
from edge_spec.export.model_spec import head_size, model_spec
from edge_spec.export.options import (  # noqa: F401 - the export API's names, as before
    DEFAULT_ACCURACY,
    DEFAULT_MAX_CONTEXT_CAP,
    DEFAULT_QUANT,
    EAGLE_DEFAULT_QUANT,
    GGUF_TARGET_ACCURACY,
    OWN_KV_DTYPE,
    ExportOptions,
    Quant,
    default_level,
    own_kv_dtype,
)
from edge_spec.fetch import checkpoint_sha256  # noqa: F401 - the export API's name, as before

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(f"edge-spec export: {msg}", file=sys.stderr, flush=True)


def export_bundle(target: str, drafter: str | None, out: str | os.PathLike[str], options: ExportOptions | None = None,
                  progress: Progress | None = _stderr) -> Manifest:
    """Export ``target`` and ``drafter`` (local checkpoint dirs or hub ids) into the bundle ``out``.

    ``drafter`` None: a bundle without a drafter model (drafts come from prompt lookup), as llama.cpp runs
    any GGUF alone; a drafter trained for it later is added by exporting again with one."""
    opts = options or ExportOptions()
    say = progress or (lambda _msg: None)
    out = Path(out)
    if opts.gguf_mode == "kquant" and not kernels.available():
        raise ExportError(f"--gguf-mode kquant needs edge-spec's K-quant kernels, which cannot run here "
                          f"({kernels.kquant_library()[1]}); use --gguf-mode split.")
    if opts.gguf_mode == "auto":  # the file's own K-quant blocks on our kernels when they run here
        opts = replace(opts, gguf_mode="kquant" if kernels.available() else "split")
    if opts.default_drafting not in (None, *DRAFTING_DEFAULTS):
        raise ExportError(f"--default-drafting {opts.default_drafting} is not one of {', '.join(DRAFTING_DEFAULTS)}.")
    if drafter is None and opts.default_drafting in ("hybrid", "model"):
        raise ExportError(f"--default-drafting {opts.default_drafting} drafts with the drafter model, and this export "
                          "has none; pass --drafter, or --default-drafting lookup.")
    for role, q in (("target", opts.target_quant), ("drafter", opts.drafter_quant)):
        if q is not None:  # a drafter's default precision (int4 or int8) runs everywhere
            build.check_precision(q.precision, opts.execution_provider, role)
    t_ckpt = _resolve(target, "target", opts, None)
    if isinstance(t_ckpt, own_build.Source) and opts.execution_provider != "cpu":
        raise ExportError(f"--execution-provider {opts.execution_provider} shapes the graphs of ONNX Runtime GenAI's "
                          "builder (Hugging Face checkpoints); edge-spec builds one graph from a GGUF for every "
                          "provider (WebGPU runs all of it but the embedding lookup and shape arithmetic, "
                          "docs/devices.md), so leave the option out and pick the device at run time (--device).")
    d_ckpt = None if drafter is None else _resolve(drafter, "drafter", opts, t_ckpt)
    if isinstance(t_ckpt, build.Checkpoint) and isinstance(d_ckpt, build.Checkpoint):
        tokenizer_check.check_same_tokenizer(t_ckpt.path, d_ckpt.path)  # GGUF tokenizers: checked at export
    prompts = calibrate.read_prompts(opts.calibration) if opts.calibration else list(calibrate.DEFAULT_PROMPTS)
    tmp = prepare_destination(out, opts.force)
    try:
        manifest = _export_into(tmp, t_ckpt, d_ckpt, opts, prompts, say)
        finish(tmp, out)
        return manifest
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise ExportError(f"The disk holding '{out.parent}' is full; free some space or choose another --out.") \
                from None
        raise ExportError(f"Writing the bundle failed ({exc.strerror or exc}: {exc.filename or out}); check that "
                          "the output location is writable and has space.") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


Source = build.Checkpoint | own_build.Source


def _resolve(name: str, role: str, opts: ExportOptions, target: Source | None) -> Source:
    """A GGUF file, an edge-spec distilled drafter dir, or a Hugging Face checkpoint (dir or hub id)."""
    path = Path(name).expanduser()
    if path.is_file() and (gguf_src.is_gguf(path) or path.suffix.lower() == ".gguf"):
        if not gguf_src.is_gguf(path):
            raise ExportError(f"The {role} '{name}' does not start with the GGUF magic bytes, so it is not a GGUF "
                              "file (or it is corrupt); re-download it.")
        return own_build.gguf_source(name, role)
    if role == "drafter" and path.is_dir() and eagle_graph.is_eagle3_dir(path):
        return eagle_graph.eagle_source(name, target if isinstance(target, own_build.Source) else None)
    if role == "drafter" and path.is_dir() and own_build.is_distilled_dir(path):
        return own_build.distilled_source(name, target if isinstance(target, own_build.Source) else None)
    return build.resolve_checkpoint(name, role, opts.trust_remote_code)


def _peak_rss_gib() -> float:
    """The export process's peak resident set so far, GiB (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 30) if sys.platform == "darwin" else peak / (1 << 20)


def _timed(say: Progress, stage: str, what: str):
    class _T:
        def __enter__(self):
            self.t = time.perf_counter()
            say(f"[{stage}] {what} ...")
            return self

        def __exit__(self, *exc):
            if exc[0] is None:
                say(f"[{stage}] {what} done in {time.perf_counter() - self.t:.1f}s (peak RSS so far "
                    f"{_peak_rss_gib():.2f} GiB)")

    return _T()


def _export_into(tmp: Path, t_ckpt: build.Checkpoint, d_ckpt: build.Checkpoint | None, opts: ExportOptions,
                 prompts: list[str], say: Progress) -> Manifest:
    started = time.perf_counter()
    t_cfg = t_ckpt.config
    positions = int(t_cfg.get("max_position_embeddings") or DEFAULT_MAX_CONTEXT_CAP)
    max_ctx = opts.max_context or min(positions, DEFAULT_MAX_CONTEXT_CAP)
    if max_ctx < 16 or max_ctx > positions:
        raise ExportError(f"--max-context {max_ctx} is outside 16..{positions} (the target's "
                          "max_position_embeddings); pass a value in that range.")
    table = None
    if opts.ngrams:  # first: a wrong file is refused before minutes of graph building
        with _timed(say, "ngrams", f"n-gram draft table from {len(opts.ngrams)} answers file(s)"):
            table = ngrams.build(opts.ngrams, tmp, _sha(t_ckpt), int(t_cfg["vocab_size"]), say)
    cache = tmp / ".cache"
    graphs: dict[str, Path] = {}
    own_drafter = isinstance(d_ckpt, own_build.Source)
    eagle = own_drafter and d_ckpt.kind == "eagle3"
    features = tuple(d_ckpt.config["eagle_aux_layers"]) if eagle else None  # what the target must output
    # the option, else the drafter's default: EAGLE_DEFAULT_QUANT for a head, DEFAULT_QUANT's for any other drafter
    d_quant = opts.drafter_quant or Quant(EAGLE_DEFAULT_QUANT if eagle else DEFAULT_QUANT["drafter"])
    roles = (("target", t_ckpt, opts.target_quant),) + (
        (("drafter", d_ckpt, d_quant),) if d_ckpt is not None else ())
    for role, ckpt, q in roles:
        if role == "drafter" and own_drafter:
            continue  # built after VocabTrim chose its LM-head rows
        graphs[role] = _build_role(tmp, role, ckpt, q, opts, max_ctx, cache, say, features=features)
    if isinstance(t_ckpt, own_build.Source):
        own_build.write_genai_config(tmp / "target", t_cfg, max_ctx)
    _fix_genai_config(tmp / "target" / "genai_config.json", max_ctx)

    tok_dir = tmp / "tokenizer"
    tok_spec = write_tokenizers(t_ckpt, d_ckpt, tok_dir, cache)

    trim = None
    if eagle:  # the head's draft vocabulary was chosen in training: its id map is the trim
        graphs["drafter"], trim = _build_eagle(tmp, d_ckpt, d_quant, opts, max_ctx, graphs["target"], tok_dir,
                                               tok_spec, prompts, say)
    elif opts.trim_vocab is not None and d_ckpt is not None:
        counts = _calibration_counts(graphs["target"], head_size(t_cfg), tok_dir, tok_spec, prompts, say)
        with _timed(say, "trim", f"drafter vocabulary ({opts.trim_vocab})"):
            keep = tuple(tok_spec.special_token_ids) + tuple(tok_spec.stop_token_ids)
            kept = vocab_trim.choose_kept(counts, opts.trim_vocab, keep, opts.trim_share)
            if own_drafter:  # our builder slices the LM head's rows (exact: blocks run along K)
                graphs["drafter"] = _build_role(tmp, "drafter", d_ckpt, d_quant, opts, max_ctx, cache,
                                                say, kept=kept.ids)
                before, after = own_build.head_bytes(d_ckpt)
            else:
                before, after = vocab_trim.trim_lm_head(graphs["drafter"], kept.ids)
            np.save(tmp / "drafter" / "id_map.npy", kept.ids)
            trim = VocabTrim(id_map="drafter/id_map.npy", kept=int(len(kept.ids)), full=int(len(counts)),
                             coverage=round(kept.coverage, 6), calibration_tokens=kept.calibration_tokens,
                             lm_head_bytes_before=int(before), lm_head_bytes_after=int(after))
        say(f"[trim] kept {trim.kept}/{trim.full} tokens covering {trim.coverage:.1%} of "
            f"{trim.calibration_tokens} target tokens; LM head {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")
    if "drafter" not in graphs and d_ckpt is not None:
        graphs["drafter"] = _build_role(tmp, "drafter", d_ckpt, d_quant, opts, max_ctx, cache, say)
    shutil.rmtree(cache, ignore_errors=True)
    for f in ("genai_config.json",) + TOKENIZER_FILES:  # the drafter dir holds only its graph (+ id map)
        (tmp / "drafter" / f).unlink(missing_ok=True)
    shared = graph_writer.share_embedding(tmp / "target", tmp / "drafter", say) if d_ckpt is not None else None
    if d_ckpt is None:
        say("[build] no drafter: drafts will come from prompt lookup (add a drafter later by exporting again with "
            "--drafter, e.g. one trained by edge-spec distill)")
    # mapped once and given to both sessions by the runtime; measured the same way
    shared_inits = graph_writer.shared_initializers(tmp) if shared else []

    # a 1-token pass of the target runs as 2 rows where needed, so a 1-token step is computed as any verify pass
    # computes it (a row-exact K-quant graph with CacheAttention needs nothing: export/invariance.py)
    padded = invariance.pad_rows(tmp / "target" / "model.onnx")
    specs = {}
    for role, ckpt, q in roles:
        with _timed(say, "measure", f"{role} load and workspace memory"
                    + (" (next to the loaded target, as the runtime loads it)" if role == "drafter" else "")):
            beside = (tmp / "target" / "model.onnx", head_size(t_cfg)) if role == "drafter" else None
            level = q.accuracy_level if q.accuracy_level is not None else default_level(role, ckpt)
            specs[role] = model_spec(tmp, role, ckpt, q, level, opts, max_ctx, int(t_cfg["vocab_size"]),
                                     shared=shared_inits, beside=beside, features=features)
    with _timed(say, "measure", "target batch invariance (k-token passes vs 1-token steps, bit for bit)"):
        specs["target"] = replace(specs["target"], pad_rows=invariance.PAD_ROWS if padded else 0)
        rows = invariance.batch_invariant_rows(tmp / specs["target"].graph, specs["target"])
        specs["target"] = replace(specs["target"], batch_invariant_rows=rows)
    say("[measure] target passes are row-exact at any size: a 1-token step equals its row of any verify pass"
        if rows == 1 else "[measure] target passes are NOT row-exact at every size (this ONNX Runtime's kernels): "
        "greedy speculative output may differ from plain decoding at near-ties")
    manifest = Manifest(
        target=specs["target"], drafter=specs.get("drafter"), tokenizer=tok_spec, vocab_trim=trim,
        sources={"target": SourceModel(t_ckpt.name, _sha(t_ckpt)),
                 **({"drafter": SourceModel(d_ckpt.name, _sha(d_ckpt))} if d_ckpt is not None else {})},
        created_by=f"edge-spec {__version__}", created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        notes={"export_seconds": round(time.perf_counter() - started, 2),
               "calibration_prompts": len(prompts) if trim else 0,
               "trim_share": opts.trim_share if opts.trim_vocab == "auto" else None,
               **({"shared_embedding": shared} if shared else {})},
        shared_initializers=tuple(shared_inits), sampling=recommended_sampling(t_ckpt), ngrams=table,
        drafting=opts.default_drafting,
    )
    if manifest.sampling:
        say(f"[chat] the model recommends sampling with {manifest.sampling} (edge-spec chat's defaults)")
    write_manifest(tmp, manifest)
    return manifest


def _calibration_counts(target_graph: Path, head_size: int, tok_dir: Path, tok_spec: TokenizerSpec,
                        prompts: list[str], say: Progress) -> np.ndarray:
    """[vocab] how often the target graph writes each token when sampling the calibration prompts."""
    with _timed(say, "calibrate", f"sampling {len(prompts)} prompts from the target graph"):
        return calibrate.target_token_counts(target_graph, head_size, tok_dir / "tokenizer.json", tok_spec.chat,
                                             prompts, stop_ids=tok_spec.stop_token_ids)


def _own_bits(q: Quant, role: str, name: str) -> int | None:
    """Weight bits of a graph our own builder quantizes (None: float32); one sentence for other precisions."""
    bits = {"int4": 4, "int8": 8, "fp32": None}.get(q.precision, -1)
    if bits == -1:
        raise ExportError(f"A {q.precision} {role} cannot be built from '{name}'; use int4, int8 or fp32.")
    return bits


def _build_eagle(tmp: Path, src: own_build.Source, q: Quant, opts: ExportOptions, max_ctx: int, target_graph: Path,
                 tok_dir: Path, tok_spec: TokenizerSpec, prompts: list[str], say: Progress
                 ) -> tuple[Path, VocabTrim]:
    """An EAGLE-3 head's graph and its draft->target id map (as the VocabTrim entry). Its coverage of what the
    target writes is measured on the calibration prompts unless trimming is off (then 0 tokens, coverage 0)."""
    level = q.accuracy_level if q.accuracy_level is not None else default_level("drafter", src)
    bits = _own_bits(q, "drafter", src.name)
    with _timed(say, "build", f"drafter EAGLE-3 head -> {q.precision} + the target's embedding, accuracy_level "
                f"{level}"):
        # a head reads the target's embedding through ONNX Runtime's own ops (shared with the target's graph)
        mode = "split" if opts.gguf_mode == "kquant" else opts.gguf_mode
        graph, ids = eagle_graph.build_eagle_role(src, tmp / "drafter", max_ctx, level, bits, opts.block_size,
                                                  mode, own_kv_dtype(opts))
    say(f"[exact] drafter: {len(src.report) - 1} head tensors quantized to {q.precision} (drafts need not be "
        "exact, the target verifies them); the embedding is the target's")
    coverage, tokens = 0.0, 0
    if opts.trim_vocab is not None:
        counts = _calibration_counts(target_graph, head_size(src.gguf.config), tok_dir, tok_spec, prompts, say)
        tokens = int(counts.sum())
        coverage = float(counts[ids].sum() / max(tokens, 1))
    np.save(tmp / "drafter" / "id_map.npy", ids.astype(np.int32))
    head = next(e for e in src.report if e["name"] == "lm_head.weight")
    full = int(src.config["vocab_size"])
    trim = VocabTrim(id_map="drafter/id_map.npy", kept=int(len(ids)), full=full, coverage=round(coverage, 6),
                     calibration_tokens=tokens, lm_head_bytes_before=int(head["bytes"] * full // max(len(ids), 1)),
                     lm_head_bytes_after=int(head["bytes"]))
    say(f"[trim] the head drafts over {trim.kept}/{trim.full} tokens"
        + (f", covering {coverage:.1%} of {tokens} target tokens" if tokens else ""))
    return graph, trim


def _build_role(tmp: Path, role: str, ckpt: Source, q: Quant, opts: ExportOptions, max_ctx: int, cache: Path,
                say: Progress, kept: np.ndarray | None = None, features: tuple[int, ...] | None = None) -> Path:
    """One graph: the ORT GenAI builder for a Hugging Face checkpoint, our own builder otherwise."""
    level = q.accuracy_level if q.accuracy_level is not None else default_level(role, ckpt)
    if isinstance(ckpt, own_build.Source):
        bits = _own_bits(q, role, ckpt.name)
        what = "its own quantization" if ckpt.kind == "gguf" else f"{q.precision} layers + the target's embedding"
        with _timed(say, "build", f"{role} {ckpt.architecture} ({ckpt.kind}) -> {what}, accuracy_level {level}"):
            graph = own_build.build(ckpt, tmp / role, max_ctx, level, bits, opts.block_size, kept=kept,
                                    mode=opts.gguf_mode, kv_dtype=own_kv_dtype(opts),
                                    features=features if role == "target" else None)
        if role == "target" and features:
            say(f"[build] target also outputs its residual streams at layers {list(features)} (the EAGLE-3 "
                "drafter's input)")
        inexact = [e for e in ckpt.report if not e["exact"]]
        kept_exact = f"{len(ckpt.report) - len(inexact)}/{len(ckpt.report)} weight tensors carried over exactly"
        if role == "drafter" and ckpt.kind != "gguf" and inexact:  # quantizing a drafter is the point: one line
            worst = max(e["max_abs_err"] for e in inexact)
            say(f"[exact] drafter: {kept_exact}; {len(inexact)} quantized to {q.precision} (max |err| {worst:.3g}; "
                "drafts need not be exact, the target verifies them)")
            return graph
        for e in inexact:
            say(f"[exact] {role} {e['name']}: {e['gguf_type']} -> {e['onnx_op']} {e['bits']}-bit block "
                f"{e['block']}, NOT exact (max |err| {e['max_abs_err']:.3g})")
        say(f"[exact] {role}: {kept_exact}")
        return graph
    if opts.kv_dtype == "float16":
        raise ExportError(f"--kv-dtype fp16 applies to graphs edge-spec builds (GGUF files, distilled drafters), not "
                          f"to the ORT GenAI builder's graph of '{ckpt.name}'; convert it to GGUF or drop --kv-dtype.")
    if q.precision in ("int4", "int8"):
        q = Quant(q.precision, level)
    lv = f", accuracy_level {q.accuracy_level}" if q.accuracy_level is not None else ""
    with _timed(say, "build", f"{role} {ckpt.architecture} -> {q.precision}{lv}"):
        bopts = build.BuildOptions(q.precision, q.accuracy_level, opts.block_size, opts.execution_provider,
                                   max_ctx, lm_head=opts.lm_head)
        return build.build_graph(ckpt, tmp / role, bopts, cache)


def _sha(src: Source) -> str:
    return src.sha256 if isinstance(src, own_build.Source) else checkpoint_sha256(src.path)


def _fix_genai_config(path: Path, max_ctx: int) -> None:
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg.setdefault("search", {})["max_length"] = max_ctx  # the KV buffer ORT GenAI preallocates
    path.write_text(json.dumps(cfg, indent=4) + "\n", encoding="utf-8")


__all__ = ["ExportOptions", "Quant", "export_bundle", "checkpoint_sha256", "EdgeSpecError"]
