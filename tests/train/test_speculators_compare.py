"""scripts/studies/speculators_trainer_compare.py --smoke: draftsmith's trainer and speculators' own Trainer
on the tiny target, 6 steps each (slow: ~25 s on a loaded 2-core CPU).

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_speculators_compare.py -q -m slow

Beyond "both rows, finite numbers", the checks that make the comparison mean something: the conversion
the speculators-trained head goes through (ours -> speculators -> ours) leaves a known head's evaluation
exactly equal; speculators' forward on the packed batch the script feeds its trainer counts the same
positions per TTT step as our objective and gives our draft logits there up to fp32 rounding (a shift of
one position or a wrong mask would miss by the logits' scale); and both trainers moved their head.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tolerances import layer_accumulations, rounding_atol

pytest.importorskip("speculators")
pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "studies" / "speculators_trainer_compare.py"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("spec-compare")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| draftsmith |" in run.stdout and "| speculators |" in run.stdout
    return json.loads((out / "compare.json").read_text())


def test_the_table_has_both_trainers_with_finite_numbers(result):
    rows = {r["trainer"]: r for r in result["rows"]}
    assert sorted(rows) == ["draftsmith", "speculators"]
    for r in rows.values():
        assert r["steps"] == 6 and r["timed_steps"] == 4
        assert r["tokens_per_s"] > 0 and math.isfinite(r["tokens_per_s"])
        assert len(r["val_accuracy_per_step"]) == 3  # the smoke run's train.ttt_steps
        assert all(0 <= a <= 1 for a in r["val_accuracy_per_step"])
        assert math.isfinite(r["val_loss"]) and r["val_rows"] > 0
    assert math.isclose(
        result["tokens_per_s_ratio"],
        rows["draftsmith"]["tokens_per_s"] / rows["speculators"]["tokens_per_s"],
        rel_tol=1e-2,
    )
    # both trained: each head's validation loss moved away from the shared initial head's
    initial = result["roundtrip"]["initial_val_loss"]
    assert all(abs(r["val_loss"] - initial) > 1e-4 for r in rows.values())


def test_one_evaluation_scores_a_known_head_equally_through_the_speculators_conversion(result):
    roundtrip = result["roundtrip"]
    assert roundtrip["equal"], roundtrip
    assert roundtrip["direct"] == roundtrip["converted"]


def test_their_trainer_sees_our_positions_and_computes_our_logits(result):
    check = result["logits_check"]
    assert check["ours_counted"] == check["their_counted"]
    assert min(check["ours_counted"]) > 0
    # fc over 3 aux states, then per TTT step the layer over the packed keys (<= 3 steps x the batch's
    # tokens), the final norm and the LM head; the steps chain, so their sums add up
    hidden, intermediate = 64, 128  # the tiny target (tests/tiny_models.py); batch 2 x max length 64
    sums = 3 * hidden + 3 * (layer_accumulations(hidden, intermediate, 3 * 2 * 64) + 2 * hidden)
    assert check["max_abs_diff"] <= rounding_atol(torch.float32, sums, check["max_abs_logit"])
