"""``edge-spec distill``: train a drafter for any target (FastDraft data, DistillSpec loss).

Heavy dependencies (torch, transformers, gguf) are allowed here only. Entry point: :func:`distill`.

Stages, each resumable from DRAFTER_DIR:
1. data   (data.py)  - the target answers the built-in prompt set (+ self-instruct, + ``--prompts``) at
                       T = 0 / 0.7 / 1.0; its top-k logits at every position are kept; shards in DRAFTER_DIR/data.
2. train  (train.py) - N target layers on the target's frozen embedding/LM head learn the target's
                       distribution (top-k forward KL); held-out greedy agreement and T=0.7 acceptance
                       are measured as it goes; checkpoints in DRAFTER_DIR/checkpoint.
3. save   (drafter.py) - config.json + model.safetensors (no embedding / LM head) + training.json.
"""

from __future__ import annotations

from edge_spec.distill.config import DistillConfig
from edge_spec.distill.run import distill

__all__ = ["DistillConfig", "distill"]
