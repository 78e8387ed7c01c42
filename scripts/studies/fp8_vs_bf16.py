"""Two EAGLE-3 heads trained at equal steps on bfloat16 vs fp8 captures of the same data, side by side:
validation accuracy per TTT step (issue 22's goal: at most 1% relative drop with fp8).

    python scripts/studies/fp8_vs_bf16.py --out runs/fp8-vs-bf16                        # the recipe config
    python scripts/studies/fp8_vs_bf16.py --out runs/fp8-small --small            # a pipeline check (minutes)
    python scripts/studies/fp8_vs_bf16.py --out runs/x --fp8-all train.max_steps=900  # + all-fp8, overrides
    python scripts/studies/fp8_vs_bf16.py --out runs/x --seeds 0,1                  # the seed-to-seed control
    python scripts/studies/fp8_vs_bf16.py --out runs/x --seeds 0,1 --bf16-layers 1   # + fp8 with layer 1 bf16

Both runs share one data folder (OUT/data: prepare and vocab made once, one capture per storage), the same
seed, sample order and head init, so the captures' storage is the only difference. `--fp8-all` adds a
third run with the last hidden state (the target's logits) in fp8 too, `--bf16-layers L` one with aux layer
L kept in bfloat16 (`data.fp8_bf16_layers`). Prints one row per TTT step and the captures' bytes per
token; writes OUT/fp8_vs_bf16.json. Finished runs are not trained again: rerun with more storages or
seeds and only the new runs train (a finished run is scored again, deterministically).

`--seeds 0,1` trains every storage once per seed (train.seed: head init and sample order; runs of seed s > 0
are named NAME-seedS) and adds the control a 1% goal needs: per TTT step, fp8's gap to bf16 at each seed
next to the gap between two bf16 runs that differ only by seed (for every storage other than bf16). A
storage effect smaller than the seed-to-seed spread cannot be told from noise at this many steps and rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import train

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


def relative(a: float, b: float) -> float:
    return (a - b) / max(b, 1e-9)


def seed_control(results: dict[str, dict], seeds: list[int], storage: str = "fp8") -> dict:
    """Per TTT step: `storage`'s relative gap to bf16 at each seed and their mean, and bf16 seed s vs
    seed 0."""
    name = lambda storage, seed: storage if seed == seeds[0] else f"{storage}-seed{seed}"  # noqa: E731
    acc = lambda storage, seed: results[name(storage, seed)]["accuracy_per_step"]  # noqa: E731
    steps = range(len(acc("bf16", seeds[0])))
    gap = {s: [relative(acc(storage, s)[k], acc("bf16", s)[k]) for k in steps] for s in seeds}
    seed_gap = {s: [relative(acc("bf16", s)[k], acc("bf16", seeds[0])[k]) for k in steps] for s in seeds[1:]}
    mean = [sum(gap[s][k] for s in seeds) / len(seeds) for k in steps]
    return {
        "storage": storage,
        f"{storage}_vs_bf16_per_seed": gap,
        f"{storage}_vs_bf16_mean": mean,
        "bf16_seed_vs_seed": seed_gap,
    }


def control_lines(control: dict) -> list[str]:
    storage = control["storage"]
    per_seed, means = control[f"{storage}_vs_bf16_per_seed"], control[f"{storage}_vs_bf16_mean"]
    seeds = list(per_seed)
    head = " | ".join(f"{storage} gap s{s}" for s in seeds) + f" | {storage} gap mean | "
    head += " | ".join(f"bf16 s{s} vs s{seeds[0]}" for s in control["bf16_seed_vs_seed"])
    lines = ["TTT step | " + head]
    for k, mean in enumerate(means):
        cells = [f"{per_seed[s][k]:+.2%}" for s in seeds] + [f"{mean:+.2%}"]
        cells += [f"{gap[k]:+.2%}" for gap in control["bf16_seed_vs_seed"].values()]
        lines.append(f"{k:8d} | " + " | ".join(cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder of the runs and their shared data")
    parser.add_argument("--config", default="configs/eagle3-smollm2-135m.yaml", help="the train config")
    parser.add_argument("--small", action="store_true", help="a pipeline check of a few minutes")
    parser.add_argument("--fp8-all", action="store_true", help="also a run with the last hidden in fp8")
    parser.add_argument("--seeds", default="0", help="train.seed values, e.g. 0,1 for the seed control")
    parser.add_argument(
        "--bf16-layers", default=None, help="also fp8 with these aux layer ids kept in bfloat16, e.g. 1"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    args = parser.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    storages = {**RUNS, **({"fp8-all": FP8_ALL} if args.fp8_all else {})}
    if args.bf16_layers:
        storages[f"fp8-bf16-{args.bf16_layers.replace(',', '-')}"] = [
            "data.storage_dtype=fp8",
            f"data.fp8_bf16_layers=[{args.bf16_layers}]",
        ]
    runs = {  # bf16 at every seed first: the seed-to-seed spread is known before the fp8 runs end
        (name if seed == seeds[0] else f"{name}-seed{seed}"): [*storage, f"train.seed={seed}"]
        for name, storage in storages.items()
        for seed in seeds
    }
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
    if len(seeds) > 1:
        report["seed_control"] = {s: seed_control(results, seeds, s) for s in storages if s != "bf16"}
        for control in report["seed_control"].values():
            lines += ["", *control_lines(control)]
    (args.out / "fp8_vs_bf16.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"validation accuracy per TTT step at step {report['step']} ({report['rows']} rows)")
    print("\n".join(lines))
    print("capture bytes/token:", json.dumps(report["capture_bytes_per_token"]))


if __name__ == "__main__":
    main()
