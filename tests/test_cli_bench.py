"""edge-spec bench on the demo bundle with tiny settings: table, report, plots, budget sweep, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_spec.cli import bench_cmd, main

pytest.importorskip("matplotlib")


@pytest.mark.slow
def test_bench_report_plots_and_sweep(capsys, tmp_path: Path, demo_bundle: Path) -> None:
    prompts = tmp_path / "prompts.tsv"
    prompts.write_text("# comment\ncode\tdef add(a, b):\\n\nchat\tWrite a function that adds two numbers.\n")
    out = tmp_path / "report"
    rc = main(["bench", str(demo_bundle), "--prompts", str(prompts), "--max-new-tokens", "16", "--repeats", "1",
               "--out", str(out), "--budget-sweep", "10MB,200MB"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    assert "speedup" in stdout and "peak RSS" in stdout and "refused" in stdout
    assert "(min–max)" in stdout and "warm-up" in stdout  # the spread is stated, after a warm-up
    for name in ("report.md", "bench.png", "sweep.png", "results.json"):
        assert (out / name).is_file(), name
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    for needle in ("## Throughput", "| code | greedy |", "| chat | T=0.7 |", "## Draft lengths", "## Memory",
                   "![speedup and acceptance per category](bench.png)", "## Memory budget sweep", "sweep.png"):
        assert needle in report, needle
    res = json.loads((out / "results.json").read_text())
    assert len(res["records"]) == 2 * 2 * 2  # prompts x samplings x (AR, speculative)
    assert all(r["tokens"] == 16 for r in res["records"])  # fixed length: stop tokens ignored
    refused, ok = res["sweep"]
    assert not refused["ok"] and "raise memory_budget" in refused["error"]
    assert ok["ok"] and ok["mode"] == "speculative" and ok["tokens_per_second"] > 0
    assert 0 < ok["tps_min"] <= ok["tps_median"] <= ok["tps_max"]
    assert 0 < ok["peak_rss"] <= ok["budget"]  # per-process peak (VmHWM), within the budget the plan promised


def test_probe_finds_the_planners_lower_bound(demo_bundle: Path) -> None:
    from edge_spec.bundle import read_manifest
    from edge_spec.errors import BudgetError
    from edge_spec.runtime.budget import plan_memory

    p = bench_cmd._probe(str(demo_bundle))
    m = read_manifest(demo_bundle)
    assert plan_memory(m, p["lower_bound"], p["baseline"]).mode in ("ar", "lookup")
    with pytest.raises(BudgetError):
        plan_memory(m, p["lower_bound"] - 1, p["baseline"])
    assert p["lower_bound"] < p["unbounded"]


def _fails(capsys, argv: list[str], *needles: str) -> None:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse rejects bad option values before any command runs
        rc = exc.code
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edge-spec: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]


def test_bench_bad_input(capsys, tmp_path: Path, demo_bundle: Path) -> None:
    b = str(demo_bundle)
    _fails(capsys, ["bench", b, "--prompts", str(tmp_path / "none.txt")], "does not exist")
    (tmp_path / "empty.txt").write_text("# only a comment\n\n")
    _fails(capsys, ["bench", b, "--prompts", str(tmp_path / "empty.txt")], "no prompts")
    _fails(capsys, ["bench", b, "--budget-sweep", "big,bigger"], "not a size")
    _fails(capsys, ["bench", b, "--repeats", "0"], "--repeats")
    (tmp_path / "file").write_text("")
    _fails(capsys, ["bench", b, "--out", str(tmp_path / "file" / "sub")], "--out")


def test_missing_matplotlib_is_one_sentence(capsys, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert bench_cmd._matplotlib() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'edge-spec[bench]'" in err[0]
