"""Ship a finished training run's head in the repository: heads/NAME/ (draftsmith layout, bfloat16).

    python scripts/ship_head.py --run runs/eagle3-smollm2-135m --name eagle3-smollm2-135m \
        --command "draftsmith train --config configs/eagle3-smollm2-135m.yaml" --commit 03090e7 \
        --train-log runs/eagle3-recipe.log
    # after `draftsmith demo` benched the shipped head, quote its rows in the card:
    python scripts/ship_head.py --name eagle3-smollm2-135m --bench runs/demo/bench/results.json

Writes heads/NAME/: config.json (the head's own), model.safetensors (floating tensors in bfloat16, the
vocabulary maps as they are: half the bytes, and `from_pretrained` loads them into the target's dtype),
training.json (command, commit, machine, date, steps, training seconds from the progress bar's last
line, the last validation row), train_config.yaml (the run's resolved config), training_curve.png and
README.md (the model card: train/model_card.py's sections plus where and how it was trained). The
folder is written next to the destination and renamed over it (the card last, atomically), so a failed
run leaves the old one.
`--bench FILE` copies that bench's results.json, meta.json and report.md into heads/NAME/bench/ and
quotes its rows (run from the repository root: they name `heads/NAME`); alone it keeps the weights.
The issue's size cap (25 MB) is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file, save_file

from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.heads import head_kinds
from draftsmith.train.model_card import CardFacts, bench_rows, model_card, run_facts

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 25 * 1024 * 1024  # the cap on a shipped head


def machine() -> str:
    """'AMD EPYC, 2 cores, Linux x86_64': the CPU model name, as /proc/cpuinfo says it."""
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        names = re.findall(r"^model name\s*:\s*(.+)$", info.read_text(), re.M)
        cpu = names[0].strip() if names else cpu
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


def progress_seconds(log: Path) -> float:
    """Seconds of the training loop: the elapsed field of tqdm's last `train: ... N/N [MM:SS<` line."""
    found = re.findall(r"train:.*?\|\s*(\d+)/(\d+) \[((?:\d+:)?\d+:\d+)<", log.read_text(errors="replace"))
    done = [f for f in found if f[0] == f[1]]
    if not done:
        sys.exit(f"ship_head: {log} has no finished `train:` progress bar")
    parts = [int(p) for p in done[-1][2].split(":")]
    return float(sum(p * 60**i for i, p in enumerate(reversed(parts))))


def write_weights(final: Path, dest: Path) -> int:
    """Floating tensors -> bfloat16 (the int maps stay exact) -> dest/model.safetensors; its bytes."""
    tensors = load_file(final / "model.safetensors")
    half = {
        k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()
    }
    save_file(
        half, dest / "model.safetensors", {"format": "pt", "head_type": head_kinds.of_folder(final).name}
    )
    return (dest / "model.safetensors").stat().st_size


def card(folder: Path, record: dict, bench: Path | None) -> str:
    """The model card: the registry's sections for the draftsmith layout, then the provenance."""
    config = json.loads((folder / "config.json").read_text())
    run = {"config": yaml.safe_load((folder / "train_config.yaml").read_text()), "eval": record["validation"]}
    run |= {"dir": str(folder.relative_to(ROOT)), "config_file": "configs/" + record["config_name"]}
    rows, meta = bench_rows(bench, folder) if bench else ([], {})
    params = record["parameters"]
    text = model_card(
        CardFacts(
            format="draftsmith",
            head_type=config["head_type"],
            target=config["target"],
            size=f"{params / 1e6:.1f}M parameters, bfloat16",
            precision="bfloat16 weights (trained in float32, cast once when shipped)",
            run=run,
            bench=rows,
            bench_meta=meta,
        )
    )
    minutes, alone = record["train_seconds"] / 60, record.get("seconds_per_step_alone")
    lines = [
        "## Provenance\n",
        f"- trained by `{record['command']}` at commit `{record['commit']}`",
        f"- on {record['machine']} (torch {record['torch']}), {record['date']}: {record['steps']} steps in "
        f"{minutes:.1f} min ({record['train_seconds'] / record['steps']:.2f} s per step; the loop alone: "
        "target loading and data steps excluded)",
        *([f"- alone on the machine a step took about {alone} s"] if alone else []),
        *([f"- note: {record['note']}"] if record.get("note") else []),
        "- stored in bfloat16 (trained in float32); `draftsmith demo` benches this folder as shipped",
    ]
    return text + "\n" + "\n".join(lines) + "\n"


