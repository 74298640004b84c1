"""Device names -> ONNX Runtime execution providers, with a visible CPU fallback."""

from __future__ import annotations

import warnings

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


def resolve_device(device: str, strict: bool = False, role: str = "model") -> tuple[str, list[str]]:
    """Return ``(device actually used, provider list)`` for ``device``.

    An unknown name is always an error; a known but unavailable provider falls back to CPU with a
    warning, or raises with ``strict=True``.
    """
    name = str(device).lower()
    if name not in PROVIDERS:
        raise EdgeSpecError(f"Unknown device '{device}' for the {role}; use one of {', '.join(PROVIDERS)}.")
    provider = PROVIDERS[name]
    if name == "cpu":
        return "cpu", ["CPUExecutionProvider"]
    if provider not in ort.get_available_providers():
        msg = (f"The {role} asked for device '{name}' but this onnxruntime build has no {provider} "
               f"(available: {', '.join(ort.get_available_providers())})")
        if strict:
            raise EdgeSpecError(msg + "; install the matching onnxruntime package or pass device='cpu'.")
        warnings.warn(msg + "; falling back to CPU.", RuntimeWarning, stacklevel=3)
        return "cpu", ["CPUExecutionProvider"]
    return name, [provider, "CPUExecutionProvider"]
