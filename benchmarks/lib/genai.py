"""ONNX Runtime GenAI as a peer on the same graphs: its C++ loop (AR and speculative), in one place.

onnxruntime-genai's loop on a builder-style model directory (``genai_config.json`` + ``model.onnx``):
:func:`genai_model` and :func:`genai_generate` are the one GenAI loop every benchmark uses. With ``k`` set, it runs
its draft-model speculative decoding from a composite directory made by :func:`ort_composite` /
:func:`bundle_composite`. :func:`run_worker` runs inside a child process started by ``measure.measure``
(spec ``{"module": "genai", ...}``); only the module of the system being measured is imported there, so an ORT
GenAI child never loads torch. transformers, the other peer, is in ``hf.py``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

from edge_spec.runtime.memory import current_rss as rss_bytes

from .measure import run_prompts, summarise


# ------------------------------------------------------------------------------ ORT GenAI composite
def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _graph_files(model_dir: Path, graph: str) -> list[str]:
    """The graph and the external-data files it may reference (next to it: ``model.onnx.data``, and
    ``*.data`` such as the embedding a GGUF-derived bundle shares between target and drafter)."""
    names = [graph]
    for f in sorted(model_dir.iterdir()):
        if f.name != Path(graph).name and f.is_file() and (f.name.startswith(Path(graph).name) or f.suffix == ".data"):
            names.append(f.name)
    return names


def ort_composite(target_dir: Path, draft_dir: Path, out: Path, max_draft_tokens: int = 4,
                  draft_block: dict[str, Any] | None = None) -> Path:
    """Make the directory ORT GenAI 0.18 runs draft-model speculative decoding from.

    ``target_dir`` holds the target's ``genai_config.json`` and graph; ``draft_dir`` the
    draft graph (and its ``genai_config.json`` unless ``draft_block`` is given). GenAI
    resolves ``filename`` relative to the config and rejects paths outside it, and both
    builder graphs name their external data ``model.onnx.data``, so each graph goes in its
    own subdirectory (hard links, no copies). The drafter must have the target's full
    vocabulary: GenAI compares draft and target logits position by position.
    """
    tcfg = json.loads((target_dir / "genai_config.json").read_text())
    if draft_block is None:
        draft_block = json.loads((draft_dir / "genai_config.json").read_text())["model"]["decoder"]
    draft_block = copy.deepcopy(draft_block)  # filename is rewritten below; the caller's dict stays as it was
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cfg = copy.deepcopy(tcfg)
    for sub, src, block in (("target", target_dir, cfg["model"]["decoder"]), ("draft", draft_dir, draft_block)):
        graph = block["filename"]
        for name in _graph_files(src, graph):
            _link_or_copy(src / name, out / sub / name)
        block["filename"] = f"{sub}/{graph}"
    cfg["model"]["draft"] = copy.deepcopy(draft_block)
    cfg["speculative"] = {"max_draft_tokens": int(max_draft_tokens)}
    for f in sorted(target_dir.iterdir()):  # tokenizer and processing files
        if f.is_file() and f.suffix in (".json", ".jinja") and f.name != "genai_config.json":
            shutil.copy2(f, out / f.name)
    (out / "genai_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def bundle_composite(bundle: Path, out: Path, max_draft_tokens: int) -> tuple[Path, Path] | str:
    """ORT GenAI directories for an edge-spec bundle's own graphs: (target dir, composite dir), or why not.

    The target graph is a builder-style decoder (same inputs, outputs and GroupQueryAttention KV
    layout as GenAI expects) and the bundle writes its ``genai_config.json``; the drafter gets a
    decoder block made from the manifest. GenAI's speculative loop compares draft and target
    logits position by position, so a drafter with a trimmed vocabulary is given a full-vocabulary
    output first (:func:`untrim_drafter`)."""
    manifest = json.loads((bundle / "edge_spec.json").read_text())
    t, d = manifest["target"], manifest.get("drafter")
    cfg = t.get("genai_config")
    if not cfg or not (bundle / cfg).is_file():
        return "the bundle's target has no genai_config.json (re-export it with the builder-style graph)"
    target_dir = (bundle / cfg).parent
    if d is None:
        return "the bundle has no drafter model"
    block = copy.deepcopy(json.loads((target_dir / "genai_config.json").read_text())["model"]["decoder"])
    block.update(filename=Path(d["graph"]).name, num_hidden_layers=d["num_layers"], head_size=d["head_size"],
                 num_attention_heads=d["num_attention_heads"], num_key_value_heads=d["num_kv_heads"],
                 hidden_size=d["hidden_size"])
    draft_dir = bundle / Path(d["graph"]).parent
    if manifest.get("vocab_trim") or d["vocab_size"] != t["vocab_size"]:
        try:
            draft_dir = untrim_drafter(bundle / d["graph"], bundle / manifest["vocab_trim"]["id_map"],
                                       t["vocab_size"], out.parent / (out.name + "_draft_full"))
        except Exception as exc:  # onnx missing, or a graph this rewrite does not know
            return (f"the bundle's drafter has a trimmed vocabulary ({d['vocab_size']} of {t['vocab_size']} ids) "
                    f"and widening its logits failed ({exc.__class__.__name__}: {exc})")
    return target_dir, ort_composite(target_dir, draft_dir, out, max_draft_tokens, block)


def untrim_drafter(graph: Path, id_map_path: Path, vocab: int, out: Path) -> Path:
    """A copy of a VocabTrim drafter whose logits cover the full vocabulary: the kept ids' logits scattered
    into ``[batch, seq, vocab]`` filled with -1e30 (probability 0, never the argmax), as edge-spec's q is 0
    outside the kept set. Three extra nodes (Transpose, ScatterND, Transpose) on the drafter's output;
    the weights are not touched (external data hard-linked). Returns the directory holding the copy."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    id_map = np.load(id_map_path).astype(np.int64)
    model = onnx.load(str(graph), load_external_data=False)
    g = model.graph
    name = "logits"
    producer = next(n for n in g.node if name in n.output)
    producer.output[list(producer.output).index(name)] = "logits_trimmed"
    g.initializer.extend([numpy_helper.from_array(id_map.reshape(-1, 1), "untrim_ids"),
                          numpy_helper.from_array(np.array([vocab], dtype=np.int64), "untrim_vocab")])
    g.node.extend([
        helper.make_node("Transpose", ["logits_trimmed"], ["untrim_t"], perm=[2, 0, 1]),  # [K, B, S]
        helper.make_node("Shape", ["untrim_t"], ["untrim_shape"], start=1),  # [B, S]
        helper.make_node("Concat", ["untrim_vocab", "untrim_shape"], ["untrim_full_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["untrim_full_shape"], ["untrim_fill"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [-1e30])),  # [V, B, S]
        helper.make_node("ScatterND", ["untrim_fill", "untrim_ids", "untrim_t"], ["untrim_full"]),
        helper.make_node("Transpose", ["untrim_full"], [name], perm=[1, 2, 0]),  # [B, S, V]
    ])
    out_vi = next(o for o in g.output if o.name == name)
    out_vi.type.tensor_type.shape.dim[-1].dim_value = vocab
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in graph.parent.iterdir():
        if f.is_file() and (f.suffix == ".data" or f.name.startswith(graph.name + ".")):
            _link_or_copy(f, out / f.name)
    onnx.save(model, str(out / graph.name))
    return out


def genai_model(path: str, threads: int | None = None, no_spin: bool = False, draft: bool = False) -> Any:
    """An ``og.Model`` of the genai_config in ``path``, its sessions (and the draft's, with ``draft``) on ``threads``
    intra-op threads (None: GenAI's default) and, with ``no_spin``, not spinning."""
    import onnxruntime_genai as og

    config = og.Config(path)
    so: dict[str, Any] = {}
    if threads:
        so["intra_op_num_threads"] = int(threads)
    if no_spin:  # unknown session_options keys become ORT session config entries
        so["session.intra_op.allow_spinning"] = "0"
    if so:
        so = {"session_options": so}
        config.overlay(json.dumps({"model": {"decoder": so, **({"draft": so} if draft else {})}}))
    return og.Model(config)


def genai_generate(model: Any, ids: list[int], max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
                   k: int | None = None, on_token: Any = None) -> tuple[list[int], Any]:
    """GenAI's own C++ loop on one prompt: up to ``max_new_tokens`` tokens (greedy, or plain temperature sampling
    seeded with ``seed``; with ``k``, its speculative mode drafting up to k tokens). ``on_token()`` is called after
    each token. Returns the tokens and the generator (for its speculative stats)."""
    import numpy as np
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    opts: dict[str, Any] = {"max_length": len(ids) + max_new_tokens, "batch_size": 1}
    if temperature > 0:
        # top_k=0 / top_p=1: plain temperature sampling, like the other systems (genai_config says top_k 50)
        opts.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, random_seed=seed)
    else:
        opts.update(do_sample=False)
    params.set_search_options(**opts)
    if k:
        params.set_speculative_options(max_draft_tokens=int(k), min_adaptive_k=0)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    out: list[int] = []
    while not gen.is_done():
        gen.generate_next_token()
        if on_token is not None:
            on_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out, gen


def _ort_genai_worker(spec: dict[str, Any]) -> dict[str, Any]:
    baseline = rss_bytes()
    k = spec.get("k")
    model = genai_model(spec["model"], spec.get("threads"), bool(spec.get("no_spin")), draft=bool(k))
    after_load = rss_bytes()
    temp = float(spec.get("temperature", 0.0))
    stats_acc: dict[str, float] = {}

    def one(ids: list[int], timer, seed: int):
        out, gen = genai_generate(model, ids, spec["max_new_tokens"], temp, seed, k, timer.first)
        extra: dict[str, Any] = {}
        if k:
            st = gen.get_speculative_stats()
            for key in ("rounds", "draft_tokens_proposed", "draft_tokens_evaluated", "draft_tokens_accepted",
                        "tokens_emitted", "total_draft_ms", "total_target_ms", "draft_forward_passes",
                        "target_forward_passes"):
                extra[key] = st.get(key, 0)
        return out, extra

    timer = run_prompts(spec, one)
    res = {"runs": timer.runs, "rss_baseline": baseline, "rss_after_load": after_load,
           **summarise(timer.runs, spec["repeats"])}
    if k:
        measured = [r for r in timer.runs if not r["warmup"]]
        for key in ("rounds", "draft_tokens_proposed", "draft_tokens_evaluated", "draft_tokens_accepted",
                    "tokens_emitted", "total_draft_ms", "total_target_ms", "draft_forward_passes",
                    "target_forward_passes"):
            stats_acc[key] = sum(r.get(key, 0) for r in measured)
        res["spec_stats"] = stats_acc
        res["acceptance"] = stats_acc["draft_tokens_accepted"] / max(1, stats_acc["draft_tokens_proposed"])
        res["tokens_per_target_pass"] = stats_acc["tokens_emitted"] / max(1, stats_acc["rounds"])
        res["gamma"] = int(k)
    return res


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    return _ort_genai_worker(spec)