def ship(args: argparse.Namespace) -> Path:
    dest = ROOT / "heads" / args.name
    work = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    if args.run:
        run = Path(args.run)
        final, facts = run / "final", run_facts(run)
        if not (final / "config.json").is_file() or not facts.get("eval"):
            sys.exit(f"ship_head: {run} has no final/ head or no validation row in metrics.jsonl")
        work.mkdir(parents=True)
        shutil.copy(final / "config.json", work / "config.json")
        size = write_weights(final, work)
        if size > MAX_BYTES:
            sys.exit(f"ship_head: model.safetensors is {size / 2**20:.1f} MiB, over the 25 MiB cap")
        shutil.copy(run / "config.yaml", work / "train_config.yaml")
        if (run / "training_curve.png").is_file():
            shutil.copy(run / "training_curve.png", work / "training_curve.png")
        tensors = load_file(work / "model.safetensors")
        record = {
            "command": args.command,
            "config_name": Path(args.command.split("--config")[-1].split()[0]).name,
            "commit": args.commit or git_head(),
            "machine": machine(),
            "torch": torch.__version__,
            "date": args.date,
            "steps": facts["eval"]["step"],
            "train_seconds": progress_seconds(Path(args.train_log)),
            "validation": facts["eval"],
            "parameters": sum(v.numel() for v in tensors.values() if v.is_floating_point()),
            "bytes": size,
            "note": args.note,
            "seconds_per_step_alone": args.alone_s_per_step,  # None: the run was alone on the machine
        }
    else:
        if not (dest / "training.json").is_file():
            sys.exit(f"ship_head: {dest} is not a shipped head yet (pass --run first)")
        shutil.copytree(dest, work)
        record = json.loads((work / "training.json").read_text())
    if args.bench:  # the rows travel with the head: heads/NAME/bench/{results,meta}.json, report.md
        source = Path(args.bench)
        (work / "bench").mkdir(exist_ok=True)
        for name in ("results.json", "meta.json", "report.md"):
            if (source.with_name(name)).is_file():
                shutil.copy(source.with_name(name), work / "bench" / name)
        record["bench"] = str((dest / "bench" / "results.json").relative_to(ROOT))
    (work / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    work.rename(dest)
    bench = Path(record["bench"]) if record.get("bench") else None  # its rows name heads/NAME itself
    atomic_write_text(dest / "README.md", card(dest, record, bench))
    return dest


def git_head() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="heads/NAME")
    p.add_argument("--run", help="the finished training run (its final/, config.yaml, metrics.jsonl)")
    p.add_argument("--command", default="", help="the command that trained it")
    p.add_argument("--commit", default="", help="the commit that trained it (default: HEAD)")
    p.add_argument("--train-log", help="the training's log (its tqdm bar gives the training time)")
    p.add_argument("--date", default="", help="when it was trained (UTC)")
    p.add_argument("--note", default="", help="anything that affected the run (e.g. other jobs on the CPU)")
    p.add_argument("--alone-s-per-step", type=float, help="s/step while nothing else ran (a shared run)")
    p.add_argument("--bench", help="a `draftsmith bench` results.json that measured heads/NAME")
    args = p.parse_args()
    args.bench = args.bench and str(Path(args.bench).resolve())
    os.chdir(ROOT)  # the bench rows and the card name heads/NAME relative to the repository
    print(ship(args))


if __name__ == "__main__":
    main()
