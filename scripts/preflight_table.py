"""The memory preflight's estimate per rank for the shipped target configs, as a markdown table (the one in
BENCHMARKS.md). No weights are read: each target is a meta-device model built from configs/targets/.

    python scripts/preflight_table.py                                   # EAGLE-3 online, B=1, 8 x 80 GB
    python scripts/preflight_table.py --lengths 2048,4096 train.batch_size=1 head.draft_vocab_size=32000

Columns: the peak per rank with the target whole on every rank (target_placement=replicate, the default)
under each head strategy; then the smallest tp_size of target_placement=tp that fits (the layers split,
the embedding, final norm and LM head whole), and offline mode (only those three resident), both under
ZeRO-3. A tick marks what fits the budget.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from draftsmith.train.config import load_train_config
from draftsmith.train.preflight import Knobs, Setup
from draftsmith.train.preflight_report import estimate_cached, tp_sizes
from draftsmith.train.preflight_shapes import TargetShapes

STRATEGIES = {"ddp": "DDP", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp": "FSDP2"}
TARGETS = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-32B", "meta-llama/Llama-3.3-70B-Instruct"]


def cell(peak: float, budget: float) -> str:
    return f"{peak / 1e9:.1f}" + (" ✓" if peak <= budget else "")


def rows(targets, lengths, overrides, world: int, budget: float):
    for name in targets:
        shapes = TargetShapes.load(name, torch.bfloat16)
        for length in lengths:
            cfg = load_train_config(None, [f"target={name}", f"data.max_length={length}", *overrides])
            knobs = Knobs.from_config(cfg, shapes)
            whole = {s: estimate_cached(shapes, knobs, Setup(s, world)).peak for s in STRATEGIES}
            split = "no tp_size fits"
            for tp in tp_sizes(shapes, world):
                peak = estimate_cached(shapes, knobs, Setup("zero3", world, tp=tp)).peak
                if peak <= budget:
                    split = f"TP={tp}: {cell(peak, budget)}"
                    break
            offline = estimate_cached(shapes, replace(knobs, mode="offline"), Setup("zero3", world)).peak
            yield name, length, whole, split, cell(offline, budget)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="2048,4096,8192,16384", help="T values, comma-separated")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--device-gb", type=float, default=80.0)
    parser.add_argument("overrides", nargs="*", default=["train.batch_size=1"], help="train config overrides")
    args = parser.parse_args()
    budget = args.device_gb * 1e9
    head = [
        "target",
        "T",
        *(f"{v} (whole)" for v in STRATEGIES.values()),
        "target_placement=tp, ZeRO-3",
        "offline, ZeRO-3",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    lengths = [int(t) for t in args.lengths.split(",")]
    for name, length, whole, split, offline in rows(
        TARGETS, lengths, args.overrides, args.world_size, budget
    ):
        cells = [name.split("/")[-1], f"{length // 1024}k", *(cell(p, budget) for p in whole.values())]
        print("| " + " | ".join([*cells, split, offline]) + " |")


if __name__ == "__main__":
    main()
