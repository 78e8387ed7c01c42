"""Recalibrating a confidence head (runtime/verify/recalibration.py, runtime/bench/calibrate.py,
`draftsmith calibrate`): Platt scaling's fit recovers known parameters within its own standard error, a
calibrated predictor is left near the identity (the negative control), the ECE of a miscalibrated one
falls; the AUROC is exact against a pairwise count and unmoved by the map; folding the map into a DSpark
folder's tensors gives the head the mapped survival; the replay's slots are the engine's; the verb writes a
head whose survival is what its record says, and refuses bad input before any work.

    python -m pytest tests/runtime/test_recalibration.py -q
"""

import json

import pytest
import torch
from dflash_heads import trained_head
from dspark_heads import on_backbone, random_head
from tiny_models import random_prompts

from draftsmith.runtime.bench.calibrate import CalibrateRequest, calibrate_on
from draftsmith.runtime.bench.eval_replay import TeacherForced, replay
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.dspark import CONFIDENCE_BIAS, CONFIDENCE_WEIGHT, DSparkHead, platt_folded
from draftsmith.runtime.verify.calibration import CalibrationSums, SurvivalTally, expected_calibration_error
from draftsmith.runtime.verify.recalibration import SurvivalPairs, auroc, fit_platt, platt
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec


def synthetic(n: int, scale: float, shift: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions p = sigmoid(z), z ~ N(-1, 1.5^2), outcomes ~ Bernoulli(sigmoid(scale * z + shift))."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g, dtype=torch.float64) * 1.5 - 1.0
    y = torch.bernoulli(torch.sigmoid(scale * z + shift), generator=g)
    return torch.sigmoid(z), y


def standard_errors(p: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    """The maximum-likelihood estimate's standard errors at the true parameters: sqrt(diag(I^-1))."""
    x = torch.stack([torch.logit(p), torch.ones_like(p)])
    q = torch.sigmoid(scale * x[0] + shift)
    return torch.linalg.inv((x * (q * (1 - q))) @ x.T).diagonal().sqrt()


@pytest.mark.parametrize("scale, shift", [(0.7, 0.5), (1.0, 0.0), (1.6, -0.4)])
def test_the_fit_recovers_known_parameters(scale, shift):
    p, y = synthetic(40_000, scale, shift)
    got = torch.tensor(fit_platt(p, y), dtype=torch.float64)
    se = standard_errors(p, scale, shift)
    assert ((got - torch.tensor([scale, shift], dtype=torch.float64)).abs() < 5 * se).all(), (got, se)


def test_a_miscalibrated_predictor_is_fixed_and_a_calibrated_one_left_alone():
    p, y = synthetic(40_000, 1.0, 0.6)  # under-predicts, as the recipe head does on the target's text
    before = expected_calibration_error(p, y)
    after = expected_calibration_error(platt(p, *fit_platt(p, y)), y)
    assert before > 0.05 and after < 0.01, (before, after)
    p, y = synthetic(40_000, 1.0, 0.0, seed=1)  # negative control: already calibrated
    assert expected_calibration_error(p, y) < 0.01
    scale, shift = fit_platt(p, y)
    assert abs(scale - 1) < 0.05 and abs(shift) < 0.05


def test_auroc_is_the_pairwise_count_and_the_map_keeps_it():
    g = torch.Generator().manual_seed(2)
    p = torch.randint(0, 8, (300,), generator=g).double() / 8  # many ties
    y = torch.bernoulli(p * 0.8 + 0.1, generator=g)
    pos, neg = p[y > 0.5], p[y < 0.5]
    pairs = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()
    assert auroc(p, y) == pytest.approx(float(pairs.mean()), abs=1e-12)
    assert auroc(platt(p, 0.4, 1.2), y) == pytest.approx(auroc(p, y), abs=1e-12)
    assert auroc(torch.rand(50, generator=g), torch.ones(50)) is None
    assert 0.45 < auroc(*synthetic(20_000, 0.0, -1.0)) < 0.55  # outcomes independent of the prediction


def test_the_fit_refuses_what_it_cannot_fit():
    p, y = synthetic(1_000, 1.0, 0.0)
    with pytest.raises(BadInputError, match="calibration slots"):
        fit_platt(p[:50], y[:50])
    with pytest.raises(BadInputError, match="both outcomes"):
        fit_platt(p, torch.zeros_like(y))
    with pytest.raises(BadInputError, match="rises with acceptance"):
        fit_platt(p, 1 - y)  # ranked backwards


@pytest.fixture(scope="module")
def target(tiny_dir):
    return Target.load(str(tiny_dir), device="cpu")


def test_folding_maps_the_heads_survival(target, tmp_path):
    head = random_head(target, block=4)
    head.save_pretrained(tmp_path / "src")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "src" / "model.safetensors"))
    folded = platt_folded(tensors, 0.6, 0.8)
    assert all(
        torch.equal(folded[k], v) for k, v in tensors.items() if k not in (CONFIDENCE_WEIGHT, CONFIDENCE_BIAS)
    )
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "config.json").write_text((tmp_path / "src" / "config.json").read_text())
    save_file(folded, str(tmp_path / "dst" / "model.safetensors"), {"format": "pt"})
    calibrated = DSparkHead.from_pretrained(tmp_path / "dst", target).eval()
    h, prev = torch.randn(64, head.config.hidden_size), torch.randint(0, target.vocab_size, (64,))
    with torch.no_grad():
        want = platt(head.survival(h, prev), 0.6, 0.8)
        got = calibrated.survival(h, prev).double()
    # float32 logits of ~100 products: relative error ~1e-6; the float64 map of a float32 sigmoid adds ~1e-7
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    with pytest.raises(BadInputError, match="confidence head"):
        platt_folded({k: v for k, v in tensors.items() if k != CONFIDENCE_BIAS}, 1.0, 0.0)


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """A DSpark head on a briefly trained backbone (drafts partly accepted: both outcomes), saved."""
    prompts = random_prompts(6)
    folder = tmp_path_factory.mktemp("dspark") / "head"
    on_backbone(trained_head(target, prompts, block=4, steps=80)).save_pretrained(folder)
    return folder, prompts


