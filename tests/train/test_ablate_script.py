"""scripts/studies/ablate_eagle3.py: its table from results (fast), and a smoke run on the tiny target with
two levers and a 1-second budget each, then a rerun that skips both (slow: ~30 s on a loaded 2-core CPU).

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_ablate_script.py -q -m "slow or not slow"
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_files import load_repo_file

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "studies" / "ablate_eagle3.py"


def load_script():
    return load_repo_file("scripts/studies/ablate_eagle3.py")


def result(lever, tau, accs, overrides=()):
    return {
        "lever": lever,
        "overrides": list(overrides),
        "max_steps": 10,
        "seconds_per_step": 1.5,
        "train_tokens_per_s": 100.0,
        "accuracy_per_step": accs,
        "simulated_tau": tau,
        "val_loss": 3.0,
    }


def test_the_table_marks_the_best_and_the_difference_to_the_baseline():
    ablate = load_script()
    text = ablate.table(
        [result("baseline", 1.3, [0.3, 0.0]), result("loss-tv", 1.45, [0.35, 0.3], ["head.loss=tv"])], 5
    )
    lines = text.splitlines()
    assert "| acc0 | acc1 | sim. tau | vs baseline |" in lines[2]
    assert lines[4].startswith("| baseline | - | 10 | 1.50 | 100.0 | 0.300 | 0.000 | 1.300 | +0.000 |")
    assert lines[5].startswith("| **loss-tv** | head.loss=tv |") and "| 1.450 | +0.150 |" in lines[5]
    assert "Best simulated tau: loss-tv" in text


@pytest.mark.slow
def test_a_tiny_ablation_runs_and_resumes(tiny_dir, source, tmp_path):
    out = tmp_path / "out"
    settings = [f"target={tiny_dir}", f"data.source={source}", f"data.dir={tmp_path / 'data'}"]
    settings += ["data.max_length=64", "data.max_samples=40", "data.validation_fraction=0.2"]
    settings += ["head.aux_layers=0,1,2", "head.draft_vocab_size=64", "train.batch_size=2"]
    settings += ["eval.max_rows=4", "log.every=1", "log.progress=false"]  # the recipe's 7 TTT steps
    argv = [sys.executable, str(SCRIPT), "--minutes-per-run", "0.02", "--out", str(out)]
    argv += ["--levers", "baseline,ttt-schedule", "--probe-steps", "2", "--set", *settings]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    results = json.loads((out / "ablation.json").read_text())
    assert [r["lever"] for r in results] == ["baseline", "ttt-schedule"]
    for r in results:
        assert r["max_steps"] >= 1 and len(r["accuracy_per_step"]) == 7 and r["simulated_tau"] >= 1.0
    rows = [json.loads(x) for x in (out / "ttt-schedule" / "run" / "metrics.jsonl").read_text().splitlines()]
    stages = [r["ttt_steps"] for r in rows if r["kind"] == "train"]
    steps = results[1]["max_steps"]
    switch = math.ceil(0.3 * steps - 1e-9)  # "3,7@0.3": 3 TTT steps, then 7 from 30% of the run
    assert stages == [3] * switch + [7] * (steps - switch)
    assert (out / "ablation.md").read_text().count("\n| ") == 3  # header + two runs
    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and again.stderr.count("finished before: skipped") == 2, again.stderr[-2000:]
