"""Writing a bundle atomically: into a temporary directory beside the destination, renamed into place at the end.

A failure (Ctrl-C included) leaves the destination as it was; directories left by a killed export are cleaned up
by the next one. Used by ``export_bundle`` and ``edge-spec package``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from edge_spec.errors import ExportError
from edge_spec.process import process_alive


def prepare_destination(out: Path, force: bool) -> Path:
    """A new temporary directory beside ``out`` to write into; one sentence when ``out`` cannot be written."""
    if out.exists() and not force:
        raise ExportError(f"The output '{out}' already exists; pass --force to replace it or choose another --out.")
    if out.exists() and not out.is_dir():
        raise ExportError(f"The output '{out}' is a file; choose a directory path for --out.")
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(parent, out.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=parent))
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700; the bundle should get normal permissions
        return tmp
    except OSError as exc:
        raise ExportError(f"Cannot write to the output directory '{parent}' ({exc.strerror}); choose a writable "
                          "--out location.") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove_stale(parent: Path, name: str) -> None:
    """Delete ``.NAME.tmp-PID-*`` / ``.NAME.old-PID`` left by an export that was killed (SIGKILL skips cleanup).

    The pid in the name tells whether its writer still runs; a live one (a concurrent export) is left alone."""
    for p in parent.glob(f".{name}.*-*"):
        kind, _, rest = p.name[len(name) + 2:].partition("-")
        pid = rest.split("-")[0]
        if kind in ("tmp", "old") and pid.isdigit() and p.is_dir() and not process_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _open_permissions(root: Path) -> None:
    """Files a+r and directories a+rx, minus the umask: writers such as onnx save external data with 0600,
    which would leave a bundle other users cannot load."""
    mask = _umask()
    for dirpath, _dirs, filenames in os.walk(root):
        os.chmod(dirpath, 0o777 & ~mask)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o666 & ~mask)


def finish(tmp: Path, out: Path) -> None:
    """Put the completed ``tmp`` in place of ``out`` (an old ``out`` is moved aside, then deleted)."""
    _open_permissions(tmp)
    old = None
    if out.exists():  # --force: move the old bundle aside, put the new one in, then delete the old
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
