"""Medusa-2 (train/objectives/medusa2.py): the target co-trained with its Medusa heads through the one
trainer.

The loss is L_LM + lambda0 * L_medusa in float64 (data CE, or KL to the original with self-distillation),
and the heads' loss reaches the target (Medusa-1's does not: the negative control); lambda0's warmup
values; the heads' and the target's learning-rate groups; the self-distillation KL is 0 before any update
(LoRA's B starts at zero; a full run's frozen copy) and positive after; a LoRA run ships final/target with
the heads bound to its weights hash (loaded there, refused against the original: exit 2), decodes
losslessly with it and writes the drift report; a stopped and resumed run equals an uninterrupted one.

    python -m pytest tests/train/test_medusa2.py -q
"""

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import random_prompts, tiny_model, tiny_tokenizer
from train_data import read_metrics, run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import Trainer, train
from draftsmith.train.objectives.medusa2 import CotrainedTarget, medusa_weight
from draftsmith.train.objectives.medusa_objective import MedusaModel

needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="LoRA needs peft")


def overrides(tiny_dir, source, data_dir, out, *extra):
    medusa = ["head.type=medusa", "head.num_heads=2", "head.calibration_rows=4", "head.calibration_topk=2"]
    cotrain = ["cotrain.enabled=true", "cotrain.lora_rank=4", "train.lr=0.005"]
    return run_overrides(tiny_dir, source, data_dir, out, *medusa, *cotrain, *extra)


def config(tiny_dir, source, data_dir, out, *extra):
    return load_train_config(None, overrides(tiny_dir, source, data_dir, out, *extra))


# ---- the loss, by hand -----------------------------------------------------------------------------------
def target64(seed=0):
    return Target(tiny_model("llama", seed=seed).double(), tiny_tokenizer(), "tiny")


def batch(n=4, seed=0):
    """[B, T] ids, loss mask (the first two tokens of a row unsupervised) and validity, right-padded."""
    seqs = [ids + ids[::-1] for ids in random_prompts(n, seed)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    valid = torch.zeros(n, width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, : len(s)], mask[b, 2 : len(s)], valid[b, : len(s)] = torch.tensor(s), 1, True
    return ids, mask, valid


def random_heads(target):
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig.for_target(target, num_heads=3)).init_from_target(target)
    with torch.no_grad():
        for p in heads.blocks.parameters():
            p.normal_(0, 0.3)
    return heads.double()


def hand_lm_loss(target, teacher, ids, mask, valid):
    """Mean over positions t whose token t+1 is supervised, row by row without padding: the target's CE
    on the data's token t+1, or (teacher given) KL(p_teacher || p_target) of token t+1."""
    terms = []
    for b in range(ids.shape[0]):
        n = int(valid[b].sum())
        row = ids[b : b + 1, :n]
        logq = target.model(input_ids=row).logits[0].log_softmax(-1)  # [n, V]
        logp = teacher.model(input_ids=row).logits[0].log_softmax(-1) if teacher is not None else None
        for t in range(n - 1):
            if not mask[b, t + 1]:
                continue
            if teacher is None:
                terms.append(-logq[t, ids[b, t + 1]])
            else:
                terms.append((logp[t].exp() * (logp[t] - logq[t])).sum())
    return torch.stack(terms).mean()


@pytest.mark.parametrize("self_distill", [False, True], ids=["data-ce", "self-distill"])
def test_loss_is_lm_plus_lambda0_times_the_heads_loss_in_float64(self_distill):
    target, teacher = target64(), (target64(seed=1) if self_distill else None)
    heads = random_heads(target)
    ids, mask, valid = batch()
    side = CotrainedTarget(target, teacher, self_distill, weight=0.3)
    out = MedusaModel(heads, target, "target", 0.8, cotrain=side).objective(ids, mask, valid)
    with torch.no_grad():
        medusa1 = MedusaModel(heads, target, "target", 0.8).objective(ids, mask, valid).loss
        lm = hand_lm_loss(target, teacher, ids, mask, valid)
    assert abs(float(out.target_loss.detach()) - float(lm)) < 1e-10
    assert abs(float(out.loss.detach()) - float(lm + 0.3 * medusa1)) < 1e-10
    out.loss.backward()
    q_proj = target.model.model.layers[0].self_attn.q_proj.weight
    assert q_proj.grad is not None and float(q_proj.grad.abs().sum()) > 0
    assert float(heads.blocks[0].layers[0].weight.grad.abs().sum()) > 0


