"""Devices -> execution providers: names and variants, the fallback and its sentence, plugin devices, node placement.

Everything here runs with the ordinary onnxruntime wheel. The tests at the end need a real provider (the full wheels
onnxruntime-openvino / onnxruntime-webgpu, each in its own environment: docs/devices.md) and skip without it.
"""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

import onnxruntime as ort
import pytest

from edge_spec.cli import main
from edge_spec.errors import EdgeSpecError
from edge_spec.runtime import providers
from edge_spec.runtime.placement import node_placement, parse_placement
from edge_spec.runtime.providers import CPU, parse_device, resolve

HAS = set(ort.get_available_providers())


def test_names_and_variants() -> None:
    assert parse_device("cpu") == ("cpu", "CPUExecutionProvider", ())
    assert parse_device("openvino:npu") == ("openvino", "OpenVINOExecutionProvider", (("device_type", "NPU"),))
    assert parse_device("OpenVINO:HETERO:GPU,CPU")[2] == (("device_type", "HETERO:GPU,CPU"),)
    assert parse_device("cuda:1") == ("cuda", "CUDAExecutionProvider", (("device_id", "1"),))
    for bad, needle in (("tpu", "Unknown device"), ("webgpu:1", "takes no ':1'"), ("cuda:x", "device number")):
        with pytest.raises(EdgeSpecError, match=needle):
            parse_device(bad)


def test_available_provider_gets_its_options(monkeypatch) -> None:
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["OpenVINOExecutionProvider", "CPUExecutionProvider"])
    d = resolve("openvino:npu", strict=True)
    assert d.name == "openvino:NPU" and d.kind == "openvino"
    assert d.providers == [("OpenVINOExecutionProvider", {"device_type": "NPU"}), "CPUExecutionProvider"]
    assert resolve("cpu") is CPU and CPU.providers == ["CPUExecutionProvider"]


def _no_openvino(monkeypatch) -> None:
    """An onnxruntime without OpenVINO, built in or as a plugin (whatever this environment has)."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setitem(sys.modules, "onnxruntime_ep_openvino", None)  # import -> ImportError


def test_missing_provider_says_what_to_install_or_falls_back(monkeypatch) -> None:
    _no_openvino(monkeypatch)
    with pytest.raises(EdgeSpecError) as info:
        resolve("openvino:GPU", strict=True, role="target")
    msg = str(info.value)
    assert msg.count(". ") == 0 and msg.endswith(".")  # one sentence
    assert "install onnxruntime-openvino" in msg and "docs/devices.md" in msg
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve("openvino:GPU", role="drafter") is CPU
    assert any("falling back to CPU" in str(w.message) for w in caught)


def _fake_plugin(monkeypatch, devices: list) -> list:
    """A plugin package named like onnxruntime-ep-webgpu's, and an onnxruntime that lists ``devices``."""
    registered: list = []
    plugin = types.SimpleNamespace(get_ep_name=lambda: "WebGpuExecutionProvider", get_library_path=lambda: "/x.so")
    monkeypatch.setitem(sys.modules, "onnxruntime_ep_webgpu", plugin)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(ort, "register_execution_provider_library", lambda *a: registered.append(a), raising=False)
    monkeypatch.setattr(ort, "get_ep_devices", lambda: devices, raising=False)
    return registered


def test_plugin_device_is_added_to_the_session_options(monkeypatch) -> None:
    gpu = types.SimpleNamespace(ep_name="WebGpuExecutionProvider", device=types.SimpleNamespace(type="GPU"))
    cpu = types.SimpleNamespace(ep_name="CPUExecutionProvider", device=types.SimpleNamespace(type="CPU"))
    registered = _fake_plugin(monkeypatch, [cpu, gpu])
    d = resolve("webgpu", strict=True)
    assert registered == [("WebGpuExecutionProvider", "/x.so")]
    assert d.name == "webgpu" and d.ep_devices == (gpu,) and d.providers == []
    added: list = []
    d.apply(types.SimpleNamespace(add_provider_for_devices=lambda devs, opts: added.append((devs, opts))))
    assert added == [([gpu], {})]


def test_plugin_without_a_device_falls_back(monkeypatch) -> None:
    _fake_plugin(monkeypatch, [types.SimpleNamespace(ep_name="CPUExecutionProvider", device=None)])
    with pytest.raises(EdgeSpecError, match="finds no webgpu device"):
        resolve("webgpu", strict=True)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert resolve("webgpu") is CPU


