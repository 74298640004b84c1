"""edge-spec distill on a tiny random Llama target (made here, saved as an HF dir): determinism, resume,
the shared-embedding output format, materialisation, and the user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from edge_spec.distill import DistillConfig, distill  # noqa: E402
from edge_spec.distill.data import DataConfig  # noqa: E402
from edge_spec.distill.drafter import load_drafter, spread_layers  # noqa: E402
from edge_spec.distill.materialize import full_checkpoint  # noqa: E402
from edge_spec.distill.run import check_device  # noqa: E402
from edge_spec.distill.sequence import load_sequences  # noqa: E402
from edge_spec.distill.target import file_sha256, load_target  # noqa: E402
from edge_spec.distill.train import TrainConfig  # noqa: E402
from edge_spec.errors import EdgeSpecError  # noqa: E402


def _config(target: Path, out: Path, steps: int = 4, **kw) -> DistillConfig:
    return DistillConfig(target=target, out=out, seed=3, threads=1,
                         data=DataConfig(batch=6, self_instruct=6, magpie=6, max_jobs=5, max_new_tokens=12,
                                         heldout_percent=30, eval_prompts=4),
                         train=TrainConfig(steps=steps, batch_seqs=4, eval_every=2, **kw))


def _quiet(msg: str) -> None:
    pass


def _weights(out: Path) -> dict:
    return load_file(str(out / "model.safetensors"))


def _report(out: Path) -> dict:
    r = json.loads((out / "training.json").read_text())
    return {"history": r["train"]["history"], "final": r["train"]["final"], "steps": r["train"]["steps"],
            "data": {k: v for k, v in r["data"].items() if k != "generation_seconds"}}


def test_same_seed_gives_identical_data_weights_and_report(tiny_target, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    distill(_config(tiny_target, a), _quiet)
    distill(_config(tiny_target, b), _quiet)
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert _report(a) == _report(b)
    for shard in sorted((a / "data").glob("*.npz")):
        za, zb = np.load(shard), np.load(b / "data" / shard.name)
        # answers.npz's metadata records the generation's wall time; its ids and flags must be equal
        assert all(np.array_equal(za[k], zb[k]) for k in za.files if k != "meta")
    # training changed the weights (the test can fail: a no-op trainer would leave the target's layers)
    t = load_target(tiny_target)
    assert not torch.equal(wa["model.layers.0.self_attn.q_proj.weight"].float(),
                           t.model.model.layers[0].self_attn.q_proj.weight.half().float())


def test_magpie_prompts_come_from_the_templates_user_prefix_and_join_the_pool(tiny_target, tmp_path):
    """Magpie: the target is given its chat template up to a user message's text; what it writes there (ended by a
    stop token, 12-400 characters) joins the prompt pool, except the benchmarks' held-apart prompts."""
    from edge_spec.distill import data as D
    from edge_spec.distill.prompts import HELD_APART
    from edge_spec.distill.target import render

    t = load_target(tiny_target)
    prefix = D.magpie_prefix(t.tokenizer)
    full = render(t.tokenizer, [{"role": "user", "content": "Hello there"}])
    assert prefix and full[:len(prefix)] == prefix and len(full) > len(prefix) + 2
    assert t.tokenizer.decode(full[len(prefix):]).startswith("Hello there")  # the user's text comes next
    ids = [np.asarray(t.tokenizer.encode(q, add_special_tokens=False) + [t.stop_ids[0]], np.int32)
           for q in ("How do I bake bread at home?", "Hi", "How do I bake bread at home?")]
    ids.append(np.asarray(t.tokenizer.encode("An unfinished request that never", add_special_tokens=False), np.int32))
    assert D.magpie_prompts(t.tokenizer, ids, t.stop_ids) == ["How do I bake bread at home?"]

    out = tmp_path / "d"
    distill(replace(_config(tiny_target, out, 1), data_only=True), _quiet)
    mq = json.loads((out / "data" / "mq_00000.json").read_text())
    assert mq["asked"] == 6 and isinstance(mq["prompts"], list)
    (out / "data" / "mq_00001.json").write_text(json.dumps({"prompts": ["Plan a picnic for me.",
                                                                        *sorted(HELD_APART)], "seconds": 0}))
    pool = D._pool(replace(_config(tiny_target, out).data), out / "data")
    assert "Plan a picnic for me." in pool and not HELD_APART & set(pool)
    again = tmp_path / "again"  # seeded: the same messages
    distill(replace(_config(tiny_target, again, 1), data_only=True), _quiet)
    assert json.loads((again / "data" / "mq_00000.json").read_text())["prompts"] == mq["prompts"]


def test_data_has_teacher_topk_consistent_with_the_answers(tiny_target, tmp_path):
    distill(_config(tiny_target, tmp_path / "d"), _quiet)
    shards = json.loads((tmp_path / "d" / "data" / "done.json").read_text())["shards"]
    assert shards[0].startswith("si_") and any(s.startswith("gen_00003") for s in shards)  # self-instruct, follow-up
    train, held = load_sequences([tmp_path / "d" / "data" / s for s in shards])
    assert train and held
    evals = [load_sequences([tmp_path / "d" / "data" / f"eval_0000{j}.npz"]) for j in (0, 1)]
    assert [len(e[0]) for e in evals] == [0, 0] and [len(e[1]) for e in evals] == [4, 4]
    assert {s.temp for s in evals[0][1]} == {0.0} and {s.temp for s in evals[1][1]} == {0.7}
    assert [s.ids[:s.prompt_len].tolist() for s in evals[0][1]] == [s.ids[:s.prompt_len].tolist() for s in evals[1][1]]
    train_prompts = {tuple(s.ids[:s.prompt_len]) for s in train}
    assert not any(tuple(s.ids[:s.prompt_len]) in train_prompts for s in evals[0][1])
    for s in train + held:
        n = len(s.ids) - s.prompt_len
        assert s.topk_ids.shape == (n, 32) and s.lse.shape == (n, 2)
        if s.temp == 0.0:  # greedy answers are the teacher's argmax at every position
            assert np.array_equal(s.ids[s.prompt_len:], s.topk_ids[:, 0])
        assert np.all(s.lse[:, 0] >= s.topk_logits[:, 0].astype(np.float32) - 1e-2)