def test_medusa1_does_not_reach_the_target_but_medusa2_heads_loss_does():
    """The negative control: Medusa-1 detaches the target's state; Medusa-2's heads' loss alone (lambda0
    times it, L_LM removed) still moves the target's weights."""
    target = target64()
    heads = random_heads(target)
    ids, mask, valid = batch()
    MedusaModel(heads, target, "target", 0.8).objective(ids, mask, valid).loss.backward()
    assert all(p.grad is None for p in target.decoder.parameters())  # (the shared LM head aside)
    side = CotrainedTarget(target, None, False, weight=0.5)
    out = MedusaModel(heads, target, "target", 0.8, cotrain=side).objective(ids, mask, valid)
    (out.loss - out.target_loss).backward()
    grad = target.model.model.layers[-1].mlp.down_proj.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0


def test_lambda0_warmup_values():
    def weights(schedule, warmup, steps=6):
        c = SimpleNamespace(
            cotrain_weight=0.2, cotrain_weight_warmup_steps=warmup, cotrain_weight_schedule=schedule
        )
        return [medusa_weight(s, c) for s in range(steps)]

    assert weights("linear", 4) == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.2])
    sine = [0.2 * torch.sin(torch.tensor(torch.pi / 2 * min(1, (s + 1) / 4))).item() for s in range(6)]
    assert weights("sine", 4) == pytest.approx(sine)
    assert weights("linear", 0) == [0.2] * 6 == weights("sine", 0)  # no warmup: lambda0 throughout


# ---- through the trainer -----------------------------------------------------------------------------------
@needs_peft
def test_heads_and_target_have_their_own_learning_rates(tiny_dir, source, data_dir, tmp_path):
    trainer = Trainer(config(tiny_dir, source, data_dir, tmp_path / "lr", "cotrain.target_lr_ratio=0.25"))
    heads, tuned = trainer.optimizer.param_groups
    assert {id(p) for p in heads["params"]} == {id(p) for p in trainer.head.parameters()}
    names = {id(p): n for n, p in trainer.target.model.named_parameters()}
    assert tuned["params"] and all(".lora_" in names[id(p)] for p in tuned["params"])
    assert tuned["lr"] == pytest.approx(0.25 * heads["lr"])
    one = Trainer(config(tiny_dir, source, data_dir, tmp_path / "one"))  # ratio 1: one group, as before
    assert len(one.optimizer.param_groups) == 1


def target_loss_now(trainer) -> float:
    """The co-trained target's L_LM (here KL to the original) on the first validation batch."""
    with torch.no_grad():
        inputs = next(trainer.val_batches())
        return float(trainer.kind.model.objective(**inputs).target_loss)


@pytest.mark.parametrize("method", [pytest.param("lora", marks=needs_peft), "full"])
def test_self_distillation_kl_is_zero_before_updates_and_positive_after(
    tiny_dir, source, data_dir, tmp_path, method
):
    """LoRA starts with B = 0 and full fine-tuning from the frozen copy: the target is its original, KL 0;
    three updates later it is not."""
    extra = ["cotrain.self_distill=true", f"cotrain.method={method}", "train.max_steps=3", "eval.every=0"]
    trainer = Trainer(config(tiny_dir, source, data_dir, tmp_path / method, *extra))
    original = trainer.kind.original  # LoRA: the peft model (adapters off, no copy); full: a frozen copy
    assert (original is trainer.kind.peft_model) == (method == "lora")
    assert method == "lora" or (isinstance(original, Target) and original.model is not trainer.target.model)
    assert target_loss_now(trainer) == pytest.approx(0, abs=1e-9)
    for _ in range(3):  # (not fit: its end merges the adapters away)
        trainer.train_step()
    assert target_loss_now(trainer) > 1e-6
    assert trainer.target_drift()["target_kl_to_original"] > 0  # the drift report: the same original


@pytest.fixture(scope="module")
def lora_run(tiny_dir, source, data_dir, tmp_path_factory):
    if importlib.util.find_spec("peft") is None:
        pytest.skip("LoRA needs peft")
    out = tmp_path_factory.mktemp("medusa2") / "run"
    extra = ["head.cotrain_weight_warmup_steps=4", "head.cotrain_weight_schedule=linear"]
    train(config(tiny_dir, source, data_dir, out, *extra, "cotrain.target_lr_ratio=0.5"))
    return out


def test_a_lora_run_writes_the_drift_report_and_logs_lambda0(lora_run):
    rows = read_metrics(lora_run)
    c = SimpleNamespace(cotrain_weight=0.2, cotrain_weight_warmup_steps=4, cotrain_weight_schedule="linear")
    assert [r["medusa_weight"] for r in rows] == pytest.approx(
        [medusa_weight(r["step"] - 1, c) for r in rows]
    )
    assert all(r["target_lr"] == pytest.approx(0.5 * r["lr"]) for r in rows)
    evals = read_metrics(lora_run, "eval")
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals:
        assert {"target_val_loss", "original_target_val_loss", "target_val_loss_drift"} <= set(r)
        assert r["target_val_loss_drift"] == pytest.approx(
            r["target_val_loss"] - r["original_target_val_loss"]
        )
        assert len(r["accuracy_per_step"]) == 2
    assert evals[-1]["target_kl_to_original"] > 0 and evals[-1]["target_argmax_agreement"] <= 1