def test_the_replays_slots_are_the_engines(target, trained):
    folder, prompts = trained
    spec, tree = f"dspark:{folder}", parse_tree_spec("chain:3")
    tally, pairs = SurvivalTally(), SurvivalPairs()
    engine = build_drafter(spec, target, tree)
    generate_speculative(target, engine, prompts, SamplingParams(), 16, batch_size=3, calibration=tally)
    replayed = build_drafter(spec, target, tree)
    tf = TeacherForced.decode(target, prompts, 16, 3, 3, replayed.capture_layers)
    replay(replayed, replayed.tree, tf, 3, calibration=pairs)
    sums = CalibrationSums.of(pairs.predicted(), pairs.outcome(), pairs.depths() - 1, 3)
    for got, want in ((sums.bins, tally.sums.bins), (sums.positions, tally.sums.positions)):
        assert torch.equal(got[:, 0], want[:, 0]) and torch.equal(got[:, 2], want[:, 2]), (
            "same slots, outcomes"
        )
        # The survivals are float32 and the replay's features come from one-token decode steps where the
        # engine's come from its verify forward: another reduction order, a few float32 ulps (~1e-7) in
        # each survival. 1e-5 a slot bounds that with room and still catches a wrong slot (~0.01 or more).
        assert ((got[:, 1] - want[:, 1]).abs() <= 1e-5 * want[:, 0]).all(), (got, want)
    assert 0 < float(pairs.outcome().sum()) < len(pairs.outcome()), "both outcomes occur"


def test_calibrate_writes_a_head_that_predicts_what_its_record_says(target, trained, tmp_path):
    folder, prompts = trained
    ids = [p + p[:3] for p in prompts] + prompts  # 12 prompts: 9 fit, 3 validate
    req = CalibrateRequest(draft=f"dspark:{folder}", out=str(tmp_path / "cal"), depth=3, max_new_tokens=24,
                           batch_size=4, plots=False)  # fmt: skip
    record = calibrate_on(req, target, folder, ids)
    written = json.loads((tmp_path / "cal" / "calibration.json").read_text())
    assert written["scale"] == record["scale"] and written["fit"]["slots"] >= 100
    assert record["fit"]["auroc"] is not None
    # the folded head, replayed on the validation prompts, predicts what the record's "after" says
    pairs, drafter = (
        SurvivalPairs(),
        build_drafter(f"dspark:{tmp_path / 'cal'}", target, parse_tree_spec("chain:3")),
    )
    tf = TeacherForced.decode(target, ids[9:], 24, 3, 4, drafter.capture_layers)
    replay(drafter, drafter.tree, tf, 4, calibration=pairs)
    got = CalibrationSums.of(pairs.predicted(), pairs.outcome(), pairs.depths() - 1, 3).summary()
    after = record["validation"]["after"]
    assert got["calibration_error"] == pytest.approx(after["calibration_error"], abs=1e-3)
    for a, b in zip(
        got["predicted_accept_per_position"], after["predicted_accept_per_position"], strict=True
    ):
        assert (a is None and b is None) or a == pytest.approx(b, abs=1e-3)  # summaries round to 4 digits
    assert sorted(p.name for p in (tmp_path / "cal").iterdir()) == [
        "calibration.json",
        "config.json",
        "model.safetensors",
    ]
    assert calibrate_on(req, target, folder, ids)["scale"] == record["scale"], "a rerun replaces its output"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging or old folder left"
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in (tmp_path / "cal").iterdir()), (
        "files others can read"
    )


def test_bad_input_is_refused_before_any_work(trained, tmp_path, capsys):
    folder, _ = trained
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("not a calibrate output")
    cases = [
        (["--draft", "ngram"], "dspark:DIR"),
        (["--draft", f"dflash:{folder}"], "dspark:DIR"),
        (["--draft", f"dspark:{tmp_path}"], "model.safetensors"),
        (["--draft", f"dspark:{folder}", "--out", str(folder)], "a new folder"),
        (["--draft", f"dspark:{folder}", "--out", str(folder.parent)], "a new folder"),  # holds the head
        (["--draft", f"dspark:{folder}", "--out", str(kept)], "calibration.json"),  # someone else's folder
        (["--draft", f"dspark:{folder}", "--validation-fraction", "1.5"], "(0, 1)"),
        (["--draft", f"dspark:{folder}", "--prompts", "nonsense"], "sharegpt-train"),
    ]
    for flags, expected in cases:
        argv = ["calibrate", "--out", str(tmp_path / "out"), *flags]
        assert main(argv) == 2, flags
        assert expected in capsys.readouterr().err, flags
    assert not (tmp_path / "out").exists() and (kept / "notes.txt").read_text() == "not a calibrate output"
