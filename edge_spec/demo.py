"""The demo bundle behind a bare ``edge-spec chat``: found in the source checkout, exported once, cached.

The demo pair (``models/demo/{target,drafter}``) is trained by the project and lives in the
source checkout, not in the wheel. The first run exports it into the user cache
(``$EDGE_SPEC_HOME``, else ``$XDG_CACHE_HOME/edge-spec``, else ``~/.cache/edge-spec``) under a
name keyed by the checkpoint files and the edge-spec version, so retrained weights or a new
exporter give a fresh bundle and later runs start at once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import edge_spec
from edge_spec.bundle import MANIFEST_NAME, SCHEMA_VERSION
from edge_spec.errors import EdgeSpecError

DEMO_DIR = Path(edge_spec.__file__).resolve().parents[1] / "models" / "demo"
ROLES = ("target", "drafter")
_HASHED = (".safetensors", ".bin", ".json")  # weights, config, tokenizer


def cache_root() -> Path:
    if os.environ.get("EDGE_SPEC_HOME"):
        return Path(os.environ["EDGE_SPEC_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "edge-spec"


def demo_checkpoints(demo_dir: Path | None = None) -> dict[str, Path]:
    """The demo target and drafter checkpoint directories, or one sentence saying how to get them."""
    root = Path(demo_dir or DEMO_DIR)
    paths = {role: root / role for role in ROLES}
    missing = [role for role, p in paths.items() if not (p / "config.json").is_file()]
    if missing:
        raise EdgeSpecError(
            f"The demo models are not in {root} (missing {', '.join(missing)}); run edge-spec from a source "
            "checkout that has models/demo (train it with 'python models/train_demo.py --out models/demo'), "
            "or pass a bundle: edge-spec chat BUNDLE.")
    return paths


def demo_key(paths: dict[str, Path]) -> str:
    """Hash of the checkpoint files (names + bytes) and the versions that shape the export."""
    h = hashlib.sha256(f"{edge_spec.__version__}/{SCHEMA_VERSION}".encode())
    for role in ROLES:
        for f in sorted(p for p in paths[role].iterdir() if p.is_file() and p.name.endswith(_HASHED)):
            h.update(f"{role}/{f.name}".encode())
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


def demo_bundle(progress: Callable[[str], None] | None = None, demo_dir: Path | None = None) -> Path:
    """Path of the exported demo bundle, exporting it on first use (needs the export extras)."""
    paths = demo_checkpoints(demo_dir)
    out = cache_root() / f"demo-{demo_key(paths)}"
    if (out / MANIFEST_NAME).is_file():
        return out
    missing = [m for m in ("torch", "transformers", "onnxruntime_genai", "onnx") if importlib.util.find_spec(m) is None]
    if missing:
        raise EdgeSpecError(f"The demo bundle must be exported once, which needs the export extras ({missing[0]} is "
                            "missing); run pip install 'edge-spec[export]' or pass a bundle path.")
    say = progress or (lambda _msg: None)
    say(f"exporting the demo models once into {out} (1 to 1.5 minutes on 2 cores; later runs reuse it)")
    _export(paths, out, say)
    return out


DEMO_NAME = "demo"


def resolve_bundle(bundle: str | os.PathLike[str], progress: Callable[[str], None] | None = None) -> Path:
    """``"demo"`` -> the demo bundle (exported on first use); any other name, or an existing ``./demo``, as given."""
    path = Path(bundle)
    if str(bundle) == DEMO_NAME and not path.exists():
        return demo_bundle(progress)
    return path


def _export(paths: dict[str, Path], out: Path, say: Callable[[str], None]) -> None:
    """Run ``edge-spec export`` in a child process, so this process never holds torch and the export's memory."""
    cmd = [sys.executable, "-m", "edge_spec", "export", "--target", str(paths["target"]),
           "--drafter", str(paths["drafter"]), "--out", str(out)] + (["--force"] if out.exists() else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last = ""
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            line = line.rstrip("\n")
            if line.strip():
                last = line
                say(line.removeprefix("edge-spec export: "))
        proc.wait()
    except BaseException:  # Ctrl-C reaches the child too; let it remove its temporary directory first
        proc.wait()
        raise
    if proc.returncode != 0 or not (out / MANIFEST_NAME).is_file():
        reason = last.removeprefix("edge-spec: error: ").rstrip(".") or f"exit status {proc.returncode}"
        raise EdgeSpecError(f"Exporting the demo bundle failed ({reason}); run 'edge-spec --debug export --target "
                            f"{paths['target']} --drafter {paths['drafter']} --out {out}' to see why.")
