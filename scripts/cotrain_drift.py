"""How far a co-trained target drifted from its original, on the run's own validation rows.

    python scripts/cotrain_drift.py runs/mtp-cotrain-lora-smollm2-135m [--original smollm2-135m]

Loads the original target and OUT/final/target side by side and prints, over the supervised positions of
the first `eval.max_rows` validation rows (the rows every evaluation of the run scored): the co-trained
target's next-token CE, KL(original || co-trained) per position, and how often their argmaxes agree; then
the same for the original against itself (the control: KL 0, agreement 1). Training reports these live
for LoRA runs (`target_kl_to_original`, `target_argmax_agreement`); this script also covers full
co-training and finished runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.runtime.core.target import Target
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.data_steps import DataPaths, TrainRows, data_root
from draftsmith.train.objectives.cotrain import drift_sums
from draftsmith.train.objectives.heads import mtp_batch


def report(sums) -> dict:
    n = float(sums[1])
    return {
        "positions": int(n),
        "val_ce": round(float(sums[0]) / n, 5),
        "kl_from_original": round(float(sums[2]) / n, 5),
        "argmax_agreement": round(float(sums[3]) / n, 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a co-training run's output_dir")
    parser.add_argument("--original", default=None, help="the original target (default: the config's)")
    args = parser.parse_args()
    cfg = load_train_config(args.run / "config.yaml")
    original = Target.load(args.original or cfg.target, device="cpu")
    cotrained = Target.load(str(args.run / "final" / "target"), device="cpu")
    root = data_root(cfg, original)
    val = TrainRows(DataPaths(root / "prepared", root / "vocab", None, ""), "validation")
    rows = [val[k] for k in range(min(cfg.eval.max_rows, len(val)))]
    size = cfg.train.batch_size
    batches = [mtp_batch(rows[i : i + size], "cpu", cotrained.dtype) for i in range(0, len(rows), size)]
    print(json.dumps({"rows": len(rows), "co-trained": report(drift_sums(cotrained, original, batches))}))
    print(json.dumps({"control (original vs itself)": report(drift_sums(original, original, batches))}))


if __name__ == "__main__":
    main()
