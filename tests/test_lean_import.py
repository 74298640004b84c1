"""The runtime imports with torch, transformers, onnx and onnxruntime_genai blocked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import sys
BLOCKED = ("torch", "transformers", "onnx", "onnxruntime_genai")

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the runtime must stay lean")
        return None

sys.meta_path.insert(0, Blocker())
import edge_spec.runtime
from edge_spec import Engine
import edge_spec.runtime.engine
import edge_spec.runtime.budget, edge_spec.runtime.sampling, edge_spec.runtime.speculative
import edge_spec.runtime.session, edge_spec.runtime.kv, edge_spec.runtime.detok, edge_spec.runtime.providers
import edge_spec.runtime.drafting, edge_spec.runtime.config, edge_spec.runtime.memory
assert Engine.__name__ == "Engine"
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
print("lean ok")
"""


def test_runtime_imports_without_heavy_packages():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "lean ok" in proc.stdout
