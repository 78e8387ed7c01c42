"""An EAGLE-3 head trained against a frozen target next to one trained with the target co-trained, at
equal steps on the same data (the same config but `cotrain.enabled`), with the co-trained target's drift.

    python scripts/studies/eagle3_cotrain_compare.py --config configs/eagle3-cotrain-lora-smollm2-135m.yaml \
        --out runs/e3-compare train.max_steps=450
    python scripts/studies/eagle3_cotrain_compare.py --tiny --out /tmp/e3-compare train.max_steps=100  # secs

Runs `OUT/frozen` (cotrain.enabled=false) and `OUT/cotrained` one after the other (each resumes if
rerun), then prints one JSON line per run from its last evaluation row: validation accuracy per TTT
step (against that run's own target: the original, or the co-trained one the head ships with), simulated
tau, and for the co-trained run the drift report. `--tiny` swaps in the tests' tiny random target and
conversations (tests/tiny_models.py, tests/train_data.py): it shows the mechanics, not SmolLM2's numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import train

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("step", "accuracy_per_step", "simulated_tau", "loss")
DRIFT = ("target_val_loss", "original_target_val_loss", "target_kl_to_original", "target_argmax_agreement")


def tiny_overrides(out: Path) -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import make_tiny_dir
    from train_data import tiny_train_overrides, write_conversations

    target = out / "tiny-target"
    if not (target / "config.json").is_file():
        make_tiny_dir(target)
    source = write_conversations(out / "convs.jsonl", n=400)
    return [f"target={target}", *tiny_train_overrides(source, out / "data"), "data.validation_fraction=0.1"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "configs" / "eagle3-cotrain-lora-smollm2-135m.yaml"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny random target and data")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for both runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = (tiny_overrides(args.out) if args.tiny else []) + ["eval.every=0", "log.progress=false"]
    for name, cotrain in (("frozen", "false"), ("cotrained", "true")):
        extra = [*base, *args.overrides, f"cotrain.enabled={cotrain}", f"output_dir={args.out / name}"]
        last = train(load_train_config(args.config, extra))
        row = {"run": name, **{k: last[k] for k in KEYS}, **{k: last[k] for k in DRIFT if k in last}}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
