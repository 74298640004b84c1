"""``edge-spec distill``: train a drafter for a target (GGUF file or HF dir) on text the target writes."""

from __future__ import annotations

import argparse
from pathlib import Path

from edge_spec.cli.common import command_parser

EXAMPLES = """
  edge-spec distill --target SmolLM2-135M-Instruct.Q4_1.gguf --out my-drafter --minutes 60
  edge-spec distill --target ./my-hf-model --out my-drafter --layers 3 --prompts my_prompts.txt --device cuda
  edge-spec distill --target model.gguf --out my-drafter        # again: resumes where it stopped
  torchrun --nproc_per_node 2 -m edge_spec distill --target model.gguf --out my-head --kind eagle3 --data a.npz
                                                                # data-parallel: 2 processes (docs/distill.md)
"""


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if not value > 0 or value == float("inf"):  # also refuses nan and inf
            raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
        return value
    return parse


def _rate(config: type, lr: float | None) -> dict[str, float]:
    """The learning-rate fields of ``config`` set to ``--lr`` (fresh and continuing runs alike), or none."""
    if lr is None:
        return {}
    names = [n for n in ("lr", "continue_lr") if n in config.__dataclass_fields__]
    return dict.fromkeys(names, lr)


def _batch(seqs: int | None) -> dict[str, int]:
    """``batch_seqs`` set to ``--train-batch``, or left at its default."""
    return {} if seqs is None else {"batch_seqs": seqs}


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = command_parser(subparsers, "distill", help="train a drafter for a target (runs on CPU or CUDA)",
                       description="Generate text with the target, then train a small drafter (a few of the "
                                   "target's layers on its shared embedding) to match the target's distribution. "
                                   "Resumes automatically from --out.", examples=EXAMPLES)
    p.add_argument("--target", required=True, type=Path, metavar="GGUF_OR_DIR", help="target model")
    p.add_argument("--out", required=True, type=Path, metavar="DRAFTER_DIR", help="drafter directory (resumed)")
    p.add_argument("--minutes", type=_positive(float), metavar="N",
                   help="wall budget for data generation (40%%) + training (default 60, or none when both "
                        "--steps and --data-jobs are given)")
    p.add_argument("--prompts", type=Path, metavar="FILE", help="extra user prompts, one per line")
    p.add_argument("--data", type=Path, nargs="+", metavar="ANSWERS_NPZ",
                   help="train on the target-written answers of earlier runs (their data/answers.npz: token ids "
                        "only; the teacher's targets are recomputed; several files are merged without repeats) "
                        "instead of generating; with --data-only, write the merged file to OUT/data/answers.npz")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", choices=("layers", "eagle3"), default="layers",
                   help="layers: N of the target's own layers (a small model); eagle3: one layer that reads the "
                        "target's hidden states (EAGLE-3 layout; export it with the GGUF target it was trained on)")
    p.add_argument("--layers", type=_positive(int), default=2, metavar="N",
                   help="--kind layers: drafter layers (default 2)")
    p.add_argument("--aux-layers", type=int, nargs=3, metavar=("LOW", "MID", "HIGH"),
                   help="--kind eagle3: the residual streams it reads, as inputs of target layers (0 = embeddings, "
                        "L = the last layer's output; default 2, L/2, L)")
    p.add_argument("--head-mlp", type=_positive(int), metavar="UNITS",
                   help="--kind eagle3: the head's MLP width (default: the target's, or the --init-from head's); a "
                        "continued head made wider keeps what it learned (new units start silent); a unit costs "
                        "3 x hidden multiply-adds per drafted token (SmolLM2's default head: 1,536 units, 2.7M of "
                        "its 9.8M)")
    p.add_argument("--draft-vocab", type=_positive(int), metavar="N",
                   help="--kind eagle3: the head's draft vocabulary, the N tokens the target writes most in the "
                        "training answers (default 8,192); with --init-from a larger N keeps the head's tokens and "
                        "their trained rows and adds the most written others (their rows start silent)")
    p.add_argument("--ttt-depth", type=_positive(int), metavar="N",
                   help="--kind eagle3: the draft depths each answer position is trained at (training-time test, "
                        "default 3); a step costs about N times a depth-1 step, so 1 buys ~3x the steps of 3 for a "
                        "runtime that drafts mostly one token (BENCHMARKS.md)")
    p.add_argument("--init-from", type=Path, metavar="HEAD_DIR",
                   help="eagle3: continue from this saved head (its vocabulary and weights), e.g. on more data")
    p.add_argument("--features", type=Path, metavar="DIR",
                   help="eagle3: keep the target's features (and teacher top-k) in DIR instead of OUT/features, "
                        "and reuse what earlier runs left there, per sequence: continuing a head on the same data "
                        "then skips the feature pass, and on more data computes only the new answers (about 2 x 3 "
                        "x hidden bytes per position: 3.3 GB for SmolLM2 and 950k positions)")
    p.add_argument("--steps", type=_positive(int), metavar="N", help="exact training steps (reproducible)")
    p.add_argument("--train-batch", type=_positive(int), metavar="N",
                   help="sequences per training step (default 8); under torchrun the processes share each step's "
                        "sequences, so give at least one per process")
    p.add_argument("--lr", type=_positive(float), metavar="RATE",
                   help="peak learning rate of the training (cosine decay to a tenth; default 5e-4, or 1.5e-4 "
                        "when continuing a head with --init-from)")
    p.add_argument("--data-jobs", type=_positive(int), metavar="N", help="exact number of generation batches")
    p.add_argument("--magpie", type=_count, default=256, metavar="N",
                   help="user messages the target writes itself from its chat template (Magpie), added to the "
                        "prompt pool for chat-like variety (default 256; 0: none)")
    p.add_argument("--batch", type=_positive(int), default=64, metavar="N", help="generation batch (default 64)")
    p.add_argument("--data-only", action="store_true", help="stop after generating the training text")
    p.add_argument("--threads", type=_positive(int), metavar="N", help="torch CPU threads")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="the matmuls of the target's generation and feature pass and of the drafter's training: "
                        "auto = bf16 on a CPU with native bfloat16 (AVX512-BF16 or AMX; about 1.6x the generated "
                        "tokens, 1.5x the feature pass and 1.7x the training steps per minute), else fp32; weights, "
                        "loss, LM head logits and evaluations stay fp32")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import sys
    import time

    from edge_spec.distill import DistillConfig, distill
    from edge_spec.distill.data import DataConfig
    from edge_spec.distill.eagle_train import EagleTrainConfig
    from edge_spec.distill.train import TrainConfig

    if args.minutes is None and (args.steps is None or args.data_jobs is None):
        args.minutes = 60.0  # a budget the user can see in --help beats an unbounded run
    cfg = DistillConfig(target=args.target, out=args.out, minutes=args.minutes, prompts_file=args.prompts,
                        device=args.device, seed=args.seed, kind=args.kind, layers=args.layers,
                        aux_layers=tuple(args.aux_layers) if args.aux_layers else None, threads=args.threads,
                        precision=args.precision,
                        answers=tuple(args.data) if args.data else None, init_from=args.init_from,
                        features=args.features,
                        data_only=args.data_only, command=reproduce_command(sys.argv[1:]),
                        data=dataclasses.replace(DataConfig(), batch=args.batch, max_jobs=args.data_jobs,
                                                 magpie=args.magpie),
                        train=dataclasses.replace(TrainConfig(), steps=args.steps, **_rate(TrainConfig, args.lr),
                                                  **_batch(args.train_batch)),
                        eagle=dataclasses.replace(EagleTrainConfig(), steps=args.steps, mlp=args.head_mlp,
                                                  **_batch(args.train_batch),
                                                  **_rate(EagleTrainConfig, args.lr),
                                                  depth=args.ttt_depth or EagleTrainConfig.depth,
                                                  draft_vocab=args.draft_vocab))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    distill(cfg, log)
    return 0


def reproduce_command(argv: list[str]) -> str:
    """The card's "Reproduce" line: the command as typed, with paths under the home directory as ``~/...`` (the
    shell expands them for whoever runs it), every other argument quoted as the shell needs."""
    import shlex

    home = str(Path.home()) + "/"
    words = ["~/" + a[len(home):] if a.startswith(home) and shlex.quote(a[len(home):]) == a[len(home):]
             else shlex.quote(a) for a in argv]
    return " ".join(["edge-spec", *words])
