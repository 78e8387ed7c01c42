"""The memory preflight for the biggest targets at their users' scale, as a markdown table (BENCHMARKS.md,
"Preflight at scale"): EAGLE-3 online and offline with its capture counted, per node setup and length.
No weights are read: each target is a meta-device model built from configs/targets/. Every figure is an
estimate (train/preflight/); no GPU has run these targets.

    python scripts/studies/preflight_scale.py                            # 4 MoE targets x 3 setups x 2k/4k/8k
    python scripts/studies/preflight_scale.py --targets Qwen/Qwen3-235B-A22B --lengths 4096 train.batch_size=2

Per cell, the mildest placement that fits, tried in this order: the target whole on every rank, then
`target_placement=tp` sizes (inside a node), then `ep` sizes (experts over whole nodes too), each under
ZeRO-3; where none fits, the lowest peak and no tick. Columns:
- online: the run itself (the target's share per rank, the head, its batch and step);
- offline training: the run reading a finished capture (the target's embedding, norm and LM head only);
- capture: the capture as its own job on draftsmith's engine (`data capture` under torchrun), which an
  offline run needs first; the offline route fits when both of its columns do.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from draftsmith.runtime.heads.aux_layers import resolve_aux_layers
from draftsmith.train.config import load_train_config
from draftsmith.train.preflight.capture import draftsmith_capture
from draftsmith.train.preflight.estimate import Knobs, Setup
from draftsmith.train.preflight.plan import placements_over
from draftsmith.train.preflight.report import estimate_cached
from draftsmith.train.preflight.shapes import TargetShapes

TARGETS = [
    "Qwen/Qwen3-30B-A3B",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "Qwen/Qwen3-235B-A22B",
    "deepseek-ai/DeepSeek-V3",
]
SETUPS = [("8 x 80 GB", 8, 80.0), ("8 x 141 GB", 8, 141.0), ("2 x 8 x 80 GB", 16, 80.0)]


def name_of(words: str, n: int, dense: bool) -> str:
    if n == 1:
        return "whole"
    return f"TP={n}" if " tp_size" in words else f"EP={n}" + ("" if dense else " (attn whole)")


def mildest(peaks: list[tuple[str, float]], budget: float) -> str:
    """The first (placement, peak) that fits, else the lowest, as a cell (✓ where it fits)."""
    fitting = [(p, v) for p, v in peaks if v <= budget]
    placement, peak = fitting[0] if fitting else min(peaks, key=lambda pv: pv[1])
    return f"{placement}: {peak / 1e9:.1f}" + (" ✓" if fitting else "")


def cells(shapes: TargetShapes, knobs: Knobs, world: int, budget: float, aux: int) -> list[str]:
    options = placements_over(shapes.config, world, frozen=True)
    online, capture = [], []
    for words, n, dense in options:
        setup = Setup("zero3", world, tp=n, dense=dense)
        online.append((name_of(words, n, dense), estimate_cached(shapes, knobs, setup).peak))
        job = draftsmith_capture(
            shapes, knobs, setup, aux, parts=False, placement="ep" if not dense else "tp"
        )
        capture.append((name_of(words, n, dense), job.peak))
    offline = estimate_cached(shapes, replace(knobs, mode="offline"), Setup("zero3", world)).peak
    return [mildest(online, budget), f"{offline / 1e9:.1f}" + (" ✓" if offline <= budget else ""),
            mildest(capture, budget)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="2048,4096,8192", help="T values, comma-separated")
    parser.add_argument("--targets", default=",".join(TARGETS), help="Hub ids under configs/targets/")
    parser.add_argument("overrides", nargs="*", default=["train.batch_size=1"], help="train config overrides")
    args = parser.parse_args()
    print("| target | setup | T | online (ZeRO-3) | offline training | capture (own job) |")
    print("|---|---|---|---|---|---|")
    for name in args.targets.split(","):
        shapes = TargetShapes.load(name, torch.bfloat16)
        for label, world, gb in SETUPS:
            for length in map(int, args.lengths.split(",")):
                cfg = load_train_config(
                    None, [f"target={name}", f"data.max_length={length}", *args.overrides]
                )
                knobs, aux = (
                    Knobs.from_config(cfg, shapes),
                    resolve_aux_layers(cfg.head.aux_layers, shapes.layers),
                )
                row = cells(shapes, knobs, world, gb * 1e9, len(aux))
                print(f"| {name} | {label} | {length} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