def test_interrupted_run_resumes_to_the_same_weights(tiny_target, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    distill(_config(tiny_target, full, checkpoint_seconds=0.0), _quiet)

    def stop_at_step_3(msg: str) -> None:
        if msg.startswith("train: step 2 "):  # logged after step 2, before its checkpoint (step 1 is saved)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(_config(tiny_target, cut, checkpoint_seconds=0.0), stop_at_step_3)
    assert not (cut / "model.safetensors").exists()
    resumed: list[str] = []
    distill(_config(tiny_target, cut, checkpoint_seconds=0.0), resumed.append)
    assert any(m.startswith("train: resumed at step 1/4") for m in resumed)
    wf, wc = _weights(full), _weights(cut)
    assert all(torch.equal(wf[k], wc[k]) for k in wf)
    assert _report(full)["final"] == _report(cut)["final"]


def test_output_shares_the_embedding_and_materializes_to_an_equal_hf_model(tiny_target, tmp_path):
    out = tmp_path / "drafter"
    distill(_config(tiny_target, out, steps=2), _quiet)
    keys = set(_weights(out))
    assert "model.embed_tokens.weight" not in keys and "lm_head.weight" not in keys
    assert {"model.norm.weight", "model.layers.1.mlp.down_proj.weight"} <= keys
    assert all(v.dtype == torch.float16 for v in _weights(out).values())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["tie_word_embeddings"] is True
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    info = cfg["edge_spec_drafter"]
    assert info["shares_target_embedding"] is True and info["layers_from"] == [0, 3]
    assert info["target_sha256"] == file_sha256(tiny_target)

    full = full_checkpoint(out, tiny_target, tmp_path / "full", dtype=torch.float32)
    plain = transformers.AutoModelForCausalLM.from_pretrained(full, dtype=torch.float32)
    drafter = load_drafter(out, load_target(tiny_target).model)
    ids = torch.randint(0, 8192, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, drafter(ids).logits)
    with pytest.raises(EdgeSpecError, match="already exists"):
        full_checkpoint(out, tiny_target, full)


def test_user_errors_are_one_sentence(tiny_target, tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(EdgeSpecError, match="no CUDA GPU"):
            check_device("cuda")
    with pytest.raises(EdgeSpecError, match="--layers 9"):
        spread_layers(4, 9)
    with pytest.raises(EdgeSpecError, match="does not exist"):
        distill(_config(tmp_path / "missing", tmp_path / "x"), _quiet)
    distill(DistillConfig(target=tiny_target, out=tmp_path / "o", threads=1, data_only=True,
                          data=DataConfig(batch=6, self_instruct=6, magpie=6, max_jobs=2, max_new_tokens=4,
                                          heldout_percent=30)),
            _quiet)
    with pytest.raises(EdgeSpecError, match="other settings"):
        distill(DistillConfig(target=tiny_target, out=tmp_path / "o", seed=5, threads=1, data_only=True), _quiet)


def test_spread_layers_keeps_first_and_last():
    assert spread_layers(30, 1) == [29]
    assert spread_layers(30, 2) == [0, 29]
    assert spread_layers(30, 3) == [0, 14, 29] or spread_layers(30, 3) == [0, 15, 29]


def test_cli_reports_a_missing_target_in_one_sentence(tmp_path, capsys):
    from edge_spec.cli import main

    assert main(["distill", "--target", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge-spec: error: --target") and "does not exist" in err and "\n" not in err


def test_cli_lr_sets_the_peak_rate_of_fresh_and_continuing_runs(tmp_path, monkeypatch, capsys):
    """--lr reaches both the layer drafter's and the head's training configs (continue_lr too: an --init-from run
    uses that field); a rate that is not a positive finite number is refused in one sentence."""
    import edge_spec.distill
    from edge_spec.cli import main

    seen: list[DistillConfig] = []
    monkeypatch.setattr(edge_spec.distill, "distill", lambda cfg, log: seen.append(cfg))
    target = tmp_path / "t.gguf"
    target.write_bytes(b"")
    assert main(["distill", "--target", str(target), "--out", str(tmp_path / "d"), "--lr", "3e-4"]) == 0
    cfg = seen[-1]
    assert cfg.train.lr == cfg.eagle.lr == cfg.eagle.continue_lr == 3e-4
    assert main(["distill", "--target", str(target), "--out", str(tmp_path / "d")]) == 0
    assert seen[-1].eagle.lr == 5e-4 and seen[-1].eagle.continue_lr == 1.5e-4  # the defaults stand without it
    for bad in ("nan", "inf", "0", "x"):
        with pytest.raises(SystemExit) as e:
            main(["distill", "--target", str(target), "--out", str(tmp_path / "d"), "--lr", bad])
        assert e.value.code == 2
        assert "--lr" in capsys.readouterr().err


def test_a_head_run_resumed_at_another_rate_is_refused(tiny_target, tmp_path):
    from edge_spec.distill.eagle_train import EagleTrainConfig

    out = tmp_path / "h"
    distill(_eagle(tiny_target, out, steps=1), _quiet)
    cfg = _eagle(tiny_target, out, steps=2)
    with pytest.raises(EdgeSpecError, match=r"other settings \(lr\)"):
        distill(replace(cfg, eagle=replace(cfg.eagle, lr=EagleTrainConfig().lr / 2)), _quiet)


def test_time_budget_sets_the_step_count(tiny_target, tmp_path):
    from edge_spec.distill.drafter import build_drafter
    from edge_spec.distill.train import train

    out = tmp_path / "t"
    distill(DistillConfig(target=tiny_target, out=out, threads=1, data_only=True,
                          data=DataConfig(batch=6, self_instruct=6, magpie=6, max_jobs=3, max_new_tokens=8,
                                          heldout_percent=30, eval_prompts=2)), _quiet)
    shards = sorted(p for p in (out / "data").glob("*.npz") if p.name != "answers.npz")  # the ids-only copy
    train_seqs, held = load_sequences(shards)
    drafter = build_drafter(load_target(tiny_target).model, [0, 3])
    lines: list[str] = []
    result = train(drafter, train_seqs, held, TrainConfig(batch_seqs=4, eval_every=5), out / "ckpt", 4.0,
                   lines.append)
    assert any(" s/step -> " in m for m in lines)
    assert result["steps"] >= 4 and result["history"][-1]["step"] == result["steps"]


def _eagle(target: Path, out: Path, steps: int = 4, **kw) -> DistillConfig:
    from edge_spec.distill.eagle_train import EagleTrainConfig

    return replace(_config(target, out, steps), kind="eagle3",
                   eagle=EagleTrainConfig(steps=steps, batch_seqs=4, eval_every=2, max_len=48, eval_batch=4,
                                          **{"draft_vocab": 300, **kw}))


def test_eagle3_head_is_deterministic_resumable_and_in_the_published_layout(tiny_target, tmp_path):
    from edge_spec.distill.eagle import load_head, read_head

    full, cut = tmp_path / "full", tmp_path / "cut"
    distill(_eagle(tiny_target, full, checkpoint_seconds=0.0), _quiet)
    again = tmp_path / "again"
    distill(_eagle(tiny_target, again), _quiet)
    wf, wa = _weights(full), _weights(again)
    assert wf.keys() == wa.keys() and all(torch.equal(wf[k], wa[k]) for k in wf)

    def stop_after_step_2(msg: str) -> None:
        if msg.startswith("train: step 2 "):  # logged after step 2's evaluation, before its checkpoint
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(_eagle(tiny_target, cut, checkpoint_seconds=0.0), stop_after_step_2)
    assert not (cut / "model.safetensors").exists()
    resumed: list[str] = []
    distill(_eagle(tiny_target, cut, checkpoint_seconds=0.0), resumed.append)
    assert any(m.startswith("train: resumed at step 1 ") for m in resumed)
    wc = _weights(cut)
    assert all(torch.equal(wf[k], wc[k]) for k in wf)

    cfg, tensors, raw = read_head(full)
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and cfg.aux_layers == (2, 2, 4)
    assert raw["edge_spec_drafter"]["target_sha256"] == file_sha256(tiny_target)
    assert "embed_tokens.weight" not in tensors and tensors["fc.weight"].shape == (64, 3 * 64)
    head = load_head(full)
    assert head.c.draft_vocab == 300 and int(head.t2d.sum()) == 300
    report = json.loads((full / "training.json").read_text())
    assert report["kind"] == "eagle3" and report["train"]["steps"] == 4
    assert report["train"]["history"][0]["step"] == 0 and len(report["train"]["final"]["greedy"]) == 4
    with pytest.raises(EdgeSpecError, match="other settings"):
        distill(replace(_eagle(tiny_target, full), aux_layers=(1, 2, 3)), _quiet)


def test_answers_file_keeps_the_ids_and_a_run_from_it_recomputes_the_teacher(tiny_target, tmp_path, monkeypatch):
    from edge_spec.distill import ids

    first = tmp_path / "first"
    distill(_eagle(tiny_target, first, steps=2), _quiet)
    packed = first / "data" / "answers.npz"
    train, held = load_sequences([first / "data" / s for s in json.loads(
        (first / "data" / "done.json").read_text())["shards"]] + sorted((first / "data").glob("eval_*.npz")))
    r_train, r_held, meta = ids.read(packed)
    assert [s.ids.tolist() for s in r_train] == [s.ids.tolist() for s in train]
    assert [(s.prompt_len, s.temp) for s in r_held] == [(s.prompt_len, s.temp) for s in held]
    assert meta["target_sha256"] == file_sha256(tiny_target)
    assert packed.stat().st_size < 4 * sum(len(s.ids) for s in train + held) + 4096  # ids, not logits
    ids.teacher_targets(load_target(tiny_target).model, r_train, 32, log=_quiet)
    same = sum(int((a.topk_ids[:, 0] == b.topk_ids[:, 0]).sum()) for a, b in zip(r_train, train))
    assert same >= 0.99 * sum(len(s.topk_ids) for s in train)  # teacher-forced == what generation stored
    for a, b in zip(r_train, train):
        np.testing.assert_allclose(a.lse, b.lse, rtol=1e-3, atol=1e-3)

    second = tmp_path / "second"
    report = distill(replace(_eagle(tiny_target, second, steps=2), answers=packed), _quiet)
    assert not (second / "data").exists() and (second / "model.safetensors").exists()
    assert report["data"]["train_tokens"] == sum(len(s.ids) - s.prompt_len for s in train)
    with pytest.raises(EdgeSpecError, match="not an answers file"):
        distill(replace(_eagle(tiny_target, tmp_path / "third"), answers=first / "distill.json"), _quiet)

    # the EAGLE-3 run filled the teacher in its feature pass: the same targets as the separate teacher pass
    from edge_spec.distill.features import extract_features

    one_pass, _, _ = ids.read(packed)
    extract_features(load_target(tiny_target).model, one_pass, (1, 2, 3), tmp_path / "f", 10_000, _quiet,
                     teacher_top_k=32)
    for a, b in zip(one_pass, r_train):
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)
        np.testing.assert_allclose(a.lse, b.lse, rtol=1e-5, atol=1e-5)
    # a run on the same data again (resumed) reads the kept teacher targets: no teacher pass, same values
    import edge_spec.distill.features as et

    again, _, _ = ids.read(packed)
    monkeypatch.setattr(et, "teacher_targets", lambda *a, **k: pytest.fail("the teacher pass ran again"))
    extract_features(load_target(tiny_target).model, again, (1, 2, 3), tmp_path / "f", 10_000, _quiet,
                     teacher_top_k=32)
    for a, b in zip(again, r_train):
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)
        np.testing.assert_array_equal(a.topk_logits, b.topk_logits)
        np.testing.assert_allclose(a.lse, b.lse, rtol=1e-5, atol=1e-5)


def test_an_interrupted_feature_pass_resumes_after_its_last_segment(tiny_target, tmp_path, monkeypatch):
    """The feature pass keeps a segment every ~chunk_positions positions: killed in its third segment, it leaves two
    whole segments (and nothing half-written that is read); started again it computes only the rest, and the
    store reads what one uninterrupted pass computes (features and teacher top-k)."""
    import edge_spec.distill.features as ft
    from edge_spec.distill import ids

    distill(replace(_config(tiny_target, tmp_path / "d", 1), data_only=True), _quiet)
    model = load_target(tiny_target).model

    def run(where, chunk, log=_quiet):
        train, held, _ = ids.read_many([tmp_path / "d" / "data" / "answers.npz"])
        seqs = train + held
        return seqs, ft.extract_features(model, seqs, (1, 2, 3), where, 24, log, teacher_top_k=8, target_sha256="t",
                                         shared=True, chunk_positions=chunk)

    seqs, whole = run(tmp_path / "whole", 10**9)
    chunk = sum(min(len(s.ids), 24) for s in seqs) // 5 + 1  # ~5 segments
    real, calls = ft._compute_segment, []

    def killed_in_the_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(ft, "_compute_segment", killed_in_the_third)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", chunk)
    assert len(list((tmp_path / "cut").glob("feat-*.idx.npz"))) == 2
    monkeypatch.setattr(ft, "_compute_segment", real)
    logs: list[str] = []
    again, store = run(tmp_path / "cut", chunk, logs.append)
    kept = [m for m in logs if "sequences kept" in m]
    assert kept and not kept[0].startswith("features: 0 of"), logs
    assert len(list((tmp_path / "cut").glob("feat-*.idx.npz"))) >= 4
    for i, (a, b) in enumerate(zip(again, seqs, strict=True)):
        np.testing.assert_allclose(store.get(i, 24).astype(np.float32), whole.get(i, 24).astype(np.float32),
                                   rtol=1e-3, atol=1e-3)
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)


def test_a_bf16_feature_pass_is_the_fp32_pass_up_to_bf16_rounding(tiny_target, tmp_path):
    """``bf16=True`` runs the target's decoder matmuls under bfloat16 autocast (as the text's writing does): the
    features differ from float32's (autocast was on) by bfloat16 rounding only, and the teacher's logsumexp, from
    the LM head kept in float32, by little."""
    from edge_spec.distill import ids
    from edge_spec.distill.features import extract_features

    distill(replace(_config(tiny_target, tmp_path / "d", 1), data_only=True), _quiet)
    model = load_target(tiny_target).model
    stores, teach = [], []
    for bf16 in (False, True):
        train, held, _ = ids.read_many([tmp_path / "d" / "data" / "answers.npz"])
        stores.append(extract_features(model, train + held, (1, 2, 3), tmp_path / str(bf16), 24, _quiet,
                                       teacher_top_k=8, target_sha256="t", bf16=bf16))
        teach.append(train + held)
    a = np.concatenate([stores[0].get(i, 24) for i in range(len(teach[0]))]).astype(np.float32)
    b = np.concatenate([stores[1].get(i, 24) for i in range(len(teach[0]))]).astype(np.float32)
    assert not np.array_equal(a, b)
    assert np.abs(a - b).max() <= 0.05 * np.abs(a).max()
    lse_a = np.concatenate([s.lse for s in teach[0]])
    lse_b = np.concatenate([s.lse for s in teach[1]])
    np.testing.assert_allclose(lse_a, lse_b, atol=0.05)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast left the weights alone


def test_init_from_continues_a_saved_head(tiny_target, tmp_path):
    """--init-from starts from a saved head: same draft vocabulary, and before any step it scores what it scored
    when it was saved (the saved fc reads raw features; training's feature scaling is undone exactly)."""
    first = tmp_path / "first"
    prior = distill(_eagle(tiny_target, first, steps=3), _quiet)
    second = tmp_path / "second"
    report = distill(replace(_eagle(tiny_target, second, steps=2), init_from=first,
                             answers=first / "data" / "answers.npz"), _quiet)
    start = report["train"]["history"][0]
    for key in ("greedy", "t07"):
        assert start[key] == pytest.approx(prior["train"]["final"][key], abs=0.02)
    a, b = (json.loads((d / "config.json").read_text()) for d in (first, second))
    assert a["draft_vocab_size"] == b["draft_vocab_size"]
    assert report["init_from"]["path"] == str(first) and report["init_from"]["steps"] == 3
    assert f"Continued from `{first}` (3 steps" in (second / "MODEL_CARD.md").read_text()
    with pytest.raises(EdgeSpecError, match="--kind eagle3"):
        distill(replace(_config(tiny_target, tmp_path / "layers", 0), init_from=first), _quiet)
    with pytest.raises(EdgeSpecError, match="not an EAGLE-3 head directory"):
        distill(replace(_eagle(tiny_target, tmp_path / "third", steps=1), init_from=tmp_path), _quiet)
    assert not (tmp_path / "third").exists()  # refused before anything was written


def test_the_card_names_text_the_target_did_not_write(tiny_target, tmp_path):
    """An answers file whose meta names a source (teacher-forced text such as sharegpt.py's ShareGPT replies) is
    reported as such, with its training tokens, in training.json and MODEL_CARD.md; the target's own are not."""
    from edge_spec.distill.ids import pack, read

    first = tmp_path / "first"
    distill(_eagle(tiny_target, first, steps=1), _quiet)
    assert "answer tokens written by the target for" in (first / "MODEL_CARD.md").read_text()
    train, held, meta = read(first / "data" / "answers.npz")
    other = pack(train, held, tmp_path / "other.npz", {**meta, "source": "replies of another model"})
    report = distill(replace(_eagle(tiny_target, tmp_path / "h", steps=1), answers=other), _quiet)
    (entry,) = report["data"]["answers"]["files"]
    assert entry["source"] == "replies of another model"
    assert entry["train_tokens"] == report["data"]["train_tokens"] == sum(len(s.ids) - s.prompt_len for s in train)
    card = (tmp_path / "h" / "MODEL_CARD.md").read_text()
    assert f"except text from other writers read teacher-forced ({entry['train_tokens']:,} in `{other}`: " \
           "replies of another model)" in card


def test_the_card_says_what_it_did_not_measure_and_names_the_target_by_its_file(tiny_target, tmp_path):
    """A head whose held-out answers hold none sampled at T=0.7 gets "not measured" there, not a row of 0.000; an
    answers file that says only how the target wrote it ("origin") is the target's own text; the card names the
    target by its file name, not the path it was trained from."""
    from edge_spec.distill.card import render_eagle_card
    from edge_spec.distill.ids import pack, read

    first = tmp_path / "first"
    distill(_eagle(tiny_target, first, steps=1), _quiet)
    train, held, meta = read(first / "data" / "answers.npz")
    own = pack(train, held, tmp_path / "own.npz", {**meta, "origin": "prompts answered greedily by the target"})
    report = distill(replace(_eagle(tiny_target, tmp_path / "h", steps=1), answers=own), _quiet)
    card = (tmp_path / "h" / "MODEL_CARD.md").read_text()
    assert "answer tokens written by the target for" in card and "other writers" not in card
    assert f"A feature drafter for `{Path(report['target']['path']).name}` (sha256" in card
    for h in [*report["train"]["history"], report["train"]["final"]]:
        h["t07_positions"], h["t07"] = 0, [0.0] * len(h["t07"])
    card = render_eagle_card(report)
    assert "| T=0.7 E[Σ min(p,q)]: no held-out answer was sampled at T=0.7 | not measured |" in card
    assert "T=0.7 after training" not in card
    assert all(line.endswith("| — |") for line in card.splitlines() if line.startswith("| 0 |"))
    from edge_spec.distill.eagle_train import format_acceptance  # the progress lines say so too

    line = format_acceptance(report["train"]["final"])
    assert "T=0.7 not measured" in line and "T=0.7 0.000" not in line


def test_head_mlp_sets_a_fresh_heads_width_and_widens_a_continued_one_without_undoing_it(tiny_target, tmp_path):
    """--head-mlp: a fresh head of another MLP width trains and saves at that width; a continued head made wider
    scores before its first step what it scored when saved (the new units start silent); a run resumed at another
    width is refused; a layer drafter refuses the flag."""
    first = tmp_path / "first"
    prior = distill(_eagle(tiny_target, first, steps=2, mlp=96), _quiet)  # the tiny target's MLP: 128 units
    assert json.loads((first / "config.json").read_text())["intermediate_size"] == 96
    assert prior["drafter"]["mlp"] == 96
    wide = tmp_path / "wide"
    report = distill(replace(_eagle(tiny_target, wide, steps=2, mlp=200), init_from=first,
                             answers=first / "data" / "answers.npz"), _quiet)
    start = report["train"]["history"][0]
    for key in ("greedy", "t07"):
        assert start[key] == pytest.approx(prior["train"]["final"][key], abs=0.02)
    assert json.loads((wide / "config.json").read_text())["intermediate_size"] == 200
    assert load_file(str(wide / "model.safetensors"))["midlayer.mlp.down_proj.weight"].shape == (64, 200)
    cfg = replace(_eagle(tiny_target, wide, steps=3, mlp=256), init_from=first, answers=first / "data" / "answers.npz")
    with pytest.raises(EdgeSpecError, match=r"other settings \(mlp\)"):
        distill(cfg, _quiet)
    with pytest.raises(EdgeSpecError, match="--head-mlp"):
        distill(replace(_config(tiny_target, tmp_path / "layers", 1), eagle=cfg.eagle), _quiet)


def test_features_dir_lets_a_continuing_run_skip_the_feature_and_teacher_passes(tiny_target, tmp_path):
    """--features DIR keeps the target's features and teacher top-k: a second run on the same data (continuing the
    first head into another --out) computes neither, and trains exactly as if it had."""
    first = tmp_path / "first"
    distill(_eagle(tiny_target, first, steps=2), _quiet)
    answers, feats = first / "data" / "answers.npz", tmp_path / "feats"
    logs: dict[str, list[str]] = {}
    reports = {}
    for name, features in (("a", feats), ("b", feats), ("fresh", None)):
        logs[name] = []
        reports[name] = distill(replace(_eagle(tiny_target, tmp_path / name, steps=2), init_from=first,
                                        answers=answers, features=features), logs[name].append)
    computed = [[m for m in logs[n] if m.startswith(("features:", "teacher:"))] for n in ("a", "b", "fresh")]
    assert computed[0] and not computed[1] and computed[2]  # only the first run with the shared dir computed them
    assert not (tmp_path / "a" / "features").exists() and len(list(feats.glob("feat-*.f16"))) == 1
    assert reports["b"]["train"]["final"] == reports["a"]["train"]["final"] == reports["fresh"]["train"]["final"]
    with pytest.raises(EdgeSpecError, match="--kind eagle3"):
        distill(replace(_config(tiny_target, tmp_path / "layers", 0), features=feats), _quiet)


def test_feature_store_grows_with_the_data_and_computes_only_new_sequences(tiny_target, tmp_path):
    """Features are kept per sequence: a run on more data computes only the sequences no earlier run did, and
    reads exactly what a fresh pass would compute (features and teacher top-k); a half-written segment is never
    read; a run's own directory keeps only what its data uses."""
    from edge_spec.distill import ids
    from edge_spec.distill.features import extract_features, sequence_keys

    files = []
    for seed in (0, 1):
        distill(replace(_config(tiny_target, tmp_path / f"s{seed}", 1), seed=seed, data_only=True), _quiet)
        files.append(tmp_path / f"s{seed}" / "data" / "answers.npz")
    model = load_target(tiny_target).model
    shared = tmp_path / "shared"

    def run(paths, where, share=True):
        train, held, _ = ids.read_many(paths)
        logs: list[str] = []
        store = extract_features(model, train + held, (1, 2, 3), where, 24, logs.append, teacher_top_k=8,
                                 target_sha256="t", shared=share)
        return train + held, store, logs

    first, _, logs = run(files[:1], shared)
    assert any(f"computing {len(first):,}" in m for m in logs)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = shared / f"feat-x-interrupted.f16.{gone.pid}.tmp"  # what a killed pass leaves
    live = shared / f"feat-x-writing.f16.{os.getpid()}.tmp"  # what a running one is writing
    for f in (dead, live):
        f.write_bytes(b"\0" * 64)
    both, store, logs = run(files, shared)
    assert not dead.exists() and live.exists()  # a dead writer's rows are deleted, a live one's left alone
    seen = {k.tobytes() for k in sequence_keys(first, 24)}  # alike in their first 24 ids: features alike
    kept = sum(k.tobytes() in seen for k in sequence_keys(both, 24))
    assert len(first) <= kept < len(both)
    assert any(f"{kept:,} of {len(both):,} sequences kept" in m for m in logs), logs
    assert any(f"computing {len(both) - kept:,}" in m for m in logs)
    fresh_seqs, fresh, _ = run(files, tmp_path / "fresh", share=False)
    for i, (a, b) in enumerate(zip(both, fresh_seqs, strict=True)):
        np.testing.assert_array_equal(store.get(i, 24), fresh.get(i, 24))
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)
        np.testing.assert_allclose(a.lse, b.lse, rtol=1e-5, atol=1e-5)
    assert store.rows == fresh.rows == sum(min(len(s.ids), 24) for s in both)
    _, _, logs = run(files, shared)
    assert not any(m.startswith(("features:", "teacher:")) for m in logs)  # nothing left to compute
    assert len(list(shared.glob("feat-*.idx.npz"))) == 2
    run(files[1:], tmp_path / "fresh", share=False)  # a run's own directory: only the segment it uses stays
    assert len(list((tmp_path / "fresh").glob("feat-*.idx.npz"))) == 1


