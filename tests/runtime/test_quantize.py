"""Weight-only quantization (runtime/core/quantize.py): reconstruction bounds, the kernels against the
dequantized weights, speculation against the SAME quantized target (greedy identity, sampled law), the
drafter's own weights only, and bad input.

Bounds. Every weight is within half a scale step of its dequantized value (the bf16 grid is chosen to
cover the row or group). The kernels take bf16 activations and return bf16; against a float64 matmul of
the same bf16 activations and the float64 dequantized weights a kernel may differ by (Higham, see
tests/tolerances.py) the output's one rounding to bf16 (eps_bf16 / 2 |y|) and K fp32 accumulations
(K eps_fp32 sum|x w|): the kernels multiply exact dequantized weights in fp32 (a bf16 rounding of each
weight would exceed the bound by ~5x; measured 0.95 of it at most). A 2% scale error or a zero point
one step off (the negative controls) misses it.
"""

from collections import Counter

import pytest
import torch
from engine_checks import assert_identical, chi_square, exact_law, make_prompts
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import rounding_atol

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.quantize import (
    Int4Linear,
    Int8Linear,
    QuantSpec,
    check_device,
    draft_quantization,
    parse_quantize,
    quantize_draft,
    quantize_target,
)
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain, parse_tree_spec

GREEDY = SamplingParams()
PROMPTS = make_prompts(7)


def random_linear(n: int, k: int, seed: int = 0, bias: bool = False) -> torch.nn.Linear:
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        lin.weight[0, :7] = 0.0  # a row (and groups) with exact zeros
        lin.weight[1] = 3.0 + 1e-3 * torch.randn(k)  # a far-from-zero narrow row: the zero's rounding matters
    return lin


