"""Whether a process still runs: what a leftover temporary directory's owner is asked before it is cleaned up
(an export's ``.tmp-<pid>`` destination, a feature store being written by ``edge-spec distill``)."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (another user's live process, EPERM, counts as running: not ours to judge)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
