"""The MTP objective against a position-by-position oracle on a right-padded batch: which token each
module reads, which target distribution it is scored against, which positions count; an off-by-one
oracle must disagree (the negative control), so the test can tell the shifts apart."""

import pytest
import torch
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import TINY_TARGET_SUMS, assert_rounding_close

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, module_mask
from draftsmith.train.objectives.mtp_objective import mtp_loss, next_token_loss, teacher_positions

# PARITY in fp32 (tests/tolerances.py): the batched loss and the per-position oracle round differently in
# the modules' forwards (at most 3 chained, each like a layer of the tiny target), the LM head, the softmax
# over 128 ids and the mean over positions (under 64 here)
LOSS_SUMS = TINY_TARGET_SUMS + 64


@pytest.fixture(scope="module")
def setup():
    target = Target(tiny_model("llama"), tiny_tokenizer(), "tiny")
    torch.manual_seed(0)
    head = MtpHead(MtpConfig.for_target(target, num_modules=3)).eval()
    g = torch.Generator().manual_seed(1)
    lengths = [11, 7]
    ids = torch.zeros(2, 11, dtype=torch.long)
    valid = torch.zeros(2, 11, dtype=torch.bool)
    mask = torch.zeros(2, 11, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(6, 100, (n,), generator=g)
        valid[b, :n] = True
        mask[b, 2:n] = torch.randint(0, 2, (n - 2,), generator=g) | (torch.arange(n - 2) > 3)
    h0 = torch.randn(2, 11, target.hidden_size, generator=g)
    return target, head, ids, valid, mask, h0, lengths


def oracle(target, head, ids, valid, mask, h0, lengths, labels, off=0):
    """Row by row, unpadded, position by position: module m at t reads token t+m+1 and is scored on
    token t+m+2 against the target's logits at t+m+1 (`off` shifts that: the negative control)."""
    losses = [[] for _ in range(head.config.num_modules)]
    hits = [0] * head.config.num_modules
    for b, n in enumerate(lengths):
        h = h0[b : b + 1, :n]
        teacher = target.lm_head(h0[b, :n]).float()  # [n, V]
        for m in range(head.config.num_modules):
            tokens = torch.zeros(1, n, dtype=torch.long)
            tokens[0, : max(n - m - 1, 0)] = ids[b, m + 1 : n]
            h = head(m, target.embed(tokens), h, torch.arange(n)[None], mask=module_mask(n, m))
            for t in range(n - m - 2):
                if not mask[b, t + m + 2]:
                    continue
                logits = head.logits(target, m, h[0, t])
                p = min(t + m + 1 + off, n - 1)
                if labels == "target":
                    ce = -(torch.softmax(teacher[p], -1) * torch.log_softmax(logits, -1)).sum()
                else:
                    ce = -torch.log_softmax(logits, -1)[ids[b, t + m + 2]]
                losses[m].append(ce)
                hits[m] += int(logits.argmax() == teacher[p].argmax())
    return [torch.stack(x).mean() for x in losses], hits, [len(x) for x in losses]


@torch.no_grad()
@pytest.mark.parametrize("labels", ["target", "data"])
def test_mtp_loss_matches_the_oracle(setup, labels):
    target, head, ids, valid, mask, h0, lengths = setup
    sel = teacher_positions(mask, valid)
    out = mtp_loss(head, target, ids, h0, target.lm_head(h0[sel]), mask, valid, labels, decay=0.8)
    losses, hits, counts = oracle(target, head, ids, valid, mask, h0, lengths, labels)
    assert_rounding_close(out.step_losses, torch.stack(losses), LOSS_SUMS)
    assert out.correct.tolist() == hits and out.counted.tolist() == counts
    weights = 0.8 ** torch.arange(3.0)
    assert_rounding_close(out.loss, (weights * torch.stack(losses)).sum(), LOSS_SUMS + 3)


@torch.no_grad()
def test_an_off_by_one_oracle_disagrees(setup):
    target, head, ids, valid, mask, h0, lengths = setup
    sel = teacher_positions(mask, valid)
    out = mtp_loss(head, target, ids, h0, target.lm_head(h0[sel]), mask, valid, "target")
    shifted, _, _ = oracle(target, head, ids, valid, mask, h0, lengths, "target", off=1)
    assert not torch.allclose(out.step_losses, torch.stack(shifted), atol=1e-3)


@torch.no_grad()
def test_next_token_loss_matches_the_oracle(setup):
    target, _, ids, valid, mask, h0, lengths = setup
    sel = teacher_positions(mask, valid)
    got = next_token_loss(target.lm_head(h0[sel]), ids, sel)
    ces = [
        torch.nn.functional.cross_entropy(target.lm_head(h0[b, t]).float()[None], ids[b, t + 1][None])
        for b, n in enumerate(lengths)
        for t in range(n - 1)
        if mask[b, t + 1]
    ]
    assert_rounding_close(got, torch.stack(ces).mean(), LOSS_SUMS)
