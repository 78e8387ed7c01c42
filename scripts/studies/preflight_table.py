"""The memory preflight's estimate per rank for the shipped target configs, as a markdown table (the one in
BENCHMARKS.md). No weights are read: each target is a meta-device model built from configs/targets/.

    python scripts/studies/preflight_table.py                                 # EAGLE-3 online, B=1, 8 x 80 GB
    python scripts/studies/preflight_table.py --lengths 2048,4096 train.batch_size=1 \
        head.draft_vocab_size=32000

Columns: the peak per rank with the target whole on every rank (target_placement=replicate, the default)
under each head strategy; then the smallest tp_size of target_placement=tp that fits (the layers split,
the embedding, final norm and LM head whole), and offline mode (only those three resident), both under
ZeRO-3. A tick marks what fits the budget.

    python scripts/studies/preflight_table.py --targets moe --lengths 2048,4096  # Qwen3-MoE, Mixtral, DS-V3

For MoE targets (train/preflight/families.py) the TP split keeps every expert on every rank at 1/tp of its
width (transformers' plan, runtime/core/placement_moe.py). For MLA targets (DeepSeek-V3), which
draftsmith's TP loader refuses, the TP column is a what-if marked "(what-if)": the split vLLM makes, and
what it would need per rank.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from draftsmith.train.config import load_train_config
from draftsmith.train.preflight.estimate import Knobs, Setup
from draftsmith.train.preflight.families import tp_is_what_if, what_if_tp_sizes
from draftsmith.train.preflight.report import estimate_cached, tp_sizes
from draftsmith.train.preflight.shapes import TargetShapes

STRATEGIES = {"ddp": "DDP", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp": "FSDP2"}
TARGETS = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-32B", "meta-llama/Llama-3.3-70B-Instruct"]
MOE_TARGETS = [
    "Qwen/Qwen3-30B-A3B",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "Qwen/Qwen3-235B-A22B",
    "deepseek-ai/DeepSeek-V3",
]
PRESETS = {"dense": TARGETS, "moe": MOE_TARGETS}


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
            what_if = tp_is_what_if(shapes)  # draftsmith's TP loader refuses it (DeepSeek-V3's MLA)
            sizes = what_if_tp_sizes(shapes, world) if what_if else tp_sizes(shapes, world)
            for tp in sizes:
                peak = estimate_cached(shapes, knobs, Setup("zero3", world, tp=tp)).peak
                if peak <= budget or (what_if and tp == sizes[-1]):  # a what-if: its best
                    split = f"TP={tp}{' (what-if)' if what_if else ''}: {cell(peak, budget)}"
                    if peak <= budget:
                        break
            offline = estimate_cached(shapes, replace(knobs, mode="offline"), Setup("zero3", world)).peak
            yield name, length, whole, split, cell(offline, budget)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="2048,4096,8192,16384", help="T values, comma-separated")
    parser.add_argument(
        "--targets", default="dense", help=f"a preset ({', '.join(PRESETS)}) or Hub ids, comma-separated"
    )
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
        PRESETS.get(args.targets) or args.targets.split(","), lengths, args.overrides, args.world_size, budget
    ):
        cells = [name.split("/")[-1], f"{length // 1024}k", *(cell(p, budget) for p in whole.values())]
        print("| " + " | ".join([*cells, split, offline]) + " |")


if __name__ == "__main__":
    main()