def test_answers_of_several_runs_merge_without_repeats(tiny_target, tmp_path):
    """Data accumulates across runs: --data takes several answers files (other seeds, other sessions), keeps each
    sequence once, and with --data-only writes their union as one answers file; another target's file is refused."""
    from edge_spec.distill import ids

    runs = {}
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}"
        distill(replace(_config(tiny_target, out, 1), seed=seed, data_only=True), _quiet)
        runs[seed] = out / "data" / "answers.npz"
    t0, h0, _ = ids.read(runs[0])
    t1, h1, _ = ids.read(runs[1])
    key = {(s.prompt_len, tuple(s.ids.tolist())) for s in t0 + h0 + t1 + h1}
    train, held, meta = ids.read_many([runs[0], runs[1], runs[0]])  # the repeated file adds nothing
    assert len(train) + len(held) == len(key) and len(key) > len(t0) + len(h0)
    assert [f["kept"] for f in meta["files"]] == [len(t0) + len(h0), len(key) - len(t0) - len(h0), 0]
    assert {s.temp for s in train} <= {0.0, 0.7, 1.0} and all(s.ids.dtype == np.int32 for s in train)

    merged = tmp_path / "merged"
    distill(replace(_config(tiny_target, merged, 1), answers=(runs[0], runs[1]), data_only=True), _quiet)
    m_train, m_held, m_meta = ids.read(merged / "data" / "answers.npz")
    assert [s.ids.tolist() for s in m_train] == [s.ids.tolist() for s in train]
    assert len(m_held) == len(held) and m_meta["target_sha256"] == file_sha256(tiny_target)

    other = tmp_path / "other.npz"
    ids.pack(t0, h0, other, {"target_sha256": "f" * 64})
    with pytest.raises(EdgeSpecError, match="another target"):
        ids.read_many([runs[0], other])


