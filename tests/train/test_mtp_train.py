"""MTP training on the tiny target through the one trainer: frozen (distillation and data labels),
co-trained with LoRA and in full (drift report, merged target shipped with the modules), exact resume,
online == offline, refusals (exit code 2). The trained folders load as `mtp:DIR` and decode losslessly."""

import importlib.util

import pytest
import torch
from train_data import online_and_offline_losses, read_metrics, run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp import load_head
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import Trainer, train


def overrides(tiny_dir, source, data_dir, out, *extra):
    return run_overrides(
        tiny_dir, source, data_dir, out, "head.type=mtp", "head.num_modules=2", "train.lr=0.002", *extra
    )


def config(tiny_dir, source, data_dir, out, *extra):
    return load_train_config(None, overrides(tiny_dir, source, data_dir, out, *extra))


metrics = read_metrics


def decodes_losslessly(target, head_dir, depth=2):
    head = load_head(head_dir, target)
    prompts = [target.encode("w1 w2 w3"), target.encode("w7 w8")]
    spec = generate_speculative(
        target, mtp_drafter(head, target, chain(depth)), prompts, SamplingParams(), 12
    )
    plain = generate_plain(target, prompts, SamplingParams(), 12)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]  # zero mismatches


@pytest.mark.parametrize("labels", ["target", "data"])
def test_frozen_run_trains_the_modules_only(tiny_dir, tiny_target, source, data_dir, tmp_path, labels):
    out = tmp_path / "run"
    before = {k: v.clone() for k, v in tiny_target.model.state_dict().items()}
    steps = ["train.max_steps=20", "eval.every=10", "checkpoint.every=10"]
    trainer = Trainer(config(tiny_dir, source, data_dir, out, f"head.labels={labels}", *steps))
    last = trainer.fit()
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert all(len(r["accuracy_per_step"]) == 2 for r in rows)
    evals = metrics(out, "eval")
    assert [r["step"] for r in evals] == [10, 20] and last["step"] == 20
    assert evals[1]["loss"] < evals[0]["loss"]  # the same validation rows score better
    assert "target_val_loss" not in evals[1]  # no drift report when the target is frozen
    for k, v in trainer.target.model.state_dict().items():  # the frozen target did not move
        assert torch.equal(v, before[k]), k
    decodes_losslessly(tiny_target, out / "final")


def test_lora_cotraining_reports_drift_and_ships_the_merged_target(
    tiny_dir, tiny_target, source, data_dir, tmp_path
):
    pytest.importorskip("peft")
    out = tmp_path / "lora"
    train(config(tiny_dir, source, data_dir, out, "cotrain.enabled=true", "cotrain.lora_rank=4"))
    evals = metrics(out, "eval")
    if importlib.util.find_spec("matplotlib"):
        assert (out / "training_curve.png").stat().st_size > 0  # with the drift panel
    for r in evals:
        assert {"target_val_loss", "original_target_val_loss", "target_val_loss_drift"} <= set(r)
        assert r["target_val_loss_drift"] == pytest.approx(
            r["target_val_loss"] - r["original_target_val_loss"]
        )
    assert evals[-1]["target_val_loss"] != evals[-1]["original_target_val_loss"]  # the target did train
    assert evals[-1]["target_kl_to_original"] > 0 and evals[-1]["target_argmax_agreement"] < 1
    cotrained = Target.load(str(out / "final" / "target"), device="cpu")
    original = tiny_target.model.state_dict()
    merged = cotrained.model.state_dict()
    assert not any(".lora_" in k for k in merged)  # adapters merged away
    assert torch.equal(merged["model.embed_tokens.weight"], original["model.embed_tokens.weight"])  # frozen
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], original["model.layers.0.self_attn.q_proj.weight"]
    )
    decodes_losslessly(cotrained, out / "final")
    with pytest.raises(BadInputError, match="target_weights_hash") as err:
        load_head(out / "final", tiny_target)  # the original target is not the one it was trained with
    assert "--target" in str(err.value)


def test_drift_of_untouched_adapters_is_zero(tiny_dir, source, data_dir, tmp_path):
    """LoRA starts with B = 0: before any update the co-trained target is the original, so the drift
    report must say KL 0 and full argmax agreement (the negative control of the numbers above)."""
    pytest.importorskip("peft")
    trainer = Trainer(config(tiny_dir, source, data_dir, tmp_path / "zero", "cotrain.enabled=true"))
    drift = trainer.target_drift()
    assert drift["target_kl_to_original"] == pytest.approx(0, abs=1e-6)
    assert drift["target_argmax_agreement"] == 1.0
    assert drift["target_val_loss"] == pytest.approx(trainer.original_val_loss)