LOG = """\
2026-11-24 [V:onnxruntime:, session_state.cc:1347 VerifyEachNodeIsAssignedToAnEp] Node placements
2026-11-24 [V:onnxruntime:, session_state.cc:1353 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on \
[WebGpuExecutionProvider]. Number of nodes: 3
2026-11-24 [V:onnxruntime:, session_state.cc:1355 VerifyEachNodeIsAssignedToAnEp]   MatMulNBits (/l0/qkv)
2026-11-24 [V:onnxruntime:, session_state.cc:1355 VerifyEachNodeIsAssignedToAnEp]   MatMulNBits (/l0/o)
2026-11-24 [V:onnxruntime:, session_state.cc:1355 VerifyEachNodeIsAssignedToAnEp]   GroupQueryAttention (/l0/gqa)
2026-11-24 [V:onnxruntime:, session_state.cc:1353 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on \
[CPUExecutionProvider]. Number of nodes: 2
2026-11-24 [V:onnxruntime:, session_state.cc:1355 VerifyEachNodeIsAssignedToAnEp]   OpenVINO-EP-subgraph_12 (x)
2026-11-24 [V:onnxruntime:, session_state.cc:1355 VerifyEachNodeIsAssignedToAnEp]   Gather (/embed/GatherQ)
2026-11-24 [V:onnxruntime:, session_state.cc:196 CreateGraphInfo] SaveMLValueNameIndexMapping
"""


def test_placement_log_is_parsed() -> None:
    p = parse_placement(LOG)
    assert p.nodes == {"WebGpuExecutionProvider": 3, "CPUExecutionProvider": 2}
    assert p.ops == {"WebGpuExecutionProvider": {"MatMulNBits": 2, "GroupQueryAttention": 1},
                     "CPUExecutionProvider": {"OpenVINO-EP-subgraph": 1, "Gather": 1}}
    assert p.describe()[0] == "WebGpuExecutionProvider: 3 nodes (MatMulNBits x2, GroupQueryAttention x1)"
    one = parse_placement("x VerifyEachNodeIsAssignedToAnEp]  All nodes placed on [CPUExecutionProvider]. "
                          "Number of nodes: 51\n")
    assert one.nodes == {"CPUExecutionProvider": 51} and one.describe() == ["CPUExecutionProvider: 51 nodes (all of "
                                                                             "them)"]


def test_node_placement_of_a_real_graph(demo_bundle: Path) -> None:
    from edge_spec.bundle import read_manifest

    p = node_placement(demo_bundle / read_manifest(demo_bundle).target.graph, CPU)
    assert list(p.nodes) == ["CPUExecutionProvider"] and p.nodes["CPUExecutionProvider"] > 10


def test_inspect_lists_the_placement(capsys, demo_bundle: Path) -> None:
    assert main(["inspect", str(demo_bundle), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Node placement" in out and "target on cpu:" in out and "drafter on cpu:" in out
    assert "CPUExecutionProvider:" in out
    assert main(["inspect", str(demo_bundle), "--device", "cpu", "--json"]) == 0
    placed = json.loads(capsys.readouterr().out)["placement"]
    assert placed["target"]["device"] == "cpu" and placed["target"]["nodes"]["CPUExecutionProvider"] > 10


def test_inspect_on_a_missing_device_is_one_sentence(capsys, monkeypatch, demo_bundle: Path) -> None:
    _no_openvino(monkeypatch)
    assert main(["inspect", str(demo_bundle), "--device", "openvino:NPU"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edge-spec: error: ") and "install onnxruntime-openvino" in err[0]


def test_cli_device_values(capsys, tmp_path: Path) -> None:
    for value, needle in (("tpu", "invalid choice"), ("webgpu:1", "takes no ':1'")):
        with pytest.raises(SystemExit):
            main(["generate", str(tmp_path), "--device", value, "--prompt", "x"])
        assert needle in capsys.readouterr().err


# --- a real provider: only where the installed onnxruntime has it (docs/devices.md: one wheel per environment) -----
@pytest.mark.parametrize("device,provider", [("webgpu", "WebGpuExecutionProvider"),
                                             ("openvino:CPU", "OpenVINOExecutionProvider")])
def test_greedy_speculative_equals_plain_on_the_provider(demo_bundle: Path, device: str, provider: str) -> None:
    if provider not in HAS:
        pytest.skip(f"this onnxruntime ({ort.__version__}) has no {provider}; "
                    f"install {providers.INSTALL[device.split(':')[0]]} in its own environment")
    from edge_spec import Engine

    engine = Engine.load(demo_bundle, device=device, strict=True, max_context=256)
    assert engine.target.session.get_providers()[0] == provider
    greedy = {"max_new_tokens": 16, "temperature": 0.0}
    for prompt in ("def add(a, b):", "import os\n"):
        ar = engine.generate(prompt, {**greedy, "speculative": False}).token_ids
        assert engine.generate(prompt, {**greedy, "speculative": True}).token_ids == ar
