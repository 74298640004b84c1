"""Device names -> ONNX Runtime execution providers, with a visible CPU fallback.

A device is ``NAME`` or ``NAME:VARIANT``: ``openvino:NPU`` gives OpenVINO's ``device_type`` (CPU, GPU, NPU,
GPU.1, HETERO:GPU,CPU — the names ORT GenAI's and Optimum's OpenVINO options take), ``cuda:1`` / ``dml:1`` a
``device_id``. A provider is found in one of two ways:

* the installed ``onnxruntime`` module has it built in (the *full* wheels ``onnxruntime-openvino``,
  ``onnxruntime-webgpu``, ``onnxruntime-gpu``, ...; each replaces the ``onnxruntime`` module, so one per environment);
* a *plugin* package (``onnxruntime-ep-webgpu``, ``onnxruntime-ep-openvino``) is importable next to the ordinary
  wheel: its library is registered with ``onnxruntime.register_execution_provider_library`` (ONNX Runtime >= 1.22)
  and used when ``onnxruntime.get_ep_devices()`` lists a device for it.

Neither: one sentence saying what to install; ``strict=False`` falls back to CPU with a warning instead.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any

import onnxruntime as ort

from edge_spec.errors import EdgeSpecError

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "nnapi": "NnapiExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
}

# what to install for each provider (the full wheel replaces `onnxruntime`: a separate environment, docs/devices.md)
INSTALL = {
    "cuda": "onnxruntime-gpu",
    "dml": "onnxruntime-directml",
    "coreml": "onnxruntime (macOS build)",
    "qnn": "onnxruntime-qnn",
    "nnapi": "an Android build of ONNX Runtime",
    "openvino": "onnxruntime-openvino (replaces onnxruntime) or the plugin onnxruntime-ep-openvino",
    "webgpu": "onnxruntime-webgpu (replaces onnxruntime) or the plugin onnxruntime-ep-webgpu",
}

# plugin packages (module name) that carry a provider as a library ONNX Runtime loads at run time
PLUGINS = {"webgpu": "onnxruntime_ep_webgpu", "openvino": "onnxruntime_ep_openvino"}

# the provider option a device's VARIANT sets
VARIANT_OPTION = {"openvino": "device_type", "cuda": "device_id", "dml": "device_id"}

# Fewest rows per target pass at which a provider computes each row the same whatever the pass size (the CPU
# provider's is measured at export: ModelSpec.batch_invariant_rows). WebGPU on Mesa's lavapipe, demo graphs: a row of
# a 1-row pass differs from the same row in a 2- or 3-row pass by 0.34 logits (drafter), 2-3 rows from 4+ rows by
# 2e-5, and every pass of 4 to 32 rows gives the row bit for bit; so padding every pass to 4 rows keeps greedy
# speculative decoding equal to plain decoding there (a real GPU's shaders may group differently: unmeasured).
MIN_ROWS = {"webgpu": 4}


@dataclass(frozen=True)
class Device:
    """A resolved device: what a session is created with.

    ``name`` is the device as the user wrote it when the provider is used (``openvino:NPU``), else ``cpu``;
    ``provider`` the execution provider; ``options`` its provider options; ``ep_devices`` the plugin devices
    (empty for a provider built into the onnxruntime module)."""

    name: str
    provider: str
    options: tuple[tuple[str, str], ...] = ()
    ep_devices: tuple[Any, ...] = field(default=(), compare=False)

    @property
    def kind(self) -> str:
        """The device name without its variant: ``openvino:NPU`` -> ``openvino``."""
        return self.name.split(":", 1)[0]

    @property
    def providers(self) -> list[str | tuple[str, dict[str, str]]]:
        """The ``providers=`` list of ``onnxruntime.InferenceSession`` (empty for a plugin device: see ``apply``)."""
        if self.provider == "CPUExecutionProvider":
            return ["CPUExecutionProvider"]
        if self.ep_devices:
            return []
        return [(self.provider, dict(self.options)), "CPUExecutionProvider"]

    def apply(self, options: ort.SessionOptions) -> None:
        """Add a plugin device to session ``options`` (the built-in providers go through ``providers``)."""
        if self.ep_devices:
            options.add_provider_for_devices(list(self.ep_devices), dict(self.options))


CPU = Device("cpu", "CPUExecutionProvider")


def parse_device(device: str, role: str = "model") -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """``(kind, provider, options)`` for ``NAME[:VARIANT]``; an unknown name or a variant the device does not take is
    an EdgeSpecError naming the choices."""
    text = str(device).strip()
    kind, _, variant = text.partition(":")
    kind = kind.lower()
    if kind not in PROVIDERS:
        raise EdgeSpecError(f"Unknown device '{device}' for the {role}; use one of {', '.join(PROVIDERS)} "
                            "(openvino:CPU|GPU|NPU picks OpenVINO's device).")
    options: tuple[tuple[str, str], ...] = ()
    if variant:
        key = VARIANT_OPTION.get(kind)
        if key is None:
            raise EdgeSpecError(f"The device '{device}' for the {role} takes no ':{variant}'; write '{kind}'.")
        if key == "device_id" and not variant.isdigit():
            raise EdgeSpecError(f"The device '{device}' for the {role} needs a device number, e.g. '{kind}:0'.")
        options = ((key, variant.upper() if key == "device_type" else variant),)
    return kind, PROVIDERS[kind], options


def _plugin_devices(kind: str, options: tuple[tuple[str, str], ...]) -> tuple[tuple[Any, ...], str]:
    """``(ep devices, why not)`` from the plugin package of ``kind``; no devices when it is absent or finds none."""
    module_name = PLUGINS.get(kind)
    if module_name is None or not hasattr(ort, "register_execution_provider_library"):
        return (), ""
    try:
        plugin = importlib.import_module(module_name)
    except ImportError:
        return (), ""
    ep_name = plugin.get_ep_name()
    try:
        ort.register_execution_provider_library(ep_name, str(plugin.get_library_path()))
    except Exception as exc:  # already registered (a second session), or an incompatible onnxruntime
        if "already" not in str(exc).lower():
            return (), f"the plugin {module_name} does not load into onnxruntime {ort.__version__} ({str(exc)[:120]})"
    wanted = dict(options).get("device_type", "").split(".")[0]
    found = tuple(d for d in ort.get_ep_devices() if d.ep_name == ep_name and
                  (not wanted or str(d.device.type).rsplit(".", 1)[-1] == wanted))
    if not found:
        return (), f"the plugin {module_name} is installed but finds no {wanted or kind} device on this machine"
    return found, ""


def resolve(device: str, strict: bool = False, role: str = "model") -> Device:
    """The :class:`Device` to create ``role``'s session with.

    An unknown name is always an error; a known but unavailable provider (or a plugin without a device) falls back to
    CPU with a warning, or raises with ``strict=True``."""
    kind, provider, options = parse_device(device, role)
    if kind == "cpu":
        return CPU
    name = kind + (f":{options[0][1]}" if options else "")
    if provider in ort.get_available_providers():
        return Device(name, provider, options)
    ep_devices, why = _plugin_devices(kind, options)
    if ep_devices:
        return Device(name, provider, options, ep_devices)
    msg = (f"The {role} asked for device '{device}' but this onnxruntime ({ort.__version__}) has no {provider}"
           + (f" and {why}" if why else "") + f" (available: {', '.join(ort.get_available_providers())})")
    if strict:
        raise EdgeSpecError(msg + f"; install {INSTALL[kind]} (docs/devices.md) or pass device='cpu'.")
    warnings.warn(msg + "; falling back to CPU.", RuntimeWarning, stacklevel=3)
    return CPU
