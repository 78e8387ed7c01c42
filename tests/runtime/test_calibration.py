"""Calibration of survival estimates (runtime/verify/calibration.py, runtime/bench/calibration_report.py): the
expected calibration error on hand-computed examples, a negative control (shuffled outcomes), the tally of
a cycle's conditional events (unreached nodes excluded) on chains, a cut chain and a tree, the objective
scoring with the same function, and `bench` rows, report and plot for a tiny DSpark head (the survival
sources of adaptive:K and their bad inputs: tests/runtime/test_adaptive_survival.py).

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_calibration.py -q
"""

import json
from dataclasses import replace

import pytest
import torch
from dspark_heads import random_head

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.verify.calibration import SurvivalTally, expected_calibration_error
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch
from draftsmith.runtime.verify.tree import Tree, chain


def test_a_calibrated_predictor_scores_zero():
    predicted = torch.tensor([0.25] * 4 + [0.75] * 4)
    outcome = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])  # a quarter, then three quarters, accepted
    assert expected_calibration_error(predicted, outcome) == pytest.approx(0.0, abs=1e-12)


def test_a_known_miscalibration_scores_its_gap():
    # bin [0.9, 1): 4 slots predicting 0.9, half accepted (gap 0.4); bin [0.3, 0.4): 2 predicting 0.3, none
    predicted = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.3, 0.3])
    outcome = torch.tensor([1.0, 0, 1, 0, 0, 0])
    assert expected_calibration_error(predicted, outcome) == pytest.approx((4 * 0.4 + 2 * 0.3) / 6)
    # a prediction of exactly 1 falls in the last bin; probabilities as outcomes (training's 1 - TVD) work too
    assert expected_calibration_error(torch.tensor([1.0, 0.9]), torch.tensor([0.5, 0.6])) == pytest.approx(
        0.4
    )


def test_shuffled_outcomes_of_a_calibrated_predictor_score_large():
    gen = torch.Generator().manual_seed(0)
    predicted = torch.rand(20000, generator=gen)
    outcome = (torch.rand(20000, generator=gen) < predicted).float()  # calibrated by construction
    assert expected_calibration_error(predicted, outcome) < 0.02
    shuffled = outcome[torch.randperm(20000, generator=gen)]  # the control: the same outcomes, unpaired
    assert expected_calibration_error(predicted, shuffled) > 0.2  # ~ E|p - 1/2| = 0.25


def test_the_objective_scores_with_the_same_function():
    from draftsmith.train.objectives import dspark_objective

    assert dspark_objective.expected_calibration_error is expected_calibration_error


def chains(survival: list[list[float]]) -> DraftBatch:
    batch = DraftBatch.from_drafts([Draft(chain(3), [5, 6, 7, 8]) for _ in survival], "cpu")
    return replace(batch, survival=torch.tensor(survival))


def test_the_tally_counts_reached_nodes_only():
    tally = SurvivalTally()
    # row 0 accepts nodes 1, 2 and rejects 3; row 1 rejects node 1, so its nodes 2 and 3 are never reached
    tally.add(chains([[1, 0.8, 0.5, 0.2], [1, 0.6, 0.4, 0.9]]), [[1, 2], []])
    got = tally.sums.summary()
    assert got["calibration_slots"] == 4 and got["calibration_slots_per_position"] == [2, 1, 1]
    assert got["calibration_error"] == pytest.approx((0.2 + 0.6 + 0.5 + 0.2) / 4)
    assert got["predicted_accept_per_position"] == [0.7, 0.5, 0.2]
    assert got["observed_accept_per_position"] == [0.5, 1.0, 0.0]
    # E[accepted] = s1 + s1 s2 + s1 s2 s3 per row: (0.8 + 0.4 + 0.08 + 0.6 + 0.24 + 0.216) / 2
    assert got["predicted_mean_accepted_length"] == pytest.approx(1.168, abs=1e-4)
    assert got["observed_mean_accepted_length"] == 1.0
    bins = {b["bin"][0]: b["count"] for b in got["reliability"] if b["count"]}
    assert bins == {0.8: 1, 0.6: 1, 0.5: 1, 0.2: 1}


