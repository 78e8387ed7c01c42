"""The DSpark objective (train/objectives/dspark_objective.py) and the kind through the trainer: with the
Markov bias and the two extra terms off it is DFlash's loss exactly (and a Markov bias changes it: the
control); the TVD and confidence terms enter with their weights, the confidence target is the realized
acceptance sum min(p, q); gradients reach the backbone, the Markov head and the confidence head, never
the frozen LM head; the expected calibration error by hand; `draftsmith train` with the shipped recipe
(tiny overrides) trains, its evaluation rows carry the confidence head's calibration (ECE, predicted vs
realized acceptance per position, reliability bins and plot), and its final head decodes exactly as plain
decoding; a Markov rank above the draft vocabulary exits 2.

    python -m pytest tests/train/test_dspark_objective.py -q
"""

import json
from pathlib import Path

import pytest
import torch
from dspark_heads import random_head
from train_data import run_overrides, write_conversations

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.train.objectives.dflash_objective import dflash_loss
from draftsmith.train.objectives.dspark_objective import dspark_loss, expected_calibration_error
from draftsmith.train.objectives.eagle3_objective import TTTBatch

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "dspark-smollm2-135m.yaml"
BLOCK = 4


def batch(seed=0):
    """Two right-padded rows of random tokens, random features and last states."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, 100, (2, 12), generator=g)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 9:] = False
    loss_mask = (torch.rand(2, 12, generator=g) > 0.2).long()
    return TTTBatch(
        ids, torch.randn(2, 12, 3 * 64, generator=g), torch.randn(2, 12, 64, generator=g), loss_mask, valid
    )


def run(head, target, **weights):
    return dspark_loss(
        head, target.embed, batch(), target_logits=target.logits, max_anchors=5, gamma=2.0,
        generator=torch.Generator().manual_seed(3), **weights,
    )  # fmt: skip


def test_without_the_markov_bias_and_extra_terms_it_is_dflash(tiny_target):
    head = random_head(tiny_target, block=BLOCK)
    off = {"tvd_weight": 0.0, "confidence_weight": 0.0}
    with torch.no_grad():
        biased = run(head, tiny_target, **off).loss
        head.markov_head.markov_w2.weight.zero_()
        ours = run(head, tiny_target, **off).loss
        theirs = dflash_loss(
            head.backbone, tiny_target.embed, batch(), target_logits=tiny_target.logits, max_anchors=5,
            gamma=2.0, generator=torch.Generator().manual_seed(3),
        ).loss  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    assert abs(float(biased - ours)) > 1e-3  # the control: the Markov bias is in the loss


def test_the_extra_terms_enter_with_their_weights(tiny_target):
    head = random_head(tiny_target, block=BLOCK)
    with torch.no_grad():
        base = run(head, tiny_target, tvd_weight=0.0, confidence_weight=0.0)
        tvd = run(head, tiny_target, tvd_weight=2.0, confidence_weight=0.0)
        both = run(head, tiny_target, tvd_weight=2.0, confidence_weight=0.5)
    assert float(tvd.loss - base.loss) > 0 and float(both.loss - tvd.loss) > 0
    assert 0 < base.tvd < 1 and abs(base.realized - (1 - base.tvd)) < 1e-6  # realized = 1 - TVD, per slot
    assert 0 < base.predicted < 1 and 0 <= base.calibration_error <= 1


def test_gradients_reach_every_part_but_the_frozen_lm_head(tiny_target):
    head = random_head(tiny_target, block=BLOCK).train()
    run(head, tiny_target).loss.backward()
    assert head.backbone.lm_head.weight.grad is None
    names = [
        "backbone.fc.weight",
        "backbone.layers.0.self_attn.k_norm.weight",
        "markov_head.markov_w1.weight",
    ]
    names += ["markov_head.markov_w2.weight", "confidence_head.proj.weight", "confidence_head.proj.bias"]
    for name in names:
        assert head.get_parameter(name).grad.abs().sum() > 0, name


def test_expected_calibration_error_by_hand():
    predicted, realized = torch.tensor([0.05, 0.15, 0.95]), torch.tensor([0.0, 0.2, 1.0])
    assert expected_calibration_error(predicted, realized) == pytest.approx(0.05)
    # two slots in one bin: their means compared, so opposite errors cancel (ECE's definition)
    assert expected_calibration_error(
        torch.tensor([0.42, 0.48]), torch.tensor([0.40, 0.50])
    ) == pytest.approx(0.0, abs=1e-7)
    assert expected_calibration_error(realized, realized) == 0.0  # the control: calibrated -> 0


@pytest.fixture(scope="module")
def trained_run(tiny_dir, tmp_path_factory):
    """A 6-step run of the recipe on the tiny target (online), blocks of 4, rank 16."""
    tmp = tmp_path_factory.mktemp("dspark-run")
    source = write_conversations(tmp / "convs.jsonl")
    out = tmp / "run"
    extra = [
        "head.block_size=4",
        "head.max_anchors=8",
        "head.num_layers=1",
        "head.markov_rank=16",
        "train.lr=0.003",
    ]
    argv = ["train", "--config", str(RECIPE), *run_overrides(tiny_dir, source, tmp / "data", out), *extra]
    assert main(argv) == 0
    return out, source, tmp / "data"


def test_trains_with_the_recipe_and_decodes_losslessly(trained_run, tiny_target):
    out = trained_run[0]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 7))
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals[-1]["accuracy_per_step"]) == 3 and evals[-1]["simulated_tau"] >= 1.0
    final = out / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["head_type"] == "dspark" and config["markov_rank"] == 16 and config["block_size"] == 4
    prompts = [tiny_target.encode("w1 w2 w3"), tiny_target.encode("w7 w8")]
    plain = [r.token_ids for r in generate_plain(tiny_target, prompts, SamplingParams(), 12)]
    for tree in ("chain:3", "cartesian:2,1"):
        drafter = build_drafter(
            f"dspark:{final}", tiny_target, head_kinds.parse_tree(f"dspark:{final}", tree)
        )
        got = generate_speculative(tiny_target, drafter, prompts, SamplingParams(), 12)
        assert [r.token_ids for r in got] == plain, tree  # zero mismatches


def test_evaluation_rows_carry_the_confidence_heads_calibration(trained_run):
    out = trained_run[0]
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    last = evals[-1]
    assert 0 <= last["calibration_error"] <= 1 and last["calibration_slots"] > 0
    assert sum(b["count"] for b in last["reliability"]) == last["calibration_slots"]
    assert len(last["predicted_accept_per_position"]) == len(last["realized_accept_per_position"]) == 3
    seen = [b for b in last["reliability"] if b["count"]]  # the ECE is the count-weighted gap of the bins
    gap = sum(b["count"] * abs(b["predicted"] - b["observed"]) for b in seen) / last["calibration_slots"]
    assert last["calibration_error"] == pytest.approx(gap, abs=1e-3)
    assert (out / "reliability.png").stat().st_size > 0  # beside training_curve.png


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (["head.markov_rank=65"], "head.markov_rank"),  # the tiny runs' draft vocabulary is 64
        (["head.markov_rank=16", "head.markov_head_type=rnn"], "head.markov_head_type"),
        (["head.markov_rank=16", "head.confidence_weight=-1"], "head.confidence_weight"),
        (["head.num_heads=2"], "num_heads is an option of head.type=medusa"),
        (["head.markov_rank=16", "head.window=65"], "head.window"),  # the tiny runs' data.max_length is 64
    ],
)
def test_bad_head_keys_exit_2(trained_run, tiny_dir, tmp_path, capsys, bad, says):
    _, source, data = trained_run
    argv = ["train", "--config", str(RECIPE), *run_overrides(tiny_dir, source, data, tmp_path / "x"), *bad]
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "x" / "final").exists()
