"""The edge-spec release (pyproject.toml's ``version``), handed on as ``edge_spec.__version__``.

In a module of its own so that a module below the package's face (``demo.py``'s cache key) reads it without
importing the face, which offers the Engine from above it.
"""

from __future__ import annotations

__version__ = "0.1.0"
