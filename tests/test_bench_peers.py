"""The llama.cpp / ORT GenAI comparison's own logic (benchmarks/vs_llamacpp.py and helpers), without the peers.

Pure functions on made-up measurements (targets met or not, generation memory, exactness), the
llama-server arguments of each mode, the profile's arithmetic, and the drafter-logit widening
that lets ORT GenAI run a VocabTrim drafter, on a tiny ONNX graph.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lib import llamacpp  # noqa: E402
from benchmarks.lib import targets as vs_targets  # noqa: E402

MiB = 1 << 20


def test_llamacpp_modes_name_their_speculative_type() -> None:
    # Without --spec-type a llama-architecture draft GGUF is loaded but never drafts: the row would be plain AR.
    draft = llamacpp.server_args("draft", threads=2, draft=Path("d.gguf"), draft_max=6)
    assert draft[draft.index("--spec-type") + 1] == "draft-simple"
    assert draft[draft.index("-md") + 1] == "d.gguf" and draft[draft.index("--spec-draft-n-max") + 1] == "6"
    ngram = llamacpp.server_args("ngram", threads=2, draft_max=8)
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-simple"
    assert llamacpp.server_args("ar", threads=2) == []
    with pytest.raises(ValueError):
        llamacpp.server_args("draft", threads=2)
    with pytest.raises(ValueError):
        llamacpp.server_args("eagle", threads=2)


def test_exactness_counts_identical_prompts_and_first_difference() -> None:
    res = vs_targets._compare([[1, 2, 3], [4, 5, 6], [7, 8, 9]], [[1, 2, 3], [4, 9, 6], [7, 8, 0]])
    assert res["identical"] == 1 and res["prompts"] == 3 and res["tokens"] == 3
    assert res["diverged"] == [{"prompt": 1, "first_diff": 1}, {"prompt": 2, "first_diff": 2}]
    assert "error" in vs_targets._compare(None, [[1]])
    prompts = vs_targets.exact_prompts(200)
    assert len(prompts) == 200 and len(set(prompts)) == 200


def test_plan_line_and_generation_memory() -> None:
    spec = {"plan": "Plan: speculative decoding with the drafter model; context 512 tokens, draft length <= 8; ..."}
    look = {"plan": "Plan: speculative decoding with prompt-lookup drafts (no drafter model); context 300 tokens"}
    ar = {"plan": "Plan: plain autoregressive decoding; context 128 tokens, draft length <= 0"}
    assert vs_targets._plan(spec) == ("speculative", 512)
    assert vs_targets._plan(look) == ("lookup", 300)
    assert vs_targets._plan(ar) == ("ar", 128)
    w = {"target": 100 * MiB, "drafter": 10 * MiB}
    edge = {**spec, "peak_rss": 300 * MiB, "rss_baseline": 60 * MiB}
    assert vs_targets.gen_memory("edge-spec speculative greedy", edge, w) == 130 * MiB  # both models' weights out
    assert vs_targets.gen_memory("edge-spec speculative greedy", {**edge, **look}, w) == 140 * MiB  # no drafter
    llama = {"peak_rss": 220 * MiB, "rss_file": 105 * MiB}
    assert vs_targets.gen_memory("llama.cpp AR greedy", llama, w) == 115 * MiB
    assert vs_targets.gen_memory("llama.cpp AR greedy", {"error": "x"}, w) is None


def _rows(sd: float, llama_ar: float) -> dict[str, dict]:
    plan = "Plan: speculative decoding with the drafter model; context 4096 tokens"
    return {"edge-spec speculative greedy": {"tokens_per_s": sd, "peak_rss": 180 * MiB, "plan": plan},
            "edge-spec speculative T=0.7": {"tokens_per_s": sd},
            "edge-spec AR greedy": {"tokens_per_s": 100.0},
            "llama.cpp AR greedy": {"tokens_per_s": llama_ar, "peak_rss": 220 * MiB},
            "llama.cpp AR T=0.7": {"tokens_per_s": llama_ar},
            "llama.cpp speculative greedy": {"error": "RuntimeError: llama-server exited with 1"}}


def test_targets_met_not_met_and_unmeasured() -> None:
    info = {"edge_context": 4096}
    exact = {"run": {"prompts": 8, "identical": 8, "tokens": 128, "diverged": []},
             "extended": {"prompts": 224, "identical": 224, "tokens": 32, "diverged": []}}
    got = {t["target"]: t for t in vs_targets.targets(_rows(170.0, 100.0), info, {"skipped": "no llama.cpp"}, exact,
                                                      "the bundle has no drafter model", "| table |")}
    assert got["edge-spec speculative / llama.cpp AR, greedy"]["status"] == "met"  # 1.7 >= 1.6
    assert got["edge-spec AR / llama.cpp AR, greedy"]["status"] == "met"
    peak = next(v for k, v in got.items() if k.startswith("peak RSS"))
    assert peak["status"] == "met" and peak["measured"].startswith("0.82x")
    same_drafter = got["edge-spec speculative / llama.cpp speculative (same drafter), greedy"]
    assert same_drafter["status"].startswith("not measured") and "exited with 1" in same_drafter["status"]
    ort = got["edge-spec speculative / ORT GenAI speculative (same graphs, fastest k), greedy"]
    assert "no drafter model" in ort["status"]
    assert next(v for k, v in got.items() if k.startswith("greedy speculative"))["status"] == "met"
    slow = {t["target"]: t for t in vs_targets.targets(_rows(150.0, 100.0), info, {"skipped": "-"}, exact, None,
                                                       "profile_spec.py failed: boom")}
    assert slow["edge-spec speculative / llama.cpp AR, greedy"]["status"] == "not met"  # 1.5 < 1.6
    assert next(v for k, v in slow.items() if k.startswith("profile"))["status"] == "not measured"
    rows = {**_rows(150.0, 100.0), "ORT GenAI speculative k=2 greedy": {"tokens_per_s": 100.0},
            "ORT GenAI speculative k=4 greedy": {"tokens_per_s": 125.0}}
    vs_ort = next(t for t in vs_targets.targets(rows, info, {"skipped": "-"}, exact, None, "")
                  if "ORT GenAI" in t["target"])
    assert vs_ort["measured"].startswith("1.20x") and vs_ort["status"] == "not met"  # against its fastest k
    table = vs_targets.summary_table(list(slow.values()))
    assert table.splitlines()[0] == "| target | measured | goal | status |" and "not met" in table


def test_sweep_target_counts_only_drafter_plans_within_35_percent() -> None:
    free = {"label": "unconstrained", "budget": None, "gen_share": 4.0, "ratio": 1.0, "mode": "speculative",
            "context": 4096}
    lookup = {"label": "0.35 x", "budget": 3, "gen_share": 0.30, "ratio": 1.2, "mode": "lookup", "context": 500}
    tight = {"label": "min", "budget": 2, "gen_share": 0.34, "ratio": 0.97, "mode": "speculative", "context": 300}
    assert vs_targets._sweep_target({"points": [free, lookup, tight]})["status"] == "met"
    fell_back = vs_targets._sweep_target({"points": [free, lookup]})
    assert fell_back["status"] == "not met" and "fell back" in fell_back["measured"]
    over = vs_targets._sweep_target({"points": [free, {**tight, "gen_share": 0.5}]})
    assert over["status"].startswith("not met") and "50%" in over["measured"]


def test_profile_breakdown_attributes_the_rest_to_the_loop() -> None:
    from benchmarks.lib import profile_spec

    step = {"wall": 0.010, "draft": 0.003, "drafter_fwd": 0.0025, "drafter_ort": 0.002, "verify": 0.006,
            "target_fwd": 0.0055, "target_ort": 0.005, "accept": 0.0004, "policy": 0.0001, "tokens": 3, "gamma": 2,
            "drafted": 2, "accepted": 2, "drafter_passes": 2}
    b = profile_spec.breakdown([step, step])
    assert b["drafter_ort"] == pytest.approx(2.0) and b["drafter_bind"] == pytest.approx(0.5)
    assert b["draft_logic"] == pytest.approx(0.5) and b["verify_logic"] == pytest.approx(0.5)
    assert b["loop"] == pytest.approx(10 - 3 - 6 - 0.4 - 0.1)
    parts = sum(b[key] for _, key in profile_spec.COMPONENTS)
    assert parts == pytest.approx(b["total"])  # the table's rows add up to the step
    assert b["acceptance"] == 1.0 and b["tokens"] == 3


def test_untrimmed_drafter_logits_cover_the_full_vocabulary(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from benchmarks.lib import genai as peers

    kept, vocab = 5, 12
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["logits"])], "drafter",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", kept])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", kept])])
    src = tmp_path / "drafter"
    src.mkdir()
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what this onnxruntime reads, whatever the installed onnx writes by default
    onnx.save(model, str(src / "model.onnx"))
    id_map = np.array([0, 3, 4, 9, 11])
    np.save(src / "id_map.npy", id_map)
    out = peers.untrim_drafter(src / "model.onnx", src / "id_map.npy", vocab, tmp_path / "full")
    x = np.random.default_rng(0).standard_normal((1, 3, kept)).astype(np.float32)
    (y,) = ort.InferenceSession(str(out / "model.onnx")).run(None, {"x": x})
    assert y.shape == (1, 3, vocab)
    np.testing.assert_array_equal(y[..., id_map], x)
    rest = np.setdiff1d(np.arange(vocab), id_map)
    assert (y[..., rest] <= -1e29).all()
    assert (y.argmax(-1) == id_map[x.argmax(-1)]).all()  # greedy drafts unchanged


@pytest.mark.slow
def test_profile_and_ort_genai_composite_on_the_demo_bundle(demo_bundle: Path, tmp_path: Path) -> None:
    """The profile's rows add up to measured steps, and ORT GenAI runs the bundle's own graphs speculatively
    (the demo drafter is VocabTrim-ed, so this goes through the widened drafter) with its greedy output
    equal to its plain greedy output on the same target graph."""
    from benchmarks.lib import profile_spec
    from edge_spec import Engine

    engine = Engine.load(demo_bundle, threads=1)
    ids = engine.encode_chat([{"role": "user", "content": "Write a function that adds two numbers."}])
    res = profile_spec.profile(engine, [ids], 2, 12, 0.0)
    spec_steps = [s for s in res["steps"] if s["gamma"] > 0 and not s["from_lookup"]]
    assert spec_steps and all(s["drafter_passes"] >= 1 for s in spec_steps)
    assert all(s["drafter_passes"] == 0 for s in res["steps"] if s["from_lookup"])  # hybrid: lookup drafts are free
    b = profile_spec.breakdown(spec_steps)
    assert b["total"] > 0 and sum(b[key] for _, key in profile_spec.COMPONENTS) == pytest.approx(b["total"])
    assert b["target_ort"] > 0 and b["drafter_ort"] > 0
    assert "| **step total** |" in profile_spec.table("fixed draft length 2", res)

    og = pytest.importorskip("onnxruntime_genai")
    from benchmarks.lib import genai as peers

    dirs = peers.bundle_composite(demo_bundle, tmp_path / "composite", 3)
    assert not isinstance(dirs, str), dirs
    target_dir, composite = dirs

    def greedy(model_dir: Path, spec: bool) -> list[int]:
        model = og.Model(str(model_dir))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + 12, do_sample=False)
        if spec:
            params.set_speculative_options(max_draft_tokens=3, min_adaptive_k=0)
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray([ids], dtype=np.int32))
        out = []
        while not gen.is_done():
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return out

    plain = greedy(target_dir, False)
    assert len(plain) == 12 and greedy(composite, True) == plain


def test_rounds_rotate_the_order_and_rows_keep_their_fastest_round(tmp_path, monkeypatch) -> None:
    """``--rounds``: no system keeps the first slot of every round, and each row is its fastest round's."""
    import argparse
    import json

    from benchmarks import vs_llamacpp

    calls: list[str] = []
    speed = {"edge-spec AR": [50.0, 90.0], "edge-spec speculative": [70.0, 60.0], "llama.cpp AR": [80.0, 85.0],
             "llama.cpp n-gram": [40.0, 45.0], "edge-spec plain": [95.0, 99.0]}

    def fake(name: str):
        def run(*a, **kw) -> dict:
            calls.append(name)
            return {"tokens_per_s": speed[name][sum(c == name for c in calls) - 1]}
        return run

    def edge(*a, speculative: bool, drafting: str | None = None, **kw) -> dict:
        return fake("edge-spec speculative" if speculative else "edge-spec plain" if drafting == "none"
                    else "edge-spec AR")()

    monkeypatch.setattr(vs_llamacpp, "edge", edge)
    monkeypatch.setattr(vs_llamacpp.llamacpp, "run",
                        lambda *a, mode, **kw: fake("llama.cpp AR" if mode == "ar" else "llama.cpp n-gram")())
    (tmp_path / "edge_spec.json").write_text(json.dumps({"drafter": {"kind": "eagle3"}}))
    args = argparse.Namespace(tokens=8, repeats=1, threads=1, ort_k=[], bundle=tmp_path, work=tmp_path, edge_spin=False,
                              context=4096, draft_max=8, llama_poll=None, gguf=Path("t.gguf"), draft_gguf=None,
                              llama_spec_args="", skip_ort=True, ort_spin=False, rounds=2,
                              temperatures=[0.0, 0.7], systems=None, drafting_alone=False)
    speed = {k: v * 2 for k, v in speed.items()}  # greedy and T=0.7 rounds
    rows, _ = vs_llamacpp.run_systems(args, [[1, 2]])
    greedy = calls[:10]
    assert greedy[0] != greedy[5]  # round 2 starts with another system
    assert rows["edge-spec plain greedy"]["tokens_per_s"] == 99.0
    assert rows["edge-spec AR greedy"]["tokens_per_s"] == 90.0
    assert rows["edge-spec AR greedy"]["rounds_tokens_per_s"] == [50.0, 90.0]
    assert rows["edge-spec speculative greedy"]["tokens_per_s"] == 70.0
    calls.clear()
    speed = {k: v * 4 for k, v in speed.items()}
    args.context = None  # found from the speculative row's plan first: that row alone runs once more
    vs_llamacpp.run_systems(args, [[1, 2]])
    assert calls[0] == "edge-spec speculative" and calls[1:].count("edge-spec speculative") == 4
    assert calls.count("edge-spec plain") == 4  # 2 rounds x 2 temperatures, no probe run


