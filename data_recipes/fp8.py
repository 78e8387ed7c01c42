"""fp8 (float8_e4m3fn) storage of hidden states with per-token scales: the math, torch only.

    values, scales = quantize(x, groups=A)       # x [N, A*H] float -> e4m3fn [N, A*H], float32 [N, A]
    x_hat = dequantize(values, scales, torch.bfloat16)

As speculators stores captures (src/speculators/data_generation/fp8_utils.py, `per_token_scaled`): per
token row (and here per group of columns, one group per aux layer) scale = amax / 448, values =
x / scale cast to e4m3fn, x_hat = values * scale. One scale per aux layer rather than one per token over
all layers, because the residual stream's magnitude grows with depth: a scale shared with a late layer
would push an early layer's values toward e4m3's subnormal floor. The cost is 4 bytes per layer per token.

Error bound (tested in tests/data_recipes/test_fp8.py). e4m3fn has 3 mantissa bits, normals down to
2^-6 and subnormals spaced 2^-9; the cast rounds to nearest. With s the row's (group's) stored scale:
  |y| >= 2^-6 (normal):    |x_hat - x| <= 2^-4 |x|          (half an ulp of a 3-bit mantissa)
  |y| <  2^-6 (subnormal): |x_hat - x| <= 2^-10 s           (half the subnormal spacing)
where y = x / s in [-448, 448]. So for every element |x_hat - x| <= 2^-4 |x| + 2^-10 * amax / 448, plus
float32 rounding of the divide and the multiply (2^-23 |x| more at most), before any cast to a 16-bit
training dtype. A row whose amax is a power of two times 448 and whose values are e4m3 values times that
power of two round-trips exactly. A row of zeros stores scale 1 and comes back zeros. Non-finite inputs
are refused: a NaN or inf amax would poison the whole row.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
REL_BOUND = 2.0**-4  # half an ulp relative to a normal value (3 mantissa bits)
SUBNORMAL_FLOOR = 2.0**-10  # half the subnormal spacing 2^-9, in units of the scale
FP8_NAME = "float8_e4m3fn"
SCALE_BYTES = 4  # float32 scales


def available() -> bool:
    """Whether this torch has the float8_e4m3fn dtype (torch >= 2.1)."""
    return hasattr(torch, FP8_NAME)


def fp8_dtype() -> torch.dtype:
    return getattr(torch, FP8_NAME)


def quantize(x: torch.Tensor, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, G*D] float -> (values e4m3fn [N, G*D], scales float32 [N, G]); group g = columns g*D:(g+1)*D.

    Raises ValueError on non-finite input or a width that `groups` does not divide."""
    if x.dim() != 2 or x.shape[1] % groups:
        raise ValueError(f"quantize: shape {tuple(x.shape)} is not [N, {groups} * D]")
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"quantize: {bad} non-finite value(s) cannot be stored in fp8")
    n = x.shape[0]
    grouped = x.float().reshape(n, groups, -1)  # [N, G, D]
    amax = grouped.abs().amax(dim=-1, keepdim=True)  # [N, G, 1]
    # amax 0: any scale maps zeros to zeros; 1 keeps x / s finite. Tiny amax: keep s a normal float32.
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).clamp(
        min=torch.finfo(torch.float32).tiny
    )
    # x / s can exceed 448 by a float32 rounding; clamp before the cast (e4m3fn has no inf).
    y = (grouped / scale).clamp(-E4M3_MAX, E4M3_MAX)  # [N, G, D]
    return y.to(fp8_dtype()).reshape(x.shape), scale.reshape(n, groups)


def dequantize(
    values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(values e4m3fn [N, G*D], scales [N, G]) -> x_hat [N, G*D] in `dtype`, computed in float32 and
    rounded once to `dtype`."""
    n, groups = scales.shape
    out = values.float().reshape(n, groups, -1) * scales.float().unsqueeze(-1)  # [N, G, D]
    return out.reshape(values.shape).to(dtype)