def test_answers_that_mark_none_held_out_have_prompts_held_out(tiny_target, tmp_path):
    """An answers file written outside distill may mark no answer held out (models/coder-data's): a run on it holds
    out the configured share by a hash of the prompt ids — stable, independent of file order, a prompt on one side
    only — and trains, instead of stopping for want of held-out text."""
    from edge_spec.distill import ids

    gen = tmp_path / "gen"
    distill(replace(_config(tiny_target, gen, 1), data_only=True), _quiet)
    t, h, _ = ids.read(gen / "data" / "answers.npz")
    flat = tmp_path / "flat.npz"
    ids.pack(t + h, [], flat, {"target_sha256": file_sha256(tiny_target)})
    kept, held = ids.split_heldout(t + h, 30)
    again_kept, again_held = ids.split_heldout(list(reversed(t + h)), 30)
    key = {s.ids[:s.prompt_len].tobytes() for s in held}
    assert held and kept and len(kept) + len(held) == len(t + h)
    assert {s.ids.tobytes() for s in again_held} == {s.ids.tobytes() for s in held}
    assert not key & {s.ids[:s.prompt_len].tobytes() for s in kept}
    report = distill(replace(_config(tiny_target, tmp_path / "train", 1), answers=(flat,)), _quiet)
    assert report["data"]["heldout_sequences"] == len(held) and report["data"]["train_sequences"] == len(kept)


