"""What a distill run is asked to do (:class:`DistillConfig`: every option, each stage's own config inside it) and
the marker that binds a DRAFTER_DIR to one such ask (:func:`check_marker`).

The pipeline (``run.py``) and the EAGLE-3 stage (``eagle_run.py``) both read it; it reads neither.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from edge_spec.distill.data import DataConfig
from edge_spec.distill.eagle_train import EagleTrainConfig
from edge_spec.distill.train import TrainConfig
from edge_spec.errors import EdgeSpecError


@dataclass(frozen=True)
class DistillConfig:
    """Everything ``edge-spec distill`` does; ``minutes`` is the wall budget of data generation + training."""

    target: Path
    out: Path
    minutes: float | None = None
    data_share: float = 0.4  # of ``minutes``, for data generation (training gets what is left)
    prompts_file: Path | None = None
    device: str = "cpu"
    seed: int = 0
    kind: str = "layers"  # "layers": N of the target's layers | "eagle3": one layer on the target's features
    layers: int = 2
    aux_layers: tuple[int, ...] | None = None  # eagle3: which residual streams it reads (default 2, L/2, L)
    # train on these target-written ids (answers.npz files, merged without repeats) instead of generating
    answers: Path | tuple[Path, ...] | None = None
    layers_from: tuple[int, ...] | None = None  # target layers to start from; default: evenly spaced
    init_from: Path | None = None  # eagle3: start from this saved head (its vocabulary and weights)
    features: Path | None = None  # eagle3: keep and reuse the target's features here (default out/features)
    threads: int | None = None
    precision: str = "auto"  # the drafter's training matmuls: auto | fp32 | bf16 (see train_precision)
    data_only: bool = False
    command: str | None = None  # how this run was started, for the model card
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eagle: EagleTrainConfig = field(default_factory=EagleTrainConfig)


def answer_files(answers: Path | str | tuple[Path, ...] | list[Path] | None) -> tuple[Path, ...]:
    """``DistillConfig.answers`` as a tuple of paths (one file, several, or none)."""
    if answers is None:
        return ()
    if isinstance(answers, (str, Path)):
        return (Path(answers),)
    return tuple(Path(a) for a in answers)


def check_marker(marker: Path, meta: dict, out: Path) -> None:
    """A DRAFTER_DIR is bound to one target and data config (``distill.json``), and each kind of drafter
    trained in it to one shape (its checkpoint directory's ``train.json``): resuming with others would mix
    two runs. Keys a marker has that ``meta`` lacks are not compared (a data-only run, a newer field)."""
    if marker.exists():
        old = json.loads(marker.read_text())
        diff = sorted(k for k in meta if old.get(k, meta[k]) != meta[k])
        if diff:
            raise EdgeSpecError(f"'{out}' holds a distill run with other settings ({', '.join(diff)}); pass a new "
                                "--out directory or delete this one.")
    else:  # atomically: the ranks of a torchrun job write the same marker at once
        marker.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=marker.parent, prefix=marker.name, suffix=".tmp",
                                         delete=False) as f:
            f.write(json.dumps(meta, indent=2) + "\n")
        os.replace(f.name, marker)
