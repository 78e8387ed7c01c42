"""The P-EAGLE objective (train/objectives/peagle_objective.py): the K calls on a TTT cache give the loss,
counts and gradients of the paper's single forward with the block mask (float64), a wrong mask does not; each
depth is scored on the target's law of its own token; a short run through the one trainer reports per-position
accuracy and the block's simulated tau, and its final folder decodes losslessly as `peagle:DIR`; bad
`head:` values exit 2.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_peagle_objective.py -q
"""

import copy

import pytest
import torch
from peagle_heads import random_head, target_batch
from tiny_models import random_prompts
from tolerances import assert_float64_equal
from train_data import read_metrics, run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.peagle_drafter import peagle_drafter
from draftsmith.runtime.heads.peagle import load_head
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import Trainer
from draftsmith.train.objectives import peagle_objective
from draftsmith.train.objectives.eagle3_objective import TTTBatch
from draftsmith.train.objectives.peagle_objective import peagle_loss, peagle_loss_dense


def float64_batch(target):
    """Two right-padded rows of the tiny target's own greedy continuations, a prompt unsupervised."""
    prompts = random_prompts(2, seed=4)
    seqs = [p + r.token_ids for p, r in zip(prompts, generate_plain(target, prompts, SamplingParams(), 10))]
    seqs[1] = seqs[1][:-3]  # ragged
    b = target_batch(target, seqs)
    mask = b.loss_mask.clone()
    mask[:, :3] = 0
    return TTTBatch(b.input_ids, b.features.double(), b.target_hidden.double(), mask, b.valid)


def test_k_calls_equal_the_one_pass_loss_and_gradients(tiny_target):
    """ALGORITHM test in float64: loss, per-depth losses, counts and every gradient agree."""
    target64 = copy.deepcopy(tiny_target.model).double()
    embed, norm, lm_head = target64.model.embed_tokens, target64.model.norm, target64.lm_head

    def logits(h):
        return lm_head(norm(h))

    batch = float64_batch(tiny_target)
    heads = [random_head(tiny_target, block_size=4, num_layers=2).double() for _ in range(2)]
    fast = peagle_loss(heads[0], embed, batch, target_logits=logits, logit_chunk=7)
    dense = peagle_loss_dense(heads[1], embed, batch, target_logits=logits)
    assert_float64_equal(fast.step_losses, dense.step_losses)
    assert torch.equal(fast.counted, dense.counted) and torch.equal(fast.correct, dense.correct)
    assert (fast.counted > 0).all() and fast.counted[0] > fast.counted[-1]  # depth d loses d positions a row
    fast.loss.backward()
    dense.loss.backward()
    grads = {n: p.grad for n, p in heads[1].named_parameters()}
    for name, p in heads[0].named_parameters():
        assert p.grad is not None and grads[name] is not None, name
        assert_float64_equal(p.grad, grads[name])
    assert heads[0].mask_hidden.grad.abs().sum() > 0 and heads[0].mask_embed.grad.abs().sum() > 0
    assert all(p.grad is None for p in target64.parameters())  # the target is used, never trained


def test_wrong_mask_changes_the_loss(tiny_target, monkeypatch):
    """Control: the dense path with masks that do not see the block's earlier masks differs."""
    target64 = copy.deepcopy(tiny_target.model).double()
    embed = target64.model.embed_tokens

    def logits(h):
        return target64.lm_head(target64.model.norm(h))

    batch, head = float64_batch(tiny_target), random_head(tiny_target).double()
    right = peagle_loss(head, embed, batch, target_logits=logits)
    real = peagle_objective.block_mask

    def no_block(length, depths, device):
        depth = torch.arange(depths, device=device).repeat_interleave(length)
        return real(length, depths, device) & ~((depth[:, None] > depth[None]) & (depth[None] > 0))

    monkeypatch.setattr(peagle_objective, "block_mask", no_block)
    wrong = peagle_loss_dense(head, embed, batch, target_logits=logits)
    with pytest.raises(AssertionError):
        assert_float64_equal(wrong.step_losses[2:], right.step_losses[2:])


def test_depth_d_is_scored_on_the_targets_law_of_its_own_token(tiny_target):
    """A head whose depth-d logits ARE the target's logits at t+d+1 scores every counted position."""
    batch = float64_batch(tiny_target)
    batch = TTTBatch(batch.input_ids, batch.features.float(), batch.target_hidden.float(), batch.loss_mask)
    head = random_head(tiny_target, block_size=3)
    hidden = batch.target_hidden  # [B, T, H]

    class Oracle:  # stands in for the unroll: depth d at t outputs the target's state at t+d+1
        def __init__(self, real):
            self.real = real

        def __call__(self, head, embed, ids, feats, depths):
            for d in range(depths):
                out = torch.zeros_like(hidden)
                out[:, : hidden.shape[1] - d - 1] = hidden[:, d + 1 :]
                yield out

    head.norm.load_state_dict(tiny_target.decoder.norm.state_dict())
    with torch.no_grad():
        head.lm_head.weight.copy_(tiny_target.model.lm_head.weight)
    real = peagle_objective.unroll_block
    peagle_objective.unroll_block = Oracle(real)
    try:
        out = peagle_loss(head, tiny_target.embed, batch, target_logits=tiny_target.logits)
    finally:
        peagle_objective.unroll_block = real
    assert torch.equal(out.correct, out.counted) and (out.counted > 0).all()


# ---- through the trainer ------------------------------------------------------------------------------
def overrides(tiny_dir, source, data_dir, out, *extra):
    return run_overrides(
        tiny_dir, source, data_dir, out, "head.type=peagle", "head.block_size=3", "train.lr=0.003", *extra
    )


def test_short_run_reports_each_block_position_and_decodes_losslessly(
    tiny_dir, tiny_target, source, data_dir, tmp_path
):
    out = tmp_path / "run"
    steps = ["train.max_steps=12", "eval.every=6", "checkpoint.every=6", "train.step_decay=1.0"]
    Trainer(load_train_config(None, overrides(tiny_dir, source, data_dir, out, *steps))).fit()
    evals = read_metrics(out, "eval")
    assert [r["step"] for r in evals] == [6, 12]
    assert all(len(r["accuracy_per_step"]) == 3 for r in evals)  # one accuracy per block position
    acc = evals[-1]["accuracy_per_step"]
    tau = 1 + acc[0] + acc[0] * acc[1] + acc[0] * acc[1] * acc[2]
    assert evals[-1]["simulated_tau"] == pytest.approx(tau, abs=1e-3)
    assert evals[-1]["loss"] < evals[0]["loss"]
    head = load_head(out / "final", tiny_target)
    assert head.config.block_size == 3
    prompts = [tiny_target.encode("w1 w2 w3"), tiny_target.encode("w7 w8")]
    spec = generate_speculative(
        tiny_target, peagle_drafter(head, tiny_target, chain(3)), prompts, SamplingParams(), 12
    )
    plain = generate_plain(tiny_target, prompts, SamplingParams(), 12)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]  # zero mismatches


@pytest.mark.parametrize(
    "bad, field",
    [("head.block_size=1", "head.block_size"), ("head.ttt_schedule=3", "head.ttt_schedule")],
)
def test_bad_peagle_configs_exit_2_naming_the_field(tiny_dir, source, data_dir, tmp_path, capsys, bad, field):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("{}\n")
    argv = ["train", "--config", str(cfg_path), *overrides(tiny_dir, source, data_dir, tmp_path / "r", bad)]
    assert main(argv) == 2
    assert field in capsys.readouterr().err