def kernel_atol(x: torch.Tensor, deq: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per element: the output's one rounding to bf16 (eps / 2 of |y|) + K fp32 sums (module docstring)."""
    mass = x.abs().double() @ deq.abs().T  # [M, N] sum_k |x_k w_k|
    k = x.shape[-1]
    return rounding_atol(torch.bfloat16, 1, 0) / 2 * y.abs() + rounding_atol(torch.float32, k, 0) * mass


def quantized(kind: str, lin: torch.nn.Linear, group: int = 32):
    return Int8Linear(lin) if kind == "int8" else Int4Linear(lin, group)


def step_scale(q) -> torch.Tensor:  # [N, K] float64: the scale each weight was quantized with
    if isinstance(q, Int8Linear):
        return q.scale.double()[:, None].expand(q.out_features, q.in_features)
    scale = q.scale_zero[..., 0].double().T  # [N, G]
    return scale.repeat_interleave(q.group, dim=1)


@pytest.mark.parametrize(("kind", "group"), [("int8", None), ("int4", 32), ("int4", 64), ("int4", 128)])
def test_dequantized_weights_within_half_a_step(kind, group):
    lin = random_linear(48, 256)
    q = quantized(kind, lin, group)
    err = (lin.weight.double() - q.dequantized()).abs()
    bound = step_scale(q) / 2
    assert (err <= bound * (1 + 1e-9)).all(), f"max excess {(err - bound).max().item():.3g}"
    assert (q.dequantized()[0, :7] == 0).all() or kind == "int4"  # int8 is symmetric: zeros are exact
    # the bound is tight enough to mean something: the error reaches at least a quarter step somewhere
    assert (err > bound / 2).any()


@pytest.mark.parametrize(("kind", "group"), [("int8", None), ("int4", 32), ("int4", 64)])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_kernel_matches_the_dequantized_matmul(kind, group, rows):
    lin = random_linear(64, 192, seed=1, bias=True)
    q = quantized(kind, lin, group)
    x = torch.randn(2, rows, 192)
    got = q(x).double()  # [2, rows, 64]
    xb = x.to(torch.bfloat16).double().reshape(-1, 192)
    product = xb @ q.dequantized().T  # [2 rows, 64]: what the kernel rounds to bf16 before the bias
    want = (product + lin.bias.double()).reshape(got.shape)
    atol = kernel_atol(xb, q.dequantized(), product).reshape(got.shape)
    assert ((got - want).abs() <= atol).all(), f"max excess {((got - want).abs() - atol).max().item():.3g}"


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_kernel_rows_do_not_depend_on_how_many_rows(kind):
    """A token's output is the same alone and among 7 others (what makes verification match plain steps)."""
    q = quantized(kind, random_linear(64, 192, seed=2))
    x = torch.randn(8, 192)
    alone = torch.cat([q(x[i : i + 1]) for i in range(8)])
    assert torch.equal(alone, q(x))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_negative_control_wrong_zero_or_scale_fails_the_bound(kind):
    lin = random_linear(64, 192, seed=3)
    q = quantized(kind, lin)
    x = torch.randn(4, 192)
    xb = x.to(torch.bfloat16).double()
    with torch.no_grad():
        if kind == "int8":
            q.scale.mul_(1.02)  # a 2% scale error
        else:
            q.scale_zero[..., 1] += q.scale_zero[..., 0]  # the zero one step off
    honest = quantized(kind, lin)
    want = xb @ honest.dequantized().T
    atol = kernel_atol(xb, honest.dequantized(), want)
    assert ((q(x).double() - want).abs() > atol).any()


# ---- the quantized target: speculation is lossless against it ---------------------------------------------
@pytest.fixture(scope="module", params=["int8", "int4"])
def qtarget(request):
    target = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    fp32_hash = target.weights_hash()
    used = quantize_target(target, parse_quantize(request.param))
    assert target.weights_hash() == fp32_hash  # heads bind to the checkpoint they were trained with
    assert target.quantization == used.label
    return target


@pytest.fixture(scope="module")
def qplain(qtarget):
    return generate_plain(qtarget, PROMPTS, GREEDY, max_new_tokens=24)


def test_quantized_target_runs_its_kernels(qtarget):
    from draftsmith.runtime.core.quantize import QuantLinear

    layer = qtarget.decoder.layers[0]
    assert isinstance(layer.self_attn.q_proj, QuantLinear) and isinstance(layer.mlp.down_proj, QuantLinear)
    assert isinstance(qtarget.model.lm_head, QuantLinear)
    assert qtarget.model.lm_head.weight.shape == (128, 64)  # readable for heads that copy its rows
    fp32 = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    ids = torch.tensor([PROMPTS[0]])
    a = qtarget.logits(qtarget.forward(ids, qtarget.new_cache(1, 64)).hidden)
    b = fp32.logits(fp32.forward(ids, fp32.new_cache(1, 64)).hidden)
    assert not torch.equal(a, b)  # it is another function ...
    if qtarget.quantization == "int8":  # ... close to the original (int4 moves a random tiny model more)
        assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.5


@pytest.mark.parametrize("batch_size", [1, 7])
@pytest.mark.parametrize(
    ("name", "tree"),
    [
        ("ngram", "chain:3"),
        ("self:2", "chain:4"),
        ("self:2", "static:binary-3"),
        ("model", "chain:2"),
        ("oracle", "chain:5"),
        ("oracle", "dynamic:depth=3,topk=2,tokens=6"),
    ],
)
def test_greedy_identity_against_the_same_quantized_target(qtarget, qplain, name, tree, batch_size):
    spec = parse_tree_spec(tree)
    if name == "ngram":
        drafter = NgramDrafter(spec)
    elif name == "model":  # a quantized draft LM of its own
        drafter = lm_drafter(Target(tiny_model("llama", seed=1), tiny_tokenizer(), "draft"), spec)
        quantize_draft(drafter, qtarget, QuantSpec("int8"))
    elif name == "oracle":
        drafter = lm_drafter(qtarget, spec)
    else:
        drafter = lm_drafter(qtarget, spec, num_layers=2)
    results = generate_speculative(qtarget, drafter, PROMPTS, GREEDY, 24, batch_size=batch_size)
    assert_identical(results, qplain)
    if name == "oracle" and tree.startswith("chain"):  # the long-acceptance paths ran
        assert all(r.accepted_lengths[:-1] == r.draft_depths[:-1] for r in results)


LAW_PARAMS = SamplingParams(temperature=1.0, top_k=3)
LAW_PROMPT = [11, 12, 13, 11, 12]


@pytest.mark.slow
def test_sampled_law_of_the_quantized_target(qtarget):
    """The first three tokens' law under speculation with a quantized MTP head equals the quantized target's
    exact law (chi-square, tests/engine_checks.py); for int4 the fp32 target's law must fail the same test
    (the control: the check sees which target the tokens follow)."""
    law = exact_law(qtarget, LAW_PROMPT, LAW_PARAMS, 3)
    torch.manual_seed(2)
    head = MtpHead(MtpConfig.for_target(qtarget, num_modules=2)).eval()
    drafter = mtp_drafter(head, qtarget, chain(2))
    quantize_draft(drafter, qtarget, QuantSpec("int4"))
    n = 3000
    results = generate_speculative(qtarget, drafter, [LAW_PROMPT] * n, LAW_PARAMS, 3, seed=0, batch_size=n)
    counts = Counter(tuple(r.token_ids[:3]) for r in results)
    stat, threshold = chi_square(counts, law, n)
    assert stat < threshold, f"chi2 {stat:.1f} >= {threshold:.1f}"
    if qtarget.quantization.startswith("int4"):  # control: the unquantized target's law is another one
        fp32 = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
        stat, threshold = chi_square(counts, exact_law(fp32, LAW_PROMPT, LAW_PARAMS, 3), n)
        assert stat > threshold, f"the law test cannot tell the int4 target from fp32 (chi2 {stat:.1f})"


# ---- the drafter's own weights only ----------------------------------------------------------------------
def test_quantize_draft_leaves_the_target_alone():
    target = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    before = {n: p.clone() for n, p in target.model.named_parameters()}
    head = MtpHead(MtpConfig.for_target(target, num_modules=1)).eval()
    drafter = mtp_drafter(head, target, chain(1))
    assert draft_quantization(drafter, target) is None  # fp32 linears: nothing to report
    used = quantize_draft(drafter, target, parse_quantize("int4"))
    assert used.group_size == 64  # 128 does not divide the tiny model's 64 inputs: the largest that does
    assert draft_quantization(drafter, target) == used.label == "int4-g64"  # read off the swapped linears
    assert any(isinstance(m, Int4Linear) for m in head.modules())
    assert all(type(m) is torch.nn.Linear for m in target.model.modules() if isinstance(m, torch.nn.Linear))
    assert all(torch.equal(before[n], p) for n, p in target.model.named_parameters())
    results = generate_speculative(target, drafter, PROMPTS[:3], GREEDY, 12)
    assert_identical(results, generate_plain(target, PROMPTS[:3], GREEDY, max_new_tokens=12))


# ---- bad input ---------------------------------------------------------------------------------------------
def test_bad_inputs():
    target = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    with pytest.raises(BadInputError, match="--quantize"):
        parse_quantize("int3")
    with pytest.raises(BadInputError, match="--group-size"):
        parse_quantize("int4", 48)  # not a group the kernel takes
    with pytest.raises(BadInputError, match="--group-size"):
        parse_quantize("int8", 64)  # int8 scales per row
    with pytest.raises(BadInputError, match=r"--group-size.*in_features=64"):
        quantize_target(target, parse_quantize("int4", 256))  # 256 does not divide 64
    with pytest.raises(BadInputError, match="cpu"):  # names the devices that have the kernel
        check_device(QuantSpec("int8"), torch.device("meta"))
    with pytest.raises(BadInputError, match="compute capability >= 8.9"):
        quantize_target(target, parse_quantize("fp8"))  # no float8 matmul on the CPU
    with pytest.raises(BadInputError, match="self:layers=N runs the target's own layers"):
        quantize_draft(lm_drafter(target, chain(2), num_layers=2), target, QuantSpec("int8"))
    with pytest.raises(BadInputError, match="ngram has none"):
        quantize_draft(NgramDrafter(chain(2)), target, QuantSpec("int8"))
    assert all(type(m) is torch.nn.Linear for m in target.model.modules() if isinstance(m, torch.nn.Linear))


def test_fp8_weights_within_e4m3_rounding():
    """fp8 runs on CUDA only (refused above on the CPU); its weight grid is checked here: e4m3 keeps 3
    mantissa bits, so a normal value rounds within 2^-4 of itself and a subnormal one within half the
    smallest step, 2^-10, in units of the row's scale."""
    from draftsmith.runtime.core.quantize import Fp8Linear

    lin = random_linear(48, 256)
    q = Fp8Linear(lin)
    w, scale = lin.weight.double(), q.scale.double()[:, None]
    bound = 2.0**-4 * w.abs() + 2.0**-10 * scale
    assert ((w - q.dequantized()).abs() <= bound * (1 + 1e-9)).all()
    assert (w.abs().amax(1) / q.scale.double() - 448).abs().max() < 1e-3  # the row's max maps to e4m3's max


def test_near_tie_rule_judges_a_quantized_target_in_bf16_ulps(qtarget):
    """Its logits come out of a bf16 LM head: ties are bf16's (runtime/verify/near_tie.py)."""
    from draftsmith.runtime.verify.near_tie import first_mismatch, next_logits, tie_tolerance

    prompt = PROMPTS[0]
    logits = next_logits(qtarget, prompt)
    assert torch.equal(logits, logits.to(torch.bfloat16).float())  # bf16 values
    want, got = logits.topk(2).indices.tolist()
    mismatch = first_mismatch(qtarget, prompt, [got], [want])
    magnitude = max(abs(logits[want].item()), abs(logits[got].item()))
    assert (
        mismatch.tolerance
        == tie_tolerance(magnitude, torch.bfloat16)
        > tie_tolerance(magnitude, torch.float32)
    )
