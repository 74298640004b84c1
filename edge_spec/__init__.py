"""edge-spec: lossless speculative decoding for ONNX Runtime, within a memory budget.

``from edge_spec import Engine`` must work with only onnxruntime, numpy and tokenizers
installed, so heavy imports are deferred (the export subpackage is never imported here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Engine", "EdgeSpecError", "__version__"]

from edge_spec.errors import EdgeSpecError
from edge_spec.version import __version__

if TYPE_CHECKING:
    from edge_spec.runtime.engine import Engine


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from edge_spec.runtime.engine import Engine

        return Engine
    raise AttributeError(name)
