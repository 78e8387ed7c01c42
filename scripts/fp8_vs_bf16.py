"""Two EAGLE-3 heads trained at equal steps on bfloat16 vs fp8 captures of the same data, side by side:
validation accuracy per TTT step (issue 22's goal: at most 1% relative drop with fp8).

    python scripts/fp8_vs_bf16.py --out runs/fp8-vs-bf16                        # the recipe config
    python scripts/fp8_vs_bf16.py --out runs/fp8-small --small                  # a pipeline check (minutes)
    python scripts/fp8_vs_bf16.py --out runs/x --fp8-all train.max_steps=900    # + all-fp8; any overrides

Both runs share one data folder (OUT/data: prepare and vocab made once, one capture per storage), the same
seed, sample order and head init, so the captures' storage is the only difference. `--fp8-all` adds a
third run with the last hidden state (the target's logits) in fp8 too. Prints one row per TTT step and
the captures' bytes per token; writes OUT/fp8_vs_bf16.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.train.config import load_train_config
from draftsmith.train.trainer import train

RUNS = {"bf16": ["data.storage_dtype=bfloat16"], "fp8": ["data.storage_dtype=fp8"]}
FP8_ALL = ["data.storage_dtype=fp8", "data.fp8_last_hidden=true"]
# a few minutes on 2 CPU cores: checks the pipeline, says nothing about the 1% goal
SMALL = [
    "data.max_samples=48",
    "data.max_length=128",
    "data.validation_fraction=0.25",
    "train.max_steps=16",
    "train.batch_size=2",
    "train.warmup_steps=4",
    "train.ttt_steps=3",
    "eval.every=16",
    "eval.max_rows=12",
    "checkpoint.every=16",
    "log.every=4",
]


def last_eval(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "eval"][-1]


def capture_bytes_per_token(data: Path) -> dict[str, float]:
    out = {}
    for record in sorted(data.glob("capture-*/draftsmith_data.json")):
        outputs = json.loads(record.read_text())["outputs"]
        out[record.parent.name] = round(outputs["bytes_per_token"], 1)
    return out


def table(results: dict[str, dict]) -> list[str]:
    names = list(results)
    steps = len(results["bf16"]["accuracy_per_step"])
    lines = ["TTT step | " + " | ".join(names) + " | " + " | ".join(f"{n} rel." for n in names[1:])]
    for k in range(steps):
        accs = [results[n]["accuracy_per_step"][k] for n in names]
        rel = [f"{(a - accs[0]) / max(accs[0], 1e-9):+.2%}" for a in accs[1:]]
        lines.append(f"{k:8d} | " + " | ".join(f"{a:.4f}" for a in accs) + " | " + " | ".join(rel))
    taus = [results[n]["simulated_tau"] for n in names]
    lines.append("sim. tau | " + " | ".join(f"{t:.4f}" for t in taus))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder of the runs and their shared data")
    parser.add_argument("--config", default="configs/eagle3-smollm2-135m.yaml", help="the train config")
    parser.add_argument("--small", action="store_true", help="a pipeline check of a few minutes")
    parser.add_argument("--fp8-all", action="store_true", help="also a run with the last hidden in fp8")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    args = parser.parse_args()
    runs = {**RUNS, **({"fp8-all": FP8_ALL} if args.fp8_all else {})}
    shared = [
        "data.mode=offline",
        f"data.dir={args.out / 'data'}",
        *(SMALL if args.small else []),
        *args.overrides,
    ]
    results = {}
    for name, storage in runs.items():
        out = args.out / name
        train(load_train_config(args.config, [*shared, *storage, f"output_dir={out}"]))
        results[name] = last_eval(out)
    lines = table(results)
    report = {
        "small_check": args.small,
        "step": results["bf16"]["step"],
        "rows": results["bf16"]["rows"],
        "runs": results,
        "capture_bytes_per_token": capture_bytes_per_token(args.out / "data"),
    }
    (args.out / "fp8_vs_bf16.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"validation accuracy per TTT step at step {report['step']} ({report['rows']} rows)")
    print("\n".join(lines))
    print("capture bytes/token:", json.dumps(report["capture_bytes_per_token"]))


if __name__ == "__main__":
    main()