def test_the_heads_load_against_their_target_only(lora_run, tiny_dir, tiny_target, capsys):
    final = lora_run / "final"
    cotrained = Target.load(str(final / "target"), device="cpu")
    heads = MedusaHeads.from_pretrained(final, cotrained)
    assert heads.config.cotrained and heads.config.target_weights_hash == cotrained.weights_hash()
    assert heads.config.target_weights_hash != tiny_target.weights_hash()
    assert len(heads.config.accuracies) == 2  # calibrated with the co-trained target
    with pytest.raises(BadInputError, match="target_weights_hash") as err:
        MedusaHeads.from_pretrained(final, tiny_target)
    assert "--target" in str(err.value)
    argv = ["generate", "--prompt", "w1 w2 w3", "--max-new-tokens", "10", "--draft", f"medusa:{final}"]
    assert main([*argv, "--target", str(tiny_dir)]) == 2  # the original target: refused
    assert "target_weights_hash" in capsys.readouterr().err
    assert main([*argv, "--target", str(final / "target"), "--tree", "chain:2", "--json"]) == 0
    got = capsys.readouterr().out.strip().splitlines()[-1]
    plain = generate_plain(cotrained, [cotrained.encode("w1 w2 w3")], SamplingParams(), 10)[0]
    assert f'"token_ids": {plain.token_ids}'.replace(" ", "") in got.replace(" ", "")  # lossless


@needs_peft
def test_resume_is_exact(tiny_dir, source, data_dir, tmp_path):
    """Stopped after step 2 and resumed by a new Trainer == an uninterrupted run, bitwise: adapters, both
    learning-rate groups, lambda0's warmup and the self-distillation teacher all come back."""
    extra = [
        "cotrain.self_distill=true",
        "head.cotrain_weight_warmup_steps=8",  # lambda0 still ramping at the stop
        "cotrain.target_lr_ratio=0.5",
        "checkpoint.every=1",
        "eval.every=0",
        "train.max_steps=4",
    ]
    train(config(tiny_dir, source, data_dir, tmp_path / "straight", *extra))
    interrupted = Trainer(config(tiny_dir, source, data_dir, tmp_path / "split", *extra))
    step = interrupted.train_step

    def stop_after_two():
        if interrupted.step == 2:
            raise KeyboardInterrupt
        return step()

    interrupted.train_step = stop_after_two
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    train(config(tiny_dir, source, data_dir, tmp_path / "split", *extra))
    straight, split = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "split")
    assert [r["loss"] for r in straight] == [r["loss"] for r in split]
    assert [r["step"] for r in split] == [1, 2, 3, 4]
    for sub in ("final", "final/target"):
        a = load_file(tmp_path / "straight" / sub / "model.safetensors")
        b = load_file(tmp_path / "split" / sub / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub


@pytest.mark.parametrize(
    "bad,says",
    [
        (["head.cotrain_weight=0"], "head.cotrain_weight"),
        (["head.cotrain_weight_warmup_steps=-1"], "head.cotrain_weight_warmup_steps"),
        (["head.cotrain_weight_schedule=cosine"], "head.cotrain_weight_schedule"),
        (["cotrain.medusa_weight=0"], "head.cotrain_weight"),  # the old key, read as its new place
        (["cotrain.target_lr_ratio=0"], "cotrain.target_lr_ratio"),
        (["data.mode=offline"], "data.mode=online"),
    ],
)
def test_bad_medusa2_configs_exit_2(tiny_dir, source, data_dir, tmp_path, capsys, bad, says):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("{}\n")
    argv = ["train", "--config", str(cfg_path), *overrides(tiny_dir, source, data_dir, tmp_path / "x"), *bad]
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_self_distillation_is_refused_for_mtp(tiny_dir, source, data_dir, tmp_path, capsys):
    cfg = ["head.type=mtp", "cotrain.enabled=true", "cotrain.self_distill=true"]
    argv = [
        "train",
        "--config",
        str(tmp_path / "none.yaml"),
        *run_overrides(tiny_dir, source, data_dir, tmp_path / "x"),
        *cfg,
    ]
    (tmp_path / "none.yaml").write_text("{}\n")
    assert main(argv) == 2
    assert "cotrain.self_distill" in capsys.readouterr().err