def test_builtin_prompts_are_distinct_deterministic_and_keep_the_benchmark_prompts_out():
    """The distillation pool never holds a prompt the benchmarks measure drafters on, so acceptance on
    benchmarks/chat_prompts.py is acceptance on unseen prompts."""
    import sys

    from edge_spec.distill.prompts import builtin_prompts

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.lib.prompts import ALL_CHAT_PROMPTS, CHAT_PROMPTS

    pool = builtin_prompts()
    assert pool == builtin_prompts() and len(set(pool)) == len(pool) > 3000
    assert ALL_CHAT_PROMPTS[:len(CHAT_PROMPTS)] == CHAT_PROMPTS and len(set(ALL_CHAT_PROMPTS)) == 96
    assert not set(ALL_CHAT_PROMPTS) & set(pool)
    assert all("{" not in p for p in pool)  # every template filled


def test_precision_bf16_trains_under_autocast_and_auto_follows_the_cpu(tiny_target, tmp_path, monkeypatch):
    """--precision bf16 runs the training steps' matmuls in bfloat16 (the weights differ from an fp32 run's, the
    reports and cards say which); auto picks bf16 only where the CPU multiplies it natively; a bad value is one
    sentence."""
    from edge_spec.distill import run as run_mod

    first = tmp_path / "fp32"
    base = distill(replace(_eagle(tiny_target, first, steps=2), precision="fp32"), _quiet)
    for kind, cfg in (("eagle3", _eagle(tiny_target, tmp_path / "bf16", steps=2)),
                      ("layers", _config(tiny_target, tmp_path / "layers-bf16", 2))):
        cfg = replace(cfg, precision="bf16", answers=first / "data" / "answers.npz")
        report = distill(cfg, _quiet)
        assert report["precision"] == "bf16", kind
        assert "bf16 matmuls" in (cfg.out / "MODEL_CARD.md").read_text(), kind
    assert base["precision"] == "fp32" and "bf16" not in (first / "MODEL_CARD.md").read_text()
    same_data = distill(replace(_eagle(tiny_target, tmp_path / "fp32-again", steps=2), precision="fp32",
                                answers=first / "data" / "answers.npz"), _quiet)
    assert same_data["precision"] == "fp32"
    wa, wb = _weights(tmp_path / "fp32-again"), _weights(tmp_path / "bf16")
    assert any(not torch.equal(wa[k], wb[k]) for k in wa if k.startswith("midlayer")), "bf16 autocast was not applied"
    monkeypatch.setattr(run_mod, "cpu_has_bf16", lambda: True)
    assert run_mod.train_precision("auto", "cpu") == "bf16" and run_mod.train_precision("auto", "cuda") == "fp32"
    monkeypatch.setattr(run_mod, "cpu_has_bf16", lambda: False)
    assert run_mod.train_precision("auto", "cpu") == "fp32" and run_mod.train_precision("bf16", "cpu") == "bf16"
    with pytest.raises(EdgeSpecError, match="--precision 'fp8' is not known"):
        run_mod.train_precision("fp8", "cpu")


