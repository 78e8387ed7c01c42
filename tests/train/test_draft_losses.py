"""The distillation losses of train/objectives/draft_losses.py against float64 references written out here
from their definitions, gradients included (autograd vs gradcheck's finite differences, and closed forms),
edge cases (p one-hot, p == q) and negative controls that must fail.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_draft_losses.py -q
"""

import math
import typing

import pytest
import torch
from tolerances import assert_float64_equal

from draftsmith.runtime.heads.eagle3_kind import Eagle3Section
from draftsmith.train.objectives import draft_losses as dl


def random_pair(n=5, v=7, seed=0):
    """p [n, v] (a float64 distribution per row, no zeros) and draft logits [n, v]."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    logits = 2 * torch.randn(n, v, generator=g, dtype=torch.float64)
    return p, logits


def reference(name: str, p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Each loss from its definition, row by row in Python floats' float64 (no xlogy, no stacking)."""
    q = torch.softmax(logits, -1)
    rows = []
    for pr, qr in zip(p.tolist(), q.tolist()):
        kl = sum(a * math.log(a / b) for a, b in zip(pr, qr) if a > 0)
        rkl = sum(b * math.log(b / max(a, torch.finfo(torch.float64).tiny)) for a, b in zip(pr, qr))
        m = [(a + b) / 2 for a, b in zip(pr, qr)]
        jsd = 0.5 * sum(a * math.log(a / c) for a, c in zip(pr, m) if a > 0)
        jsd += 0.5 * sum(b * math.log(b / c) for b, c in zip(qr, m) if b > 0)
        tv = 0.5 * sum(abs(a - b) for a, b in zip(pr, qr))  # = 1 - sum min(p, q) for distributions
        rows.append({"kl": kl, "rkl": rkl, "jsd": jsd, "tv": tv})
    if name == "lk_hybrid":  # lambda from the batch's mean acceptance, a constant for gradients
        kl = sum(r["kl"] for r in rows) / len(rows)
        tv = sum(r["tv"] for r in rows) / len(rows)
        lam = math.exp(-3 * (1 - tv))
        return torch.tensor(lam * kl + (1 - lam) * tv, dtype=torch.float64)
    return torch.tensor(sum(r[name] for r in rows) / len(rows), dtype=torch.float64)


def test_the_config_offers_exactly_these_losses():
    hints = typing.get_type_hints(Eagle3Section)
    assert typing.get_args(hints["loss"]) == dl.LOSSES


@pytest.mark.parametrize("name", dl.LOSSES)
def test_values_match_the_definitions_in_float64(name):
    for seed in range(3):
        p, logits = random_pair(seed=seed)
        assert_float64_equal(dl.divergence(name, p, logits), reference(name, p, logits))


@pytest.mark.parametrize("name", ["kl", "rkl", "jsd", "tv"])
def test_gradients_match_finite_differences(name):
    p, logits = random_pair(n=3, v=5, seed=4)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: dl.divergence(name, p, x), (logits,), eps=1e-6, atol=1e-7)


def test_lk_hybrid_gradient_treats_lambda_as_a_constant():
    """d/dz [lam KL + (1 - lam) TV] with lam detached = lam dKL/dz + (1 - lam) dTV/dz (arXiv:2602.23881's
    one detached blend weight per call); finite differences of the whole would also move lambda."""
    p, logits = random_pair(n=4, v=6, seed=5)
    z = logits.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(dl.divergence("lk_hybrid", p, z), z)
    with torch.no_grad():
        lam = math.exp(-3 * (1 - float(dl.divergence("tv", p, logits))))
    z1, z2 = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    (g_kl,) = torch.autograd.grad(dl.divergence("kl", p, z1), z1)
    (g_tv,) = torch.autograd.grad(dl.divergence("tv", p, z2), z2)
    assert_float64_equal(grad, lam * g_kl + (1 - lam) * g_tv)
    # the control: finite differences of the whole loss (lambda moving with z) disagree with autograd
    check = torch.autograd.gradcheck
    assert not check(
        lambda x: dl.divergence("lk_hybrid", p, x), (z,), eps=1e-6, atol=1e-7, raise_exception=False
    )


def test_closed_form_gradients():
    """d KL(p||q)/dz = q - p (the soft cross-entropy's gradient: H(p) has none); d TV/dz_j =
    -q_j (1[q_j < p_j] - sum_{v: q_v < p_v} q_v)."""
    p, logits = random_pair(n=4, v=6, seed=6)
    q = torch.softmax(logits, -1)
    for name, expected in {
        "kl": (q - p) / len(p),
        "tv": -q * ((q < p).double() - (q * (q < p)).sum(-1, keepdim=True)) / len(p),
    }.items():
        z = logits.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(dl.divergence(name, p, z), z)
        assert_float64_equal(grad, expected)


