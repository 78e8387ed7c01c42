"""Float tolerances that follow from the dtype and the number of operations, never from one machine's output.

Two computations of the same value that differ only in the order of their sums (an AVX-512 and an AVX2
GEMM kernel, a KV-cached step and a whole-sequence forward, a blocked and a dense attention) round
differently. For a dot product of n terms the worst case is n * u * sum|a_i b_i| (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., eq. 3.5; u = eps / 2), far from what happens: roundings
behave like independent errors, so the typical error is ~sqrt(n) * u * |result| (Higham and Mary,
"A new approach to probabilistic rounding error analysis", SISC 2019). `rounding_atol` takes
n * eps * scale = 2 n u |result|, a margin of 2 sqrt(n) over that, with n the sums on the longest path
through the compared computation (a network's layers add up). So the suite uses two rules, and each
comparison says which:

- ALGORITHM tests (two code paths must compute the same function: unrolled training vs cached drafting,
  a head's cached steps vs one forward, a kernel vs its reference) run both sides in float64 and compare
  with `float64_atol`: rounding there sits ~1e-13 below any algorithmic difference worth catching, on
  every CPU, and the controls show that a wrong algorithm misses by ~1e-2 or more.
- PARITY tests against another implementation that must stay in the shipped dtype (transformers'
  forward, a bf16 kernel) use `rounding_atol(dtype, accumulations, scale)`: a worst-case bound of
  `accumulations` rounding errors of the dtype at the compared values' scale.

The simulated other CPU kind (`ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
DNNL_MAX_CPU_ISA=AVX2` on an AVX-512 machine) reproduces the AMD EPYC rounding that broke a fixed 1e-5
(tests/test_tolerances.py runs the fragile comparisons that way).
"""

from __future__ import annotations

import torch

# Kernel-selection variables that make an AVX-512 machine compute like an AVX2-only one (AMD EPYC Zen 2/3).
AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}


def rounding_atol(dtype: torch.dtype, accumulations: int, scale: float) -> float:
    """Rounding difference allowed between two summation orders: `accumulations` roundings of `dtype`
    (eps each: both sides round, u = eps / 2 apiece) at magnitude `scale` (at least 1)."""
    return accumulations * torch.finfo(dtype).eps * max(1.0, float(scale))


def layer_accumulations(hidden: int, intermediate: int, seq: int) -> int:
    """Sums on the longest path through one decoder layer: an RMSNorm (hidden), q/k/v (hidden), the
    attention scores (head_dim <= hidden), the weighted sum of values (seq), o_proj (hidden), a second
    RMSNorm (hidden), gate/up (hidden) and down (intermediate)."""
    return 6 * hidden + intermediate + seq


def float64_atol(accumulations: int, scale: float = 1.0) -> float:
    """The float64 bound for ALGORITHM tests (2.2e-16 per rounding): ~1e-12 for thousands of operations."""
    return rounding_atol(torch.float64, accumulations, scale)


def assert_float64_equal(got: torch.Tensor, want: torch.Tensor, accumulations: int = 10_000) -> None:
    """Both sides computed in float64 agree to rounding: `accumulations` roundings at their scale."""
    assert got.dtype == want.dtype == torch.float64, (got.dtype, want.dtype)
    scale = want.abs().max().item() if want.numel() else 1.0
    torch.testing.assert_close(got, want, atol=float64_atol(accumulations, scale), rtol=0)


def assert_rounding_close(got: torch.Tensor, want: torch.Tensor, sums: int, dtype=torch.float32) -> None:
    """A PARITY comparison in `dtype`: equal up to `sums` roundings at the compared values' scale."""
    scale = want.abs().max().item() if want.numel() else 1.0
    torch.testing.assert_close(got, want, atol=rounding_atol(dtype, sums, scale), rtol=0)


def model_sums(hidden: int, intermediate: int, layers: int, seq: int, vocab: int = 0) -> int:
    """Sums on the longest path through `layers` decoder layers, the final norm and an LM head of
    `vocab` rows (0: no LM head; its softmax adds `vocab` more when probabilities are compared)."""
    return layers * layer_accumulations(hidden, intermediate, seq) + hidden + (hidden + vocab if vocab else 0)


# The tiny random targets of tests/tiny_models.py (hidden 64, intermediate 128, 3 layers, vocabulary 128),
# over sequences under 32 tokens: ~1.9k sums, so fp32 parity holds to ~2.2e-4 of the logits' scale.
TINY_TARGET_SUMS = model_sums(hidden=64, intermediate=128, layers=3, seq=32, vocab=128)
