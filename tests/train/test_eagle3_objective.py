"""EAGLE-3 training-time test: the unrolled training forward computes exactly what the drafter computes
at inference (step k at position t = the depth-k node of a chain drafted from root t, fed the true
tokens), the loss counts only supervised positions whose target argmax is a draft token, gradients reach
the head only, and a few optimizer steps lower the loss on a fixed batch."""

import copy

import pytest
import torch
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import assert_float64_equal

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.train.objectives.eagle3_objective import TTTBatch, draft_targets, ttt_loss, unroll

STEPS = 4


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


def make_head(target, seed=0, draft_vocab=None, **options):
    torch.manual_seed(seed)
    config = Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=draft_vocab, **options)
    head = Eagle3Head(config)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.1)
    return head


def make_batch(target, length=12, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, 100, (batch, length), generator=g)
    out = target.forward(ids, target.new_cache(batch, length), capture_layers=(0, 1, 2))
    features = torch.cat([out.aux[i] for i in (0, 1, 2)], dim=-1)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, :3] = 0  # a prompt
    return TTTBatch(ids, features.clone(), out.hidden.clone(), mask)


@torch.no_grad()
@pytest.mark.parametrize("options", [{}, {"num_layers": 2, "norm_output": True}], ids=["1 layer", "2 layers"])
def test_unrolled_steps_equal_the_drafters_chain(target, options):
    """Training-time test sees what drafting sees: each step's output equals a cached chain of head
    steps whose features are the parent's output (normed with norm_output)."""
    # An ALGORITHM test (tests/tolerances.py): both paths in float64, where rounding (~1e-13) cannot hide
    # or fake a difference. In fp32 they differ by ~1e-5 relative, by a CPU's GEMM kernel (AVX2 vs AVX-512).
    head = make_head(target, **options).eval().double()
    batch = make_batch(target, batch=1)
    ids, feats = batch.input_ids, batch.features.double()

    def embed(tokens):
        return target.embed(tokens).double()

    hs = list(unroll(head, embed, ids, feats, STEPS))
    length = ids.shape[1]
    for t in range(length - STEPS - 1):
        cache = head.new_cache(1, 64)
        # Committed pairs 0..t: (token j+1, fc(F_j)); the last output is the root's (step 0 at t).
        h = head(embed(ids[:, 1 : t + 2]), head.fc(feats[:, : t + 1]), torch.arange(t + 1)[None], cache)
        assert_float64_equal(hs[0][0, t], h[0, -1])
        out = h[:, -1:]
        for k in range(1, STEPS):  # depth-k node: true token t+k+1, parent's output, position t+k
            token = embed(ids[:, t + k + 1 : t + k + 2])
            feature = head.next_feature(out)
            if k == 1:  # the control: one position off (a rotary slip) moves the output by ~2e-4 at a
                # scale of 60, which an fp32 tolerance of 1e-5 relative would pass; float64's (~1e-10) cannot
                shifted = head(token, feature, torch.tensor([[t + k + 1]]), copy.deepcopy(cache))
                with pytest.raises(AssertionError):
                    assert_float64_equal(hs[k][0, t], shifted[0, -1])
            out = head(token, feature, torch.tensor([[t + k]]), cache)  # prefix + chain
            assert_float64_equal(hs[k][0, t], out[0, -1])


def test_loss_counts_supervised_in_vocab_positions_and_trains_the_head_only(target):
    head = make_head(target, draft_vocab=64)
    head.set_draft_vocab(torch.arange(0, 128, 2))
    batch = make_batch(target)
    out = ttt_loss(head, target.embed, batch, steps=STEPS, target_logits=target.logits)
    _, in_vocab = draft_targets(head, target.logits(batch.target_hidden))
    for k in range(STEPS):
        expected = (batch.loss_mask[:, k + 2 :] > 0) & in_vocab[:, k + 1 : -1]
        assert int(out.counted[k]) == int(expected.sum())
    out.loss.backward()
    assert head.fc.weight.grad is not None and head.lm_head.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in target.model.parameters())


def test_a_few_steps_lower_the_loss(target):
    head = make_head(target, seed=1)
    batch = make_batch(target, length=16)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        out = ttt_loss(head, target.embed, batch, steps=STEPS, target_logits=target.logits)
        first = first if first is not None else out.loss.item()
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert out.loss.item() < 0.85 * first  # soft CE has the target's entropy as its floor
    assert out.simulated_tau >= 1.0
