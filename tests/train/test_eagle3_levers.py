"""The EAGLE-3 levers of train/objectives/eagle3_levers.py in the objective and the trainer: each loss in the
chunked TTT objective against a dense float64 reference (values and head gradients), explicit step weights,
the TTT schedule (its stages by step, the steps each train row logs, evaluation over every step), feature
noise (training forwards only), and the bad inputs (exit code 2 naming the key).

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_eagle3_levers.py -q
"""

import pytest
import torch
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import assert_float64_equal
from train_data import read_metrics, run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import train
from draftsmith.train.objectives.draft_losses import LOSSES, divergence
from draftsmith.train.objectives.eagle3_levers import Levers, parse_ttt_schedule
from draftsmith.train.objectives.eagle3_objective import TTTBatch, draft_targets, ttt_loss, unroll
from draftsmith.train.objectives.heads import TTTModel

STEPS = 3


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


def make_head(target, seed=0, draft_vocab=None):
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=draft_vocab))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.1)
    return head


def make_batch(target, length=12, batch=2, seed=0):
    """Random ids through the tiny target: its aux features and last hidden states; a 3-token prompt."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, 100, (batch, length), generator=g)
    out = target.forward(ids, target.new_cache(batch, length), capture_layers=(0, 1, 2))
    features = torch.cat([out.aux[i] for i in (0, 1, 2)], dim=-1)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, :3] = 0
    return TTTBatch(ids, features.clone(), out.hidden.clone(), mask)


def float64_setup(target):
    """A float64 head (draft vocab 64 of 128, so the in-vocab rule bites), batch and target callables."""
    head = make_head(target, draft_vocab=64).double()
    head.set_draft_vocab(torch.arange(0, 128, 2))
    target64 = Target(tiny_model("llama").double(), tiny_tokenizer(), "tiny")  # float64 target logits
    b = make_batch(target64, length=12)
    return head, b, target64.embed, target64.logits


def dense_reference(name, head, batch, embed, logits, weights):
    """The weighted TTT loss with `name` from draft_losses over all counted rows at once (no chunks)."""
    ids, length = batch.input_ids, batch.input_ids.shape[1]
    with torch.no_grad():
        all_probs, all_in_vocab = draft_targets(head, logits(batch.target_hidden))  # [B, T, Vd], [B, T]
    total = 0
    for k, h in enumerate(unroll(head, embed, ids, batch.features, STEPS, "dense")):
        counted = torch.zeros_like(ids, dtype=torch.bool)
        counted[:, : length - k - 2] = batch.loss_mask[:, k + 2 :] > 0
        counted[:, : length - k - 1] &= all_in_vocab[:, k + 1 :]
        probs = torch.zeros_like(all_probs)
        probs[:, : length - k - 1] = all_probs[:, k + 1 :]
        total = total + weights[k] * divergence(name, probs[counted], head.draft_logits(h)[counted])
    return total


@pytest.mark.parametrize("name", LOSSES)
def test_each_loss_in_the_chunked_objective_matches_a_dense_float64_reference(target, name):
    """Chunks of 5 rows, recomputed in backward, give the dense loss and the same head gradients. For kl
    the objective computes the soft cross-entropy: KL + H(p), equal gradients, the value H(p) higher."""
    head, batch, embed, logits = float64_setup(target)
    weights = [1.0, 0.5, 0.25]
    got = ttt_loss(
        head, embed, batch, STEPS, target_logits=logits, logit_chunk=5, divergence=name, weights=weights
    )
    grads = torch.autograd.grad(got.loss, [head.fc.weight, head.lm_head.weight])
    want = dense_reference(name, head, batch, embed, logits, weights)
    want_grads = torch.autograd.grad(want, [head.fc.weight, head.lm_head.weight])
    if name == "kl":  # the entropy the cross-entropy adds: KL's value must be below it
        assert float(got.loss.detach() - want.detach()) > 0.1
        assert_float64_equal(
            got.loss, ttt_loss(head, embed, batch, STEPS, target_logits=logits, weights=weights).loss
        )
    else:
        assert_float64_equal(got.loss, want)
    for g, w in zip(grads, want_grads):
        assert_float64_equal(g, w)
    assert int(got.counted.sum()) > 0


def test_step_weights_replace_the_decay(target):
    head, batch, embed, logits = float64_setup(target)
    out = ttt_loss(head, embed, batch, STEPS, target_logits=logits, weights=[2.0, 0.0, 1.0, 9.0])
    assert_float64_equal(out.loss, 2 * out.step_losses[0] + out.step_losses[2])  # the first STEPS weights
    default = ttt_loss(head, embed, batch, STEPS, decay=0.8, target_logits=logits)
    with pytest.raises(AssertionError):  # the control: the decay is another weighting
        assert_float64_equal(out.loss, default.loss)


def test_the_model_runs_its_stage_in_training_and_every_step_in_evaluation(target):
    head = make_head(target)
    batch = make_batch(target)
    inputs = dict(
        input_ids=batch.input_ids,
        features=batch.features,
        target_hidden=batch.target_hidden,
        loss_mask=batch.loss_mask,
        valid=torch.ones_like(batch.input_ids, dtype=torch.bool),
    )
    model = TTTModel(head, target.embed, target.logits, 4, 0.8)
    model.active_steps = 2
    _, correct, counted = model(**inputs)
    assert correct.shape == counted.shape == (4,) and (counted[:2] > 0).all() and (counted[2:] == 0).all()
    model.eval()
    _, _, counted = model(**inputs)
    assert (counted > 0).all()


def test_noise_changes_training_forwards_only(target):
    head = make_head(target)
    batch = make_batch(target)
    inputs = dict(
        input_ids=batch.input_ids,
        features=batch.features,
        target_hidden=batch.target_hidden,
        loss_mask=batch.loss_mask,
        valid=torch.ones_like(batch.input_ids, dtype=torch.bool),
    )
    clean = TTTModel(head, target.embed, target.logits, STEPS, 0.8)
    noisy = TTTModel(head, target.embed, target.logits, STEPS, 0.8, noise_std=0.5)
    with torch.no_grad():
        base = clean(**inputs)[0]
        torch.manual_seed(0)
        a = noisy(**inputs)[0]
        torch.manual_seed(0)
        b = noisy(**inputs)[0]
        assert torch.equal(a, b) and not torch.equal(a, base)  # seeded, and it does something
        clean.eval(), noisy.eval()
        assert torch.equal(clean(**inputs)[0], noisy(**inputs)[0])  # evaluation sees the true features


def test_schedule_stages_by_step():
    assert parse_ttt_schedule("3,7@0.3", 7) == ((0.0, 3), (0.3, 7))
    assert parse_ttt_schedule("2@0, 4@0.25, 6@0.5", 6) == ((0.0, 2), (0.25, 4), (0.5, 6))
    assert parse_ttt_schedule("", 7) == ()
    levers = Levers(stages=((0, 3), (3, 7)))  # "3,7@0.3" over 10 steps: 0.3 * 10 rounds up to 3, not 4
    assert [levers.steps_at(s, 7) for s in range(10)] == [3, 3, 3] + [7] * 7
    assert Levers().steps_at(5, 7) == 7


# ---- the trainer --------------------------------------------------------------------------------------
def overrides(tiny_dir, source, data_dir, out, *extra):
    return run_overrides(tiny_dir, source, data_dir, out, f"train.ttt_steps={STEPS}", *extra)


# The tiny random target's LM head, copied into a fresh head (init_from_target), puts the head's q almost
# nowhere near p: the bounded losses (tv, jsd) then have vanishing gradients (speculators' docs say so of
# tv from a cold start) and need a head that starts near uniform to show they learn in 24 steps.
COLD = "head.init_from_target=false"
LEVERS = [
    ["head.loss=rkl"],
    ["head.loss=jsd", COLD],
    ["head.loss=tv", COLD],
    ["head.loss=lk_hybrid"],
    ["train.noise_std=0.05"],
]


@pytest.mark.parametrize("lever", LEVERS, ids=lambda x: x[0])
def test_a_tiny_run_with_each_lever_learns(tiny_dir, source, data_dir, tmp_path, lever):
    out = tmp_path / "run"
    steps = ["train.max_steps=24", "eval.every=4", "checkpoint.every=0", "train.lr=3e-3"]
    last = train(load_train_config(None, overrides(tiny_dir, source, data_dir, out, *steps, *lever)))
    rows = read_metrics(out)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows) and len(rows) == 24
    evals = [r["loss"] for r in read_metrics(out, "eval")]
    assert evals[-1] < evals[0]  # the same validation rows score better
    assert len(last["accuracy_per_step"]) == STEPS and last["simulated_tau"] >= 1.0


def test_the_schedule_switches_at_its_step(tiny_dir, source, data_dir, tmp_path):
    """'1,2@0.5,3@0.8' over 6 steps: optimizer steps 0-2 run 1 TTT step, 3-4 run 2, 5 runs 3 (logged as
    steps 1..6); evaluation (steps 3, 6) scores all 3."""
    out = tmp_path / "run"
    schedule = "head.ttt_schedule='1,2@0.5,3@0.8'"
    last = train(
        load_train_config(
            None, overrides(tiny_dir, source, data_dir, out, schedule, "head.ttt_weights=[1,1,1]")
        )
    )
    rows = read_metrics(out)
    assert [r["ttt_steps"] for r in rows] == [1, 1, 1, 2, 2, 3]
    for r in rows:  # the steps a stage does not run count nothing
        assert all(a == 0 for a in r["accuracy_per_step"][r["ttt_steps"] :])
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    # evaluation reports every step (that it runs them all is test_the_model_runs_its_stage_...)
    assert len(last["accuracy_per_step"]) == 3 and len(read_metrics(out, "eval")) == 2


# ---- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad,message",
    [
        ("head.loss=ce", "head.loss: got 'ce', expected one of ['kl', 'rkl', 'jsd', 'tv', 'lk_hybrid']"),
        ("train.noise_std=-0.1", "train.noise_std: got -0.1, expected a standard deviation >= 0"),
        ("head.ttt_weights=[1,-1,1]", "head.ttt_weights: got [1.0, -1.0, 1.0], expected finite weights >= 0"),
        ("head.ttt_weights=[0,0,0]", "at least one > 0"),
        ("head.ttt_weights=[1,1]", "head.ttt_weights: got [1.0, 1.0], expected 3 weights, one per TTT step"),
        (
            "head.ttt_schedule='2,4@0.5'",
            "head.ttt_schedule: got '2,4@0.5', expected stages of 1 to train.ttt_steps=3",
        ),
        ("head.ttt_schedule='2,3@1.5'", "then 0 < F < 1 increasing"),
        ("head.ttt_schedule='2,3@0.5,3@0.4'", "then 0 < F < 1 increasing"),
        ("head.ttt_schedule='two'", "head.ttt_schedule: got 'two', expected stages K or K@F"),
    ],
)
def test_bad_levers_name_the_key(tiny_dir, source, data_dir, tmp_path, bad, message):
    with pytest.raises(BadInputError) as err:
        load_train_config(None, overrides(tiny_dir, source, data_dir, tmp_path / "x", bad))
    assert message in str(err.value)


def test_noise_is_refused_for_other_kinds(tmp_path):
    with pytest.raises(BadInputError, match="train.noise_std: got 0.1, expected 0 for head.type=mtp"):
        load_train_config(None, ["head.type=mtp", "train.noise_std=0.1", f"output_dir={tmp_path}"])


@pytest.mark.parametrize("bad", ["head.loss=nope", "head.ttt_schedule='9,3@0.5'"])
def test_the_cli_exits_2(tiny_dir, source, data_dir, tmp_path, capsys, bad):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("{}\n")
    code = main(
        ["train", "--config", str(cfg_path), *overrides(tiny_dir, source, data_dir, tmp_path / "x"), bad]
    )
    assert code == 2
    assert bad.split("=")[0] in capsys.readouterr().err
