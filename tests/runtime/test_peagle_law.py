"""The output law of P-EAGLE drafting at T = 1 (top-k 3) equals the target's (reliability part A): the
first three tokens of 2000 seeded rows against the target's exact law (chi-square, vLLM MRV2's threshold,
tests/engine_checks.py) for a chain sampled from each block position's own distribution q_d (the law each
drafted token was drawn from, handed to the verifier), a static tree of per-position top-k (point
masses), i.i.d. sampled siblings and a dynamic tree, with a fitted head (drafts accept), a random one and
the fitted one flattened (logits x 0.7).
Negative controls that must fail (with a head whose q overlaps the target's p but differs): the drafter
reporting a wrong q for the tokens it sampled from the true one (uniform, or one block position off), and an
always-accept verifier.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_peagle_law.py -q
"""

import copy
from collections import Counter

import pytest
import torch
from acceptance_toys import ReportsWrongQ
from engine_checks import chi_square, exact_law
from peagle_heads import fitted_head, random_head
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.peagle_drafter import peagle_drafter
from draftsmith.runtime.verify import batch_accept
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

LAW_PARAMS = SamplingParams(temperature=1.0, top_k=3)
LAW_PROMPT = [11, 12, 13, 11, 12]
N = 2000
MODES = {  # (tree, children)
    "chain sampled from q": ("chain:3", "auto"),
    "per-position top-k tree (point masses)": ("static:binary-3", "auto"),
    "i.i.d. sampled siblings (SpecInfer)": ("static:binary-3", "sample"),
    "dynamic tree": ("dynamic:depth=3,topk=2,tokens=5", "auto"),
}


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def heads(target):
    fitted = fitted_head(target, random_prompts(4) + [LAW_PROMPT], steps=80)
    flat = copy.deepcopy(fitted)  # the fitted head with its logits scaled by 0.7: q overlaps p, differs
    with torch.no_grad():
        flat.lm_head.weight.mul_(0.7)
    return {"fitted": fitted, "random": random_head(target, seed=3), "flat": flat}


@pytest.fixture(scope="module")
def law(target):
    return exact_law(target, LAW_PROMPT, LAW_PARAMS, 3)


def first_tokens(target, drafter, n=N, seed=0) -> tuple[Counter, float]:
    results = generate_speculative(target, drafter, [LAW_PROMPT] * n, LAW_PARAMS, 3, seed=seed, batch_size=n)
    tau = sum(r.mean_accepted for r in results) / n
    return Counter(tuple(r.token_ids[:3]) for r in results), tau


@pytest.mark.parametrize("which", ["fitted", "random", "flat"])
@pytest.mark.parametrize("mode", list(MODES))
def test_sampling_law_is_the_targets(target, heads, law, which, mode):
    tree, children = MODES[mode]
    drafter = peagle_drafter(heads[which], target, parse_tree_spec(tree), children)
    counts, tau = first_tokens(target, drafter)
    stat, threshold = chi_square(counts, law, N)
    assert stat < threshold, f"{mode}, {which}: chi2 {stat:.1f} >= {threshold:.1f}"
    assert drafter.samples_children(drafter.tree) == (
        mode != "per-position top-k tree (point masses)" and mode != "dynamic tree"
    )
    if which != "random":  # drafts do get accepted: the law is checked on accepting paths too
        assert tau > 1.2, tau


def uniform_q(q):
    """Samples each token from its true q but reports a uniform law to the verifier."""
    q[:, 1:] = 1.0 / q.shape[-1]
    return q


def shifted_q(q):
    """Reports each drafted token's law one block position off (the last position's for the first): the
    slip a one-pass drafter could make between its K per-position distributions."""
    q[:, 1:] = q[:, 1:].roll(1, dims=1)
    return q


def reporting(wrong):
    return lambda head, target, tree: ReportsWrongQ(peagle_drafter(head, target, tree), wrong)


@pytest.mark.parametrize(
    "wrong", [reporting(uniform_q), reporting(shifted_q)], ids=["uniform q", "q one position off"]
)
def test_wrong_q_negative_control_fails(target, heads, law, wrong):
    """With the flattened head (q overlaps p but differs; its true q passes above) a wrong q is seen."""
    # 3N rows: chi2's excess over its null grows with N, and the shift's excess differs by machine (the
    # fitted head comes out of each CPU's BLAS): at N it was 26.6 on an Intel Xeon against the 32.3
    # threshold (the true q: 0.9), so 3N puts it near 78 there.
    counts, _ = first_tokens(target, wrong(heads["flat"], target, parse_tree_spec("chain:3")), n=3 * N)
    stat, threshold = chi_square(counts, law, 3 * N)
    assert stat > threshold, f"the law test did not notice a wrong q (chi2 {stat:.1f})"


def test_always_accept_negative_control_fails(target, heads, law, monkeypatch):
    real = batch_accept.uniforms

    def always_accept(*args):  # coins of -1: every drafted token passes its test, even where p = 0
        coins, draws = real(*args)
        return torch.full_like(coins, -1.0), draws

    monkeypatch.setattr(batch_accept, "uniforms", always_accept)
    drafter = peagle_drafter(heads["fitted"], target, parse_tree_spec("chain:3"))
    stat, threshold = chi_square(first_tokens(target, drafter)[0], law, N)
    assert stat > threshold, f"the law test did not notice always-accept (chi2 {stat:.1f})"