def test_bf16_generation_runs_the_decoder_in_bfloat16_and_the_head_in_float32(tiny_target, tmp_path):
    """--precision bf16 also covers generation: the decoder's matmuls in bfloat16, the LM head (the teacher's
    logits kept with the text) in float32, the head's own forward restored afterwards; each shard says how it
    was written."""
    from edge_spec.distill.data import generate

    t = load_target(tiny_target)
    seen: dict[str, set] = {"layer": set(), "head": set()}
    hooks = [t.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen["layer"].add(o.dtype)),
             t.model.lm_head.register_forward_hook(lambda m, i, o: seen["head"].add(o.dtype))]
    prompts = [[5, 6, 7, 8], [9, 10]]
    fast = generate(t.model, prompts, 0.0, 6, t.stop_ids, 4, 0, 0, bf16=True)
    assert seen == {"layer": {torch.bfloat16}, "head": {torch.float32}}
    assert "forward" not in vars(t.model.lm_head)  # the class's forward again
    seen = {"layer": set(), "head": set()}
    ref = generate(t.model, prompts, 0.0, 6, t.stop_ids, 4, 0, 0)
    assert seen == {"layer": {torch.float32}, "head": {torch.float32}}
    for h in hooks:
        h.remove()
    for a, b in zip(fast, ref):
        assert a["topk_logits"].shape == (len(a["answer"]), 4) and a["lse"].shape == (len(a["answer"]), 2)
        assert a["lse"].dtype == b["lse"].dtype == np.float32
    hooked = t.model.lm_head.forward  # a forward the module already had as its own (as accelerate's hooks set)
    t.model.lm_head.forward = hooked
    generate(t.model, prompts, 0.0, 2, t.stop_ids, 4, 0, 0, bf16=True)
    assert vars(t.model.lm_head)["forward"] is hooked
    del t.model.lm_head.forward

    for precision in ("bf16", "fp32"):
        out = tmp_path / precision
        distill(replace(_config(tiny_target, out), precision=precision, data_only=True), _quiet)
        sides = [json.loads(p.read_text()) for p in sorted((out / "data").glob("gen_*.json"))]
        assert sides and {s["precision"] for s in sides} == {precision}


