"""The one exception type a user can cause.

Every error a user can trigger (bad path, corrupt bundle, budget too small, ...) is raised
as :class:`EdgeSpecError` whose message is one sentence naming what is wrong and how to
fix it. The CLI prints that sentence and exits non-zero; it never shows a traceback
unless ``--debug`` is given.
"""

from __future__ import annotations


class EdgeSpecError(Exception):
    """A user-facing error: ``str(err)`` is one sentence saying what is wrong and the fix."""

    exit_code: int = 2


class BundleError(EdgeSpecError):
    """The bundle on disk is missing, corrupt, or from an incompatible version."""


class BudgetError(EdgeSpecError):
    """The memory budget cannot hold even the smallest plan."""


class ExportError(EdgeSpecError):
    """Export cannot proceed (bad checkpoint, unsupported architecture, I/O trouble)."""
