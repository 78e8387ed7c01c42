"""The suite's float tolerances (tests/tolerances.py) hold on the other CPU kind and are not vacuous.

CI and developers get Intel machines with AVX-512 and AMD EPYC machines with AVX2 only, whose GEMM kernels
sum in other orders. On an AVX-512 machine, `AVX2_KERNELS` makes PyTorch's own kernels, MKL and oneDNN
take their AVX2 paths: that reproduced, digit for digit, the AMD failure of a fixed 1e-5 tolerance (1.1966e-5
at index 30 in test_unrolled_steps_equal_the_drafters_chain). On an AVX2 machine it changes nothing.
Run: pytest tests/test_tolerances.py
"""

import os
import subprocess
import sys
from pathlib import Path

import torch
from tolerances import AVX2_KERNELS, float64_atol, rounding_atol

ROOT = Path(__file__).parents[1]
# The files whose comparisons are closest to the rounding they allow: algorithm tests in float64 and
# parity tests in fp32 through the tiny targets, the heads and the attention kernels.
FLOAT_COMPARISONS = [
    "tests/train/test_eagle3_objective.py",
    "tests/train/test_mtp_objective.py",
    "tests/runtime/test_eagle3.py",
    "tests/runtime/test_eagle3_drafter.py",
    "tests/runtime/test_mtp_drafter.py",
    "tests/runtime/test_target.py",
    "tests/runtime/test_static_forward.py",
    "tests/runtime/test_speculators_interop.py",
    "tests/data_recipes/test_capture.py",
    "tests/kernels/test_kernels.py",
]


def test_float_comparisons_pass_with_the_other_cpu_kinds_kernels():
    env = {**os.environ, **AVX2_KERNELS}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FLOAT_COMPARISONS]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_the_fp32_allowance_covers_reordered_sums_and_no_more():
    """fp32 dot products of 4096 terms summed in two orders (one BLAS call; sequential blocks of 7) differ
    by less than `rounding_atol`, while one term changed by a hundred-thousandth of a term does not pass."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 4096, generator=g), torch.randn(4096, generator=g)
    whole = a @ b  # [64]
    blocked = torch.zeros(64)
    for start in range(0, 4096, 7):
        blocked = blocked + a[:, start : start + 7] @ b[start : start + 7]
    exact = (a.double() @ b.double()).float()
    atol = rounding_atol(torch.float32, 4096, exact.abs().max().item())
    assert (whole - blocked).abs().max() <= atol and (whole - exact).abs().max() <= atol
    wrong = whole + a[:, 0] * b[0] * 1e-5 * 4096  # an algorithmic slip of one term's size / 25
    assert (wrong - whole).abs().max() > atol


def test_float64_allowance_is_far_below_what_the_algorithm_tests_catch():
    assert float64_atol(10_000, 60.0) < 2e-10  # a one-position rotary slip moves a head's output by 2e-4
    assert rounding_atol(torch.bfloat16, 4, 1.0) == 4 * 2**-7
