"""scripts/studies/fp8_vs_bf16.py: the run names per seed and the seed control's arithmetic, from made-up
results (fast; the script's training runs take hours and are measured in BENCHMARKS.md).

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_fp8_vs_bf16_script.py -q
"""

import pytest
from repo_files import load_repo_file


def load_script():
    return load_repo_file("scripts/studies/fp8_vs_bf16.py")


def run(accs):
    return {"accuracy_per_step": accs, "simulated_tau": 1.0 + sum(accs)}


def test_seed_control_separates_the_storage_gap_from_the_seed_gap():
    script = load_script()
    results = {
        "bf16": run([0.40, 0.20]),
        "fp8": run([0.38, 0.21]),  # -5%, +5%
        "bf16-seed1": run([0.44, 0.18]),  # +10%, -10% against bf16 seed 0
        "fp8-seed1": run([0.44, 0.171]),  # 0%, -5%
    }
    control = script.seed_control(results, [0, 1])
    assert control["fp8_vs_bf16_per_seed"][0] == pytest.approx([-0.05, 0.05])
    assert control["fp8_vs_bf16_per_seed"][1] == pytest.approx([0.0, -0.05])
    assert control["fp8_vs_bf16_mean"] == pytest.approx([-0.025, 0.0])
    assert control["bf16_seed_vs_seed"][1] == pytest.approx([0.10, -0.10])
    lines = script.control_lines(control)
    assert lines[0].startswith("TTT step | fp8 gap s0 | fp8 gap s1 | fp8 gap mean | bf16 s1 vs s0")
    assert lines[1].split(" | ")[1:] == ["-5.00%", "+0.00%", "-2.50%", "+10.00%"]


def test_seed_control_needs_every_run():
    script = load_script()
    with pytest.raises(KeyError, match="fp8-seed1"):
        script.seed_control({"bf16": run([0.4]), "fp8": run([0.4]), "bf16-seed1": run([0.4])}, [0, 1])


def test_seed_control_of_another_storage_names_it():
    script = load_script()
    results = {
        "bf16": run([0.40]),
        "fp8-bf16-1": run([0.42]),  # +5%
        "bf16-seed1": run([0.50]),
        "fp8-bf16-1-seed1": run([0.45]),  # -10%
    }
    control = script.seed_control(results, [0, 1], "fp8-bf16-1")
    assert control["fp8-bf16-1_vs_bf16_mean"] == pytest.approx([-0.025])
    lines = script.control_lines(control)
    assert lines[0].startswith("TTT step | fp8-bf16-1 gap s0 | fp8-bf16-1 gap s1 | fp8-bf16-1 gap mean")
    assert lines[1].split(" | ")[1:] == ["+5.00%", "-10.00%", "-2.50%", "+25.00%"]
