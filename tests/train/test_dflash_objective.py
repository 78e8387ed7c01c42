"""The DFlash objective (train/objectives/dflash_objective.py) and the kind through the trainer: the batched
loss over random anchors equals a reference written block by block as the drafter sees it (float64: context =
positions before the anchor, the block bidirectional, slot k scored on the target at a + k - 1, weights
exp(-(k-1)/gamma)); a wrong weighting or a causal block is caught; `draftsmith train` with the shipped
recipe (tiny overrides) trains, evaluates per block position with simulated tau, and its final head
decodes exactly as plain decoding; another kind's `head:` key exits 2.

    python -m pytest tests/train/test_dflash_objective.py -q
"""

import json
from pathlib import Path

import pytest
import torch
from dflash_heads import random_head
from tolerances import assert_float64_equal
from train_data import run_overrides, write_conversations

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.dflash import block_mask
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.train.objectives.dflash_objective import dflash_loss, select_anchors
from draftsmith.train.objectives.eagle3_objective import TTTBatch

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "dflash-smollm2-135m.yaml"
BLOCK, GAMMA = 4, 2.0


def batch(target, seed=0):
    """Two right-padded rows of random tokens, random features and last states (float64)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, 100, (2, 12), generator=g)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 9:] = False
    loss_mask = (torch.rand(2, 12, generator=g) > 0.2).long()
    features = torch.randn(2, 12, 3 * 64, generator=g, dtype=torch.float64)
    hidden = torch.randn(2, 12, 64, generator=g, dtype=torch.float64)
    return TTTBatch(ids, features, hidden, loss_mask, valid)


def reference_loss(head, target, data, anchors, anchor_valid, gamma, causal=False, weight=None):
    """Block by block, as the drafter runs one: the context is fuse(features[:a]), the block is
    [token a, masks] at positions a..a+S-1; slot k scored where token a+k is supervised and inside."""
    logits_of = lambda h: target.lm_head(target.final_norm(h))  # noqa: E731 float64 target logits
    total, count = 0.0, 0
    for b in range(anchors.shape[0]):
        for a, ok in zip(anchors[b].tolist(), anchor_valid[b].tolist(), strict=True):
            if not ok:
                continue
            k, v = head.context_kv(head.fuse(data.features[b : b + 1, :a]), torch.arange(a)[None])
            tokens = torch.full((1, BLOCK), head.config.mask_token_id)
            tokens[0, 0] = data.input_ids[b, a]
            mask = block_mask(torch.ones(1, a, dtype=torch.bool), BLOCK)
            if causal:
                mask[..., a:] &= torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril()
            h = head(target.embed(tokens), a + torch.arange(BLOCK)[None], k, v, mask)[0]
            for slot in range(1, BLOCK):
                p = a + slot
                if p >= 12 or not (data.valid[b, p] and data.loss_mask[b, p]):
                    continue
                goal = torch.softmax(logits_of(data.target_hidden[b, p - 1]).double(), -1)
                ce = -(goal * torch.log_softmax(head.draft_logits(h[slot]), -1)).sum()
                total = (
                    total
                    + (weight or (lambda s: torch.exp(torch.tensor(-(s - 1) / gamma, dtype=torch.float64))))(
                        slot
                    )
                    * ce
                )
                count += 1
    return total / max(count, 1)


@pytest.fixture
def head64(tiny_target):
    tiny_target.model.double()
    yield random_head(tiny_target, block=BLOCK).double()
    tiny_target.model.float()


def run_loss(head, target, data):
    g = torch.Generator().manual_seed(3)
    logits = lambda h: target.lm_head(target.final_norm(h))  # noqa: E731
    return dflash_loss(
        head, target.embed, data, target_logits=logits, max_anchors=5, gamma=GAMMA, generator=g
    )


def test_batched_loss_equals_the_block_by_block_reference(tiny_target, head64):
    data = batch(tiny_target)
    with torch.no_grad():
        out = run_loss(head64, tiny_target, data)
    supervised = (data.loss_mask > 0) & data.valid
    eligible = torch.zeros_like(supervised)
    eligible[:, :-1] = supervised[:, 1:]
    anchors, anchor_valid = select_anchors(eligible, 5, torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = reference_loss(head64, tiny_target, data, anchors, anchor_valid, GAMMA)
    assert_float64_equal(out.loss, want)
    assert out.correct.shape == out.counted.shape == (BLOCK - 1,) and int(out.counted.sum()) > 10
    assert 1.0 <= out.accepted_length <= BLOCK
    # negative controls: a causal block, or unweighted positions, give another loss
    with torch.no_grad():
        causal = reference_loss(head64, tiny_target, data, anchors, anchor_valid, GAMMA, causal=True)
        flat = reference_loss(head64, tiny_target, data, anchors, anchor_valid, GAMMA, weight=lambda s: 1.0)
    assert abs(float(causal - want)) > 1e-6 and abs(float(flat - want)) > 1e-6  # far above 1e-12


def test_gradients_reach_the_draft_layers_not_the_frozen_lm_head(tiny_target):
    head = random_head(tiny_target, block=BLOCK).train()
    data = batch(tiny_target)
    data.features, data.target_hidden = data.features.float(), data.target_hidden.float()
    out = dflash_loss(head, tiny_target.embed, data, target_logits=tiny_target.logits, max_anchors=5)
    out.loss.backward()
    assert head.lm_head.weight.grad is None and not head.lm_head.weight.requires_grad
    for name in ("fc.weight", "hidden_norm.weight", "layers.0.self_attn.k_norm.weight", "norm.weight"):
        assert head.get_parameter(name).grad.abs().sum() > 0, name


@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    """A 6-step run of the recipe on the tiny target (online), blocks of 4."""
    tmp = tmp_path_factory.mktemp("dflash-run")
    source = write_conversations(tmp / "convs.jsonl")
    out = tmp / "run"
    extra = ["head.block_size=4", "head.max_anchors=8", "head.num_layers=1", "train.lr=0.003"]
    argv = ["train", "--config", str(RECIPE), *run_overrides(tiny_dir, source, tmp / "data", out), *extra]
    assert main(argv) == 0
    return out, source, tmp / "data"


def test_trains_with_the_recipe_and_decodes_losslessly(run, tiny_target):
    out = run[0]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 7))
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals[-1]["accuracy_per_step"]) == 3 and evals[-1]["simulated_tau"] >= 1.0  # per position
    final = out / "final"
    config = json.loads((final / "config.json").read_text())
    assert (
        config["head_type"] == "dflash" and config["block_size"] == 4 and config["aux_layer_ids"] == [0, 1, 2]
    )
    assert head_kinds.of_folder(final).name == "dflash"
    prompts = [tiny_target.encode("w1 w2 w3"), tiny_target.encode("w7 w8")]
    plain = [r.token_ids for r in generate_plain(tiny_target, prompts, SamplingParams(), 12)]
    for tree in ("chain:3", "cartesian:2,1"):
        drafter = build_drafter(
            f"dflash:{final}", tiny_target, head_kinds.parse_tree(f"dflash:{final}", tree)
        )
        got = generate_speculative(tiny_target, drafter, prompts, SamplingParams(), 12)
        assert [r.token_ids for r in got] == plain, tree  # zero mismatches


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (["head.num_heads=2"], "num_heads is an option of head.type=medusa"),
        (["head.block_size=1"], "head.block_size"),
        (["head.loss_gamma=0"], "head.loss_gamma"),
    ],
)
def test_bad_head_keys_exit_2(run, tiny_dir, tmp_path, capsys, bad, says):
    _, source, data = run
    argv = ["train", "--config", str(RECIPE), *run_overrides(tiny_dir, source, data, tmp_path / "x"), *bad]
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "x" / "final").exists()