def test_full_cotraining_moves_every_unfrozen_weight(tiny_dir, tiny_target, source, data_dir, tmp_path):
    out = tmp_path / "full"
    train(
        config(
            tiny_dir,
            source,
            data_dir,
            out,
            "cotrain.enabled=true",
            "cotrain.method=full",
            "train.max_steps=2",
        )
    )
    merged = Target.load(str(out / "final" / "target"), device="cpu").model.state_dict()
    original = tiny_target.model.state_dict()
    assert torch.equal(merged["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
    assert not torch.equal(
        merged["model.layers.1.mlp.up_proj.weight"], original["model.layers.1.mlp.up_proj.weight"]
    )
    decodes_losslessly(Target.load(str(out / "final" / "target"), device="cpu"), out / "final")


def test_cotraining_resume_is_exact(tiny_dir, source, data_dir, tmp_path):
    """Stopped after step 2 and resumed by a new Trainer == an uninterrupted run, bitwise (LoRA
    adapters, the target's optimizer state and the original validation loss all come back)."""
    pytest.importorskip("peft")
    extra = [
        "cotrain.enabled=true",
        "cotrain.lora_rank=4",
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
    straight, split = metrics(tmp_path / "straight"), metrics(tmp_path / "split")
    assert [r["loss"] for r in straight] == [r["loss"] for r in split]
    assert [r["step"] for r in split] == [1, 2, 3, 4]
    a = load_head(tmp_path / "straight" / "final")
    b = load_head(tmp_path / "split" / "final")
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


VLLM_INPUTS = ["head.mtp_feature=pre_norm", "head.mtp_mask_first_position=true"]


@pytest.mark.parametrize("options", [[], VLLM_INPUTS], ids=["final-norm", "vllm-inputs"])
def test_offline_mode_matches_online(tiny_dir, source, data_dir, tmp_path, options):
    """Online runs the target here (its pre-norm state through a hook for pre_norm modules); offline
    reads the captured pre-norm state: the same losses either way."""
    a, b = online_and_offline_losses(
        lambda out, *extra: config(tiny_dir, source, data_dir, out, *options, *extra), train, tmp_path
    )
    assert a == pytest.approx(b, rel=1e-4, abs=1e-5)  # batched HF forward vs per-row capture: rounding only
    saved = load_head(tmp_path / "online" / "final").config
    assert (saved.feature, saved.mask_first_position) == (
        ("pre_norm", True) if options else ("final_norm", False)
    )


@pytest.mark.parametrize(
    "bad,field",
    [
        (["head.num_modules=5"], "head.num_modules: got 5"),
        # the MTP keys of the base overrides are refused in an eagle3 section, naming their kind (co-training
        # an EAGLE-3 head alone: tests/runtime/test_head_kinds.py)
        (["head.type=eagle3", "cotrain.enabled=true"], "num_modules is an option of head.type=mtp"),
        (["cotrain.enabled=true", "data.mode=offline"], "data.mode=online"),
        (["cotrain.enabled=true", "cotrain.lora_target_modules=no_such_proj"], "cotrain.lora_target_modules"),
        (["head.labels=guess"], "head.labels"),
        (["head.mtp_feature=middle"], "head.mtp_feature"),
        (["head.type=eagle3", "head.mtp_mask_first_position=true"], "is an option of head.type=mtp"),
    ],
)
def test_bad_mtp_configs_exit_2_naming_the_field(tiny_dir, source, data_dir, tmp_path, capsys, bad, field):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("{}\n")
    code = main(
        ["train", "--config", str(cfg_path), *overrides(tiny_dir, source, data_dir, tmp_path / "x"), *bad]
    )
    assert code == 2
    assert field in capsys.readouterr().err


def test_lora_without_peft_names_the_extra(tiny_dir, source, data_dir, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_peft(name, *args, **kwargs):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(BadInputError, match=r"draftsmith\[train\]"):
        Trainer(config(tiny_dir, source, data_dir, tmp_path / "np", "cotrain.enabled=true"))


def test_gguf_target_cannot_cotrain(tiny_dir, source, data_dir, tmp_path):
    cfg = overrides(tiny_dir, source, data_dir, tmp_path / "g", "cotrain.enabled=true")
    with pytest.raises(BadInputError, match="quantized export"):
        load_train_config(None, [*cfg, "target=model.Q8_0.gguf"])
