"""Which execution provider runs which nodes of a graph: ONNX Runtime's own node placement, read back.

ONNX Runtime decides placement when a session is created and says so only in its verbose log ("Node(s) placed on
[P]. Number of nodes: N" followed by one "OpType (name)" line per node, or "All nodes placed on [P]" when there is
one provider). That log goes to the process's stderr from C++, so :func:`node_placement` creates a throwaway session
with the log at VERBOSE while file descriptor 2 points at a temporary file, and parses it. A provider that compiles
what it takes into subgraphs (OpenVINO) is reported as those subgraphs: ``OpenVINO-EP-subgraph`` x count.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from edge_spec.runtime.options import session_options
from edge_spec.runtime.providers import Device

_GROUP = re.compile(r"(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)")
_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s{3}(\S+) \(")


@dataclass(frozen=True)
class Placement:
    """Node counts per provider, and per op type where ONNX Runtime lists them (empty when one provider takes all)."""

    nodes: dict[str, int]  # provider -> number of nodes
    ops: dict[str, dict[str, int]]  # provider -> op type -> count

    def describe(self) -> list[str]:
        """One line per provider: ``P: N nodes (OpType xK, ...)``, most frequent op types first."""
        lines = []
        for provider, n in self.nodes.items():
            ops = sorted(self.ops.get(provider, {}).items(), key=lambda kv: (-kv[1], kv[0]))
            detail = ", ".join(f"{op} x{k}" for op, k in ops) if ops else "all of them"
            lines.append(f"{provider}: {n} nodes ({detail})")
        return lines


def parse_placement(log: str) -> Placement:
    """The placement in an ONNX Runtime verbose log (the last session's, if several)."""
    start = log.rfind("Node placements")
    nodes: dict[str, int] = {}
    ops: dict[str, Counter[str]] = {}
    current = None
    for line in log[max(start, 0):].splitlines():
        group = _GROUP.search(line)
        if group:
            current = group.group(2)
            nodes[current] = int(group.group(3))
            ops[current] = Counter()
            continue
        node = _NODE.search(line)
        if node and current is not None:
            ops[current][re.sub(r"_\d+$", "", node.group(1))] += 1
    return Placement(nodes, {p: dict(c) for p, c in ops.items() if c})


def node_placement(graph: str | Path, device: Device) -> Placement:
    """Create a session on ``graph`` for ``device`` (nothing runs) and return ONNX Runtime's node placement."""
    options = session_options(1)
    options.log_severity_level = 0
    options.log_verbosity_level = 0
    device.apply(options)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as log:
        os.dup2(log.fileno(), 2)
        try:
            session = ort.InferenceSession(str(graph), options, providers=device.providers or None)
            del session
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        text = log.read().decode("utf-8", "replace")
    return parse_placement(text)