def test_llama_request_counts_its_first_token_in_prefill_as_edge_spec_does() -> None:
    """lib/request: llama-server's timings split as edge-spec's stream is (prefill = up to the first token)."""
    from benchmarks.lib.request import llama_request

    class Server:
        def complete(self, ids, n, *, temperature, seed, extra):
            assert extra == {"ignore_eos": True} and n == 4
            return {"tokens": [5, 6, 7, 8], "timings": {"prompt_ms": 100.0, "predicted_ms": 40.0, "predicted_n": 4,
                                                        "draft_n": 3, "draft_n_accepted": 2}}

    r = llama_request(Server(), [1, 2], 4, temperature=0.7, seed=3)
    assert r["prefill_s"] == pytest.approx(0.110) and r["decode_s"] == pytest.approx(0.030)
    assert (r["tokens"], r["token_ids"], r["drafted"], r["accepted"]) == (4, [5, 6, 7, 8], 3, 2)


def test_edge_request_makes_every_token_and_decode_ab_derives_its_fields(demo_bundle: Path) -> None:
    from benchmarks import decode_ab
    from benchmarks.lib.request import edge_request
    from edge_spec import Engine

    engine = Engine.load(demo_bundle, drafting="none", threads=1)
    ids = engine.encode_chat([{"role": "user", "content": "Write a function that adds two numbers."}])
    r = edge_request(engine, ids, 6)
    assert r["tokens"] == len(r["token_ids"]) == 6 and r["prefill_s"] > 0 and r["decode_s"] > 0
    assert r["target_passes"] >= 6 and r["drafted"] == 0  # plain: one pass per token (and the prompt's)
    t = decode_ab.timed(edge_request, engine, ids, 6)
    assert t["tokens"] == 6 and t["whole_tok_s"] > 0 and t["decode_s_per_token"] > 0