def test_generation_keeps_the_features_a_teacher_forced_pass_computes(tiny_target, tmp_path):
    """An EAGLE-3 run keeps the target's aux features as its text is written (left-padded batch, KV cache): they
    are the teacher-forced pass's features, and the run's feature pass then has nothing left to compute."""
    from edge_spec.distill.data import generate
    from edge_spec.distill.features import FeatureWriter, extract_features
    from edge_spec.distill.sequence import Sequence
    from edge_spec.distill.target import render

    t = load_target(tiny_target)
    aux = (0, 2, 4)
    prompts = [render(t.tokenizer, [{"role": "user", "content": q}])
               for q in ("Hi", "Tell me about the sea, the sky and the mountains", "Why?")]
    for temp in (0.0, 1.0):
        res = generate(t.model, prompts, temp, 10, (1, 2, 7), 4, 5, 0, aux=aux)
        seqs = [Sequence(np.concatenate([np.asarray(p, np.int32), r["answer"]]), len(p), temp, r["topk_ids"],
                         r["topk_logits"], r["lse"]) for p, r in zip(prompts, res, strict=True)]
        assert all(r["features"].shape == (len(s.ids), 3 * 64) for r, s in zip(res, seqs, strict=True))
        gen_dir = tmp_path / f"gen{temp}"
        FeatureWriter(gen_dir, aux, 40, "t").write([(s.ids, s.prompt_len) for s in seqs], [r["features"] for r in res])
        logs: list[str] = []
        kept = extract_features(t.model, seqs, aux, gen_dir, 40, logs.append, target_sha256="t", shared=True)
        assert not any(m.startswith("features:") for m in logs)
        fresh = extract_features(t.model, seqs, aux, tmp_path / f"fresh{temp}", 40, _quiet, target_sha256="t")
        for i, s in enumerate(seqs):
            a, b = kept.get(i, 40).astype(np.float32), fresh.get(i, 40).astype(np.float32)
            assert a.shape == b.shape == (min(len(s.ids), 40), 3 * 64)
            np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2 * float(np.abs(b).max()))

    logs = []
    distill(_eagle(tiny_target, tmp_path / "run", steps=1), logs.append)
    assert not any(m.startswith("features:") for m in logs), [m for m in logs if m.startswith("features:")]
    assert list((tmp_path / "run" / "features").glob("feat-*.idx.npz"))


def test_a_time_budget_holds_when_training_steps_slow_down(tiny_target, tmp_path, monkeypatch):
    """A time budget holds: the step count is re-planned as steps slow down (a 60-minute first hour ran 65 when it
    was planned once from the first 5 steps)."""
    import time

    from edge_spec.distill import eagle_init, eagle_train, ids
    from edge_spec.distill.features import aux_scale, extract_features

    distill(replace(_config(tiny_target, tmp_path / "data", 1), data_only=True), _quiet)
    train_seqs, held, _ = ids.read(tmp_path / "data" / "data" / "answers.npz")
    model = load_target(tiny_target).model
    aux = (1, 2, 4)
    store = extract_features(model, train_seqs + held, aux, tmp_path / "f", 48, _quiet, teacher_top_k=8)
    scale = aux_scale(store, len(aux))
    kept = eagle_init.choose_vocab(train_seqs, model.config.vocab_size, 300)
    head = eagle_init.init_head(model, eagle_init.head_config(model, aux, len(kept)), kept, scale)
    real, calls = eagle_train._loss, [0]

    def slower(*args, **kwargs):
        calls[0] += 1
        if calls[0] > 5:  # after the steps the first plan is made from
            time.sleep(0.03)
        return real(*args, **kwargs)

    monkeypatch.setattr(eagle_train, "_loss", slower)
    cfg = eagle_train.EagleTrainConfig(batch_seqs=4, eval_every=20, max_len=48, eval_batch=4)
    t0 = time.time()
    report = eagle_train.train_head(head, model.model.embed_tokens, train_seqs, held, store, scale, cfg,
                                    tmp_path / "ckpt", 4.0, _quiet)
    assert time.time() - t0 <= 4.0 * 1.2 and report["seconds"] <= 4.0 * 1.2, report["seconds"]
    assert report["steps"] > 20