def test_kl_is_the_soft_cross_entropy_minus_the_targets_entropy():
    """What the objective computes for loss=kl (its soft cross-entropy) has KL's gradients."""
    p, logits = random_pair(seed=7)
    z1, z2 = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    ce = -(p * torch.log_softmax(z1, -1)).sum(-1).mean()
    entropy = -(p * p.log()).sum(-1).mean()
    kl = dl.divergence("kl", p, z2)
    assert_float64_equal(ce - entropy, kl)
    (g_ce,), (g_kl,) = torch.autograd.grad(ce, z1), torch.autograd.grad(kl, z2)
    assert_float64_equal(g_ce, g_kl)


@pytest.mark.parametrize("name", dl.LOSSES)
def test_p_equal_to_q_gives_zero(name):
    _, logits = random_pair(seed=8)
    p = torch.softmax(logits, -1)
    assert abs(float(dl.divergence(name, p, logits))) < 1e-14  # float64 rounding


def test_one_hot_targets():
    """p = e_i: KL = -log q_i, TV = 1 - q_i, JSD and rKL in closed form (rKL's log 0 clamped at tiny)."""
    _, logits = random_pair(n=4, v=6, seed=9)
    q = torch.softmax(logits, -1)
    hot = torch.tensor([0, 3, 5, 1])
    p = torch.nn.functional.one_hot(hot, 6).double()
    qi = q[torch.arange(4), hot]
    log_tiny = math.log(torch.finfo(torch.float64).tiny)
    m_i = (1 + qi) / 2
    rest = q * torch.log(q / (q / 2))  # q_v log(q_v / m_v) where p_v = 0
    rest = rest.sum(-1) - qi * math.log(2)
    expected = {
        "kl": -qi.log(),
        "tv": 1 - qi,
        "jsd": 0.5 * (-m_i.log()) + 0.5 * (qi * (qi / m_i).log() + rest),
        "rkl": (q * q.log()).sum(-1) - (1 - qi) * log_tiny,
    }
    for name, value in expected.items():
        assert_float64_equal(dl.per_position(name, p, logits)[:, 0], value)
    assert torch.isfinite(dl.divergence("rkl", p, logits))


def test_negative_controls():
    """Swapped arguments are another loss: KL(q || p) through `kl` is `rkl`, not `kl`; TV is not JSD."""
    p, logits = random_pair(seed=10)
    q = torch.softmax(logits, -1)
    swapped = dl.divergence("kl", q, p.log())  # KL(q || p)
    assert_float64_equal(swapped, dl.divergence("rkl", p, logits))
    with pytest.raises(AssertionError):
        assert_float64_equal(swapped, dl.divergence("kl", p, logits))
    with pytest.raises(AssertionError):
        assert_float64_equal(dl.divergence("tv", p, logits), dl.divergence("jsd", p, logits))
    with pytest.raises(ValueError, match="loss='ce'"):
        dl.divergence("ce", p, logits)


def test_bounds():
    p, logits = random_pair(n=50, v=9, seed=11)
    for name, upper in {"jsd": math.log(2), "tv": 1.0}.items():
        values = dl.per_position(name, p, logits)[:, 0]
        assert (values >= 0).all() and (values <= upper).all()


@pytest.mark.parametrize("name", dl.LOSSES)
def test_saturated_float32_rows_stay_finite(name):
    """q and p with entries that underflow to 0 in float32 (a head's logits 450 apart): finite loss and
    gradients. The control: JSD written with xlogy(q, m) has a 0 / 0 gradient there."""
    p = torch.softmax(torch.tensor([[0.0, 50.0, -200.0], [1.0, 2.0, 3.0]]), -1)
    z = torch.tensor([[0.0, -150.0, 300.0], [0.5, 0.0, -0.5]], requires_grad=True)
    loss = dl.divergence(name, p, z)
    (grad,) = torch.autograd.grad(loss, z)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    if name == "jsd":
        q = torch.softmax(z, -1)
        m = (p + q) / 2
        naive = 0.5 * (torch.xlogy(p, p) - torch.xlogy(p, m) + torch.xlogy(q, q) - torch.xlogy(q, m)).sum()
        (naive_grad,) = torch.autograd.grad(naive, z)
        assert not torch.isfinite(naive_grad).all()