def test_the_tally_skips_nodes_the_adaptive_rule_cut_and_reads_trees():
    tally = SurvivalTally()
    cut = chains([[1, 0.8, 0.5, 0.2], [1, 0.6, 0.4, 0.9]]).prefixes([2, 1])  # verified: 2 and 1 nodes
    tally.add(cut, [[1, 2], []])
    got = tally.sums.summary()
    assert got["calibration_slots_per_position"] == [2, 1]  # node 3 of row 0 was cut: not verified
    assert got["predicted_mean_accepted_length"] == pytest.approx((0.8 + 0.4 + 0.6) / 2)
    tree = DraftBatch.from_drafts([Draft(Tree((-1, 0, 0, 1)), [5, 6, 7, 8])], "cpu")  # siblings 1, 2
    tally = SurvivalTally()
    tally.add(replace(tree, survival=torch.tensor([[1, 0.7, 0.2, 0.5]])), [[1, 3]])
    got = tally.sums.summary()
    assert got["calibration_slots_per_position"] == [2, 1]  # both siblings reached; node 3 under node 1
    assert got["observed_accept_per_position"] == [0.5, 1.0]
    assert got["predicted_mean_accepted_length"] == pytest.approx(0.7 + 0.2 + 0.35)
    tally.add(DraftBatch.from_drafts([Draft(chain(2), [1, 2, 3])], "cpu"), [[1]])  # no survival: skipped
    assert tally.sums.summary()["calibration_slots"] == 3


@pytest.fixture(scope="module")
def dspark_folder(tiny_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dspark-cal") / "head"
    random_head(tiny_target, block=4).save_pretrained(folder)
    return folder


def test_bench_rows_carry_the_calibration_of_a_dspark_head(tiny_dir, dspark_folder, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i}"}) for i in range(3)))
    out = tmp_path / "bench"
    argv = ["bench", "--target", str(tiny_dir), "--draft", f"dspark:{dspark_folder}", "--draft", "ngram"]
    argv += ["--tree", "chain:3", "--tree", "adaptive:3", "--baselines", "plain", "--no-roofline"]
    argv += ["--prompts", f"jsonl:{prompts}", "--num-prompts", "3", "--max-new-tokens", "6"]
    argv += ["--temperatures", "0", "--batch-sizes", "1,2", "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads((out / "results.json").read_text())
    dspark = [r for r in rows if r["method"].startswith("dspark:")]
    assert len(dspark) == 4
    assert sum(r["tree"] == "chain:3" for r in dspark) == 2
    for r in dspark:
        if r["tree"] != "chain:3" and "calibration_error" not in r:  # adaptive:3 may choose plain steps
            continue  # only (a depth picked before drafting from timings): nothing verified, nothing scored
        assert 0 <= r["calibration_error"] <= 1 and r["calibration_slots"] > 0, r["method"]
        assert (
            len(r["reliability"]) == 10
            and sum(b["count"] for b in r["reliability"]) == r["calibration_slots"]
        )
        positions = len(r["predicted_accept_per_position"])  # adaptive:3: the deepest node it verified
        assert positions == len(r["observed_accept_per_position"])
        assert positions == 3 if r["tree"] == "chain:3" else 1 <= positions <= 3
        assert r["observed_mean_accepted_length"] is not None and r["predicted_mean_accepted_length"] > 0
        if r["tree"] == "chain:3":  # every cycle verifies node 1 (adaptive:3 may verify none: K = 0)
            assert r["calibration_slots_per_position"][0] == r["cycles"]
    others = [r for r in rows if not r["method"].startswith("dspark:")]
    assert others and not any("calibration_error" in r for r in others)  # no survival, no calibration
    assert "## Calibration of the survival estimates" in (out / "report.md").read_text()
    assert (out / "reliability.png").stat().st_size > 0