def test_a_rerun_with_a_smaller_budget_keeps_the_shards_already_written(tiny_target, tmp_path):
    """A data run cut short (here: its done marker removed) and run again with fewer --minutes than it has already
    spent generating keeps every shard it wrote and generates none: the budget only stops new jobs."""
    out = tmp_path / "d"
    cfg = DistillConfig(target=tiny_target, out=out, threads=1, data_only=True,
                        data=DataConfig(batch=6, self_instruct=6, magpie=0, max_jobs=4, max_new_tokens=8,
                                        heldout_percent=30, eval_prompts=2))
    distill(cfg, _quiet)
    first = json.loads((out / "data" / "done.json").read_text())["shards"]
    assert len([s for s in first if s.startswith("gen_")]) == 3  # max_jobs counts the self-instruct shard too
    (out / "data" / "done.json").unlink()
    (out / "data" / "answers.npz").unlink()
    written = sorted(p.name for p in (out / "data").glob("*.npz"))
    distill(replace(cfg, minutes=0.001), _quiet)  # a 0.024 s generation budget, long spent
    assert json.loads((out / "data" / "done.json").read_text())["shards"] == first
    assert sorted(p.name for p in (out / "data").glob("*.npz")) == sorted(written + ["answers.npz"])


def test_teacher_targets_computed_for_kept_features_are_kept_for_the_next_run(tiny_target, tmp_path):
    """Features written with the text have no teacher top-k beside them (the text's shards carry it); a run on the
    ids alone computes it once and keeps it beside each segment it read whole, so the next run on the same data and
    --features DIR skips that pass too, and trains exactly as the first did."""
    first = tmp_path / "first"
    distill(_eagle(tiny_target, first, steps=2), _quiet)
    feats, answers = first / "features", first / "data" / "answers.npz"
    assert list(feats.glob("*.idx.npz")) and not list(feats.glob("*.teacher*.npz"))
    logs: dict[str, list[str]] = {}
    reports = {}
    for name in ("a", "b"):
        logs[name] = []
        reports[name] = distill(replace(_eagle(tiny_target, tmp_path / name, steps=2), init_from=first,
                                        answers=answers, features=feats), logs[name].append)
    passes = [[m for m in logs[n] if m.startswith("teacher:") and "computing" in m] for n in ("a", "b")]
    assert passes[0] and not passes[1]
    assert len(list(feats.glob("*.teacher*.npz"))) == len(list(feats.glob("*.idx.npz")))
    assert reports["b"]["train"]["final"] == reports["a"]["train"]["final"]


def test_cli_ttt_depth_and_draft_vocab_reach_the_heads_config(tiny_target, tmp_path, monkeypatch, capsys):
    """--ttt-depth and --draft-vocab reach the head's training config (the defaults stand without them; a depth of
    0 is refused in one sentence); a run trains at that depth, a resume at another is refused, and a layer drafter
    refuses the flag."""
    import edge_spec.distill
    from edge_spec.cli import main
    from edge_spec.distill.eagle_train import EagleTrainConfig

    seen: list[DistillConfig] = []
    with monkeypatch.context() as m:
        m.setattr(edge_spec.distill, "distill", lambda cfg, log: seen.append(cfg))
        args = ["distill", "--target", str(tiny_target), "--out", str(tmp_path / "d"), "--kind", "eagle3"]
        assert main(args + ["--ttt-depth", "1"]) == 0 and seen[-1].eagle.depth == 1
        assert main(args) == 0 and seen[-1].eagle.depth == EagleTrainConfig.depth == 3
        assert seen[-1].eagle.draft_vocab is None  # 8,192 for a fresh head, the prior's size for a continued one
        assert main(args + ["--draft-vocab", "16384"]) == 0 and seen[-1].eagle.draft_vocab == 16384
        with pytest.raises(SystemExit) as e:
            main(args + ["--ttt-depth", "0"])
        assert e.value.code == 2 and "--ttt-depth" in capsys.readouterr().err
    out = tmp_path / "h"
    report = distill(_eagle(tiny_target, out, steps=2, depth=1), _quiet)
    assert report["train"]["config"]["depth"] == 1
    assert json.loads((out / "checkpoint-eagle3" / "train.json").read_text())["depth"] == 1
    with pytest.raises(EdgeSpecError, match=r"other settings \(depth\)"):
        distill(_eagle(tiny_target, out, steps=3, depth=2), _quiet)
    with pytest.raises(EdgeSpecError, match="--ttt-depth"):
        distill(replace(_config(tiny_target, tmp_path / "layers", 1), eagle=EagleTrainConfig(depth=1)), _quiet)


def test_draft_vocab_sizes_a_fresh_head_and_grows_a_continued_one(tiny_target, tmp_path):
    """--draft-vocab: a fresh head has that many tokens; a continued head grown to more keeps all of its own and adds
    the most written of the rest (training and saving at the new size); a smaller size than the prior's, or the flag
    on a layer drafter, is refused in one sentence."""
    from edge_spec.distill.eagle import load_head
    from edge_spec.distill.eagle_train import EagleTrainConfig

    first = tmp_path / "first"
    distill(_eagle(tiny_target, first, steps=2, draft_vocab=150), _quiet)
    prior = load_head(first)
    assert prior.c.draft_vocab == 150
    answers = first / "data" / "answers.npz"
    big = tmp_path / "big"
    report = distill(replace(_eagle(tiny_target, big, steps=2, draft_vocab=200), init_from=first, answers=answers),
                     _quiet)
    head = load_head(big)
    assert head.c.draft_vocab == report["drafter"]["draft_vocab"] == 200
    assert set(prior.draft_to_target.tolist()) < set(head.draft_to_target.tolist())
    assert json.loads((big / "config.json").read_text())["draft_vocab_size"] == 200
    same = distill(replace(_eagle(tiny_target, tmp_path / "same", steps=1, draft_vocab=None), init_from=first,
                           answers=answers), _quiet)
    assert same["drafter"]["draft_vocab"] == 150  # no --draft-vocab: the prior's own
    with pytest.raises(EdgeSpecError, match="only grow"):
        distill(replace(_eagle(tiny_target, tmp_path / "small", steps=1, draft_vocab=100), init_from=first,
                        answers=answers), _quiet)
    with pytest.raises(EdgeSpecError, match="--draft-vocab"):
        distill(replace(_config(tiny_target, tmp_path / "layers", 1), eagle=EagleTrainConfig(draft_vocab=100)),
                _quiet)


def test_the_cards_command_names_home_paths_as_the_shell_expands_them(monkeypatch, tmp_path):
    from edge_spec.cli.distill_cmd import reproduce_command

    monkeypatch.setenv("HOME", str(tmp_path))
    home = str(tmp_path)
    cmd = reproduce_command(["distill", "--target", f"{home}/m/t.gguf", "--out", f"{home}/a b", "--data", "rel.npz"])
    assert cmd == f"edge-spec distill --target ~/m/t.gguf --out '{home}/a b' --data rel.npz"  # a space: kept whole
