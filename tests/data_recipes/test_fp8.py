"""fp8 (e4m3fn, per-token scales) round trips: the error bound of data_recipes/fp8.py, exactness on
representable values, a wrong-axis control that must break the bound, zero rows, non-finite refusal.

    python -m pytest tests/data_recipes/test_fp8.py -q

The bound, per element x of a row (group) with stored scale s = amax / 448:
    |x_hat - x| <= 2^-4 |x| + 2^-10 s + 2^-22 |x|
(3 mantissa bits: half an ulp is 2^-4 of a normal value; below e4m3's smallest normal 2^-6, half the
subnormal spacing 2^-9, times s; the last term covers float32's divide and multiply.)
"""

import pytest
import torch

from draftsmith.data_recipes import fp8

pytestmark = pytest.mark.skipif(not fp8.available(), reason="this torch has no float8_e4m3fn")


def bound(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The per-element bound [N, G*D] for x [N, G*D] quantized with scales [N, G]."""
    n, groups = scales.shape
    s = scales.repeat_interleave(x.shape[1] // groups, dim=1)  # [N, G*D]
    return (fp8.REL_BOUND + 2.0**-22) * x.abs() + fp8.SUBNORMAL_FLOOR * s


def activations(n=256, groups=3, width=64, seed=0) -> torch.Tensor:
    """Heavy-tailed rows whose magnitude varies by 1e6 across rows and by 1e3 across groups: values land
    in e4m3's normal and subnormal ranges (massive activations, as in a residual stream)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, groups, width, generator=gen, dtype=torch.float64)
    x = x * torch.exp(2.0 * torch.randn(n, groups, width, generator=gen, dtype=torch.float64))
    row = 10.0 ** torch.empty(n, 1, 1, dtype=torch.float64).uniform_(-3, 3, generator=gen)
    group = 10.0 ** torch.linspace(0, 3, groups, dtype=torch.float64).reshape(1, groups, 1)
    return (x * row * group).float().reshape(n, groups * width)


def scaled_amax(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.reshape(x.shape[0], groups, -1).abs().amax(-1) / fp8.E4M3_MAX  # [N, G]


def test_round_trip_is_within_the_e4m3_bound_and_the_bound_is_tight():
    x = activations()
    values, scales = fp8.quantize(x, groups=3)
    assert values.dtype == torch.float8_e4m3fn and values.shape == x.shape
    assert scales.dtype == torch.float32 and scales.shape == (x.shape[0], 3)
    torch.testing.assert_close(scales, scaled_amax(x, 3), rtol=2**-23, atol=0)
    x_hat = fp8.dequantize(values, scales)
    err = (x_hat - x).abs()
    assert (err <= bound(x, scales)).all()
    # tight: normal values reach (almost) half an ulp, so the bound is not a loose one
    s = scales.repeat_interleave(64, dim=1)
    normal = x.abs() >= 2.0**-6 * s
    assert (err[normal] / x.abs()[normal]).max() > 0.9 * fp8.REL_BOUND
    assert (~normal).any()  # the subnormal floor is exercised too


def test_the_bound_fails_with_the_scale_on_the_wrong_axis():
    """Negative control: one scale per column (the transposed quantization) or one per token over every
    aux layer leaves small rows or layers at the subnormal floor of a larger amax: the bound breaks."""
    x = activations()
    _, scales = fp8.quantize(x, groups=3)  # the per-token, per-layer scales the bound is stated for
    values_t, scales_t = fp8.quantize(x.T.contiguous())  # per column
    per_column = fp8.dequantize(values_t, scales_t).T
    assert ((per_column - x).abs() > bound(x, scales)).any()
    values_1, scales_1 = fp8.quantize(x, groups=1)  # one scale per token across the three layers
    shared = fp8.dequantize(values_1, scales_1)
    assert ((shared - x).abs() > bound(x, scales)).any()
    assert ((shared - x).abs() <= bound(x, scales_1)).all()  # ... though within its own (looser) bound


def test_values_representable_in_e4m3_round_trip_exactly():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = codes[torch.isfinite(codes)]  # 254 values: NaN is 0x7f and 0xff, there is no inf
    assert finite.numel() == 254 and finite.abs().max() == fp8.E4M3_MAX
    gen = torch.Generator().manual_seed(1)
    rows = torch.stack([finite[torch.randperm(254, generator=gen)] for _ in range(41)])  # [41, 254]
    powers = 2.0 ** torch.arange(-20, 21, dtype=torch.float32).reshape(41, 1)  # amax 448 * 2^k: s = 2^k
    x = rows * powers
    values, scales = fp8.quantize(x)
    assert torch.equal(scales, powers)
    assert torch.equal(fp8.dequantize(values, scales), x)
    # the control: values between e4m3's grid points (amax kept, so the scales stay 2^k) are not exact
    shifted = torch.where(x.abs() < fp8.E4M3_MAX * powers, x * (1 + 2.0**-5), x)
    values, scales = fp8.quantize(shifted)
    assert torch.equal(scales, powers)
    assert not torch.equal(fp8.dequantize(values, scales), shifted)


def test_zero_rows_come_back_as_zeros():
    x = torch.zeros(4, 6)
    x[1] = torch.tensor([1.0, -2.0, 0.0, 3.0, 0.5, -448.0])
    values, scales = fp8.quantize(x, groups=2)
    assert torch.equal(scales[0], torch.ones(2)) and torch.equal(scales[2:], torch.ones(2, 2))
    x_hat = fp8.dequantize(values, scales)
    assert torch.equal(x_hat[[0, 2, 3]], torch.zeros(3, 6))
    assert (x_hat - x).abs().max() <= bound(x, scales).max()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_refused(bad):
    x = torch.ones(3, 8)
    x[2, 5] = bad
    with pytest.raises(ValueError, match="1 non-finite value"):
        fp8.quantize(x)


def test_dequantize_to_a_half_dtype_rounds_once():
    x = activations(n=64, groups=1, width=128, seed=2)
    values, scales = fp8.quantize(x)
    want = fp8.dequantize(values, scales).to(torch.bfloat16)  # float32 product, rounded once
    got = fp8.dequantize(values, scales, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_shapes_the_groups_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="not \\[N, 3 \\* D\\]"):
        fp8.quantize(torch.ones(2, 8), groups=3)
