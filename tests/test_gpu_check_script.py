"""scripts/gpu_check.sh lists every GPU-only path with the default it is measured against (issue 45 item 6),
without running anything: a GPU run needs a lease, so the plan is checked here.

    .venv/bin/python -m pytest tests/test_gpu_check_script.py -q
"""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_ONLY = {  # option -> its default, what CI runs
    "train.ttt_attention=flex": "train.ttt_attention=decomposed",
    "DRAFTSMITH_KERNELS=triton": "DRAFTSMITH_KERNELS=auto",
    "--cuda-graphs": "eager",
    "--quantize fp8": "--quantize none",
    "--attention flex or triton": "--attention sdpa",
}


@pytest.mark.parametrize("flags", [["--list"], ["--dry-run", "--list"]])
def test_the_check_lists_each_gpu_only_path_against_its_default(tmp_path, flags):
    out = tmp_path / "gpu-check"
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", *flags], cwd=ROOT, env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if " | " in line][1:]
    for option, default in GPU_ONLY.items():
        row = next((r for r in rows if r.startswith(option)), None)
        assert row is not None, (option, done.stdout)
        assert default in row.split(" | ")[1] and row.split(" | ")[2], row  # a default and a measuring step
    assert len(rows) == len(GPU_ONLY)
    assert not out.exists()  # listed only: nothing installed, run or written
    assert ("dry run" in done.stdout) == ("--dry-run" in flags)


def test_an_unknown_argument_is_refused(tmp_path):
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--bogus"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--bogus" in done.stderr
