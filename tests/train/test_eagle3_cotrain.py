"""EAGLE-3 against a co-trained target (train/objectives/eagle3_cotrain.py) through the one trainer.

The loss is L_next + w * L_eagle3 in float64, L_eagle3 equal to the frozen objective's on the same target;
the head's loss reaches the target through its features and never through its teacher (detach_features:
the negative control, no gradient at all); the drift report is zero before any update and moves after; a
LoRA run ships final/target with the head bound to its weights hash (loaded there, refused against the
original with exit 2 unless `#any-target`), decodes greedily identical to plain decoding of the co-trained
target; export checks the target it names; a full run moves the weights; refusals exit 2; resume is exact.

    python -m pytest tests/train/test_eagle3_cotrain.py -q
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from tiny_models import random_prompts, tiny_model, tiny_tokenizer
from train_data import read_metrics, run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.layouts import load_eagle3
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import Trainer, train
from draftsmith.train.objectives.eagle3_cotrain import Eagle3CotrainModel
from draftsmith.train.objectives.eagle3_data import online_batch
from draftsmith.train.objectives.heads import TTTModel

needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="LoRA needs peft")
AUX = (0, 1, 2)
ROOT = Path(__file__).resolve().parents[2]


def overrides(tiny_dir, source, data_dir, out, *extra):
    cotrain = ["cotrain.enabled=true", "cotrain.lora_rank=4", "train.lr=0.005", "train.ttt_steps=2"]
    return run_overrides(tiny_dir, source, data_dir, out, *cotrain, *extra)


def config(tiny_dir, source, data_dir, out, *extra):
    return load_train_config(None, overrides(tiny_dir, source, data_dir, out, *extra))


# ---- the loss, by hand -----------------------------------------------------------------------------------
def target64():
    return Target(tiny_model("llama").double(), tiny_tokenizer(), "tiny")


def rows(n=4, seed=0):
    """Rows of the trainer's shape: ids and a loss mask (the first two tokens unsupervised)."""
    out = []
    for ids in random_prompts(n, seed):
        seq = ids + ids[::-1]
        out.append({"input_ids": seq, "loss_mask": [0, 0] + [1] * (len(seq) - 2)})
    return out


def padded(rows_):
    width = max(len(r["input_ids"]) for r in rows_)
    ids = torch.zeros(len(rows_), width, dtype=torch.long)
    mask, valid = torch.zeros_like(ids), torch.zeros(len(rows_), width, dtype=torch.bool)
    for b, r in enumerate(rows_):
        n = len(r["input_ids"])
        ids[b, :n], mask[b, :n], valid[b, :n] = (
            torch.tensor(r["input_ids"]),
            torch.tensor(r["loss_mask"]),
            True,
        )
    return ids, mask, valid


def random_head(target, steps=3):
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, AUX, 64)).double()
    head.set_draft_vocab(torch.arange(6, 70))
    return TTTModel(head, target.embed, target.logits, steps, 0.8)


def hand_next_token_loss(target, rows_):
    """Mean CE of token t+1 over positions whose token t+1 is supervised, row by row, unpadded."""
    terms = []
    for r in rows_:
        ids = torch.tensor([r["input_ids"]])
        logq = target.model(input_ids=ids).logits[0].log_softmax(-1)  # [n, V]
        terms += [-logq[t, ids[0, t + 1]] for t in range(ids.shape[1] - 1) if r["loss_mask"][t + 1]]
    return torch.stack(terms).mean()


def test_loss_is_next_token_plus_w_times_the_frozen_objectives_in_float64():
    target, batch = target64(), rows()
    ttt = random_head(target)
    ids, mask, valid = padded(batch)
    model = Eagle3CotrainModel(ttt, target, AUX, weight=0.3)
    loss, correct, counted = model(ids, mask, valid)
    frozen = online_batch(target, batch, AUX)  # the frozen path: Target.forward per row, KV cache
    with torch.no_grad():
        ref, ref_correct, ref_counted = ttt(
            frozen.input_ids, frozen.features, frozen.target_hidden, mask, valid
        )
        lm = hand_next_token_loss(target, batch)
    assert abs(float(model.parts[0].detach()) - float(lm)) < 1e-10
    assert abs(float(model.parts[1].detach()) - float(ref)) < 1e-10  # the same features, hooks vs capture
    assert abs(float(loss.detach()) - float(lm + 0.3 * ref)) < 1e-10
    assert torch.equal(correct, ref_correct) and torch.equal(counted, ref_counted)


@pytest.mark.parametrize("detach", [False, True], ids=["features-attached", "features-detached"])
def test_the_heads_loss_reaches_the_target_through_its_features_only(detach):
    """w * L_eagle3 alone (L_next taken out): with the features attached it moves the target's layers
    (below the last aux layer only, through them); detached, no target weight gets any gradient, which
    also shows the teacher is detached."""
    target = target64()
    target.model.requires_grad_(True)
    ids, mask, valid = padded(rows())
    model = Eagle3CotrainModel(random_head(target), target, AUX, weight=0.5, detach_features=detach)
    model(ids, mask, valid)
    (0.5 * model.parts[1]).backward()  # the head's part only
    q_proj = target.model.model.layers[0].self_attn.q_proj.weight
    grads = [p.grad for p in target.model.parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    if detach:
        assert not grads
    else:
        assert q_proj.grad is not None and float(q_proj.grad.abs().sum()) > 0
    # the teacher (final norm, LM head): never reached by the head's loss
    assert target.model.lm_head.weight.grad is None and target.model.model.norm.weight.grad is None
    assert float(model.head.fc.weight.grad.abs().sum()) > 0


# ---- through the trainer -----------------------------------------------------------------------------------
@needs_peft
def test_drift_of_untouched_adapters_is_zero_and_moves_after_updates(tiny_dir, source, data_dir, tmp_path):
    """LoRA's B starts at zero: before any update the co-trained target is the original (KL 0, argmax
    agreement 1, its loss the original's); three updates later the KL is positive."""
    trainer = Trainer(config(tiny_dir, source, data_dir, tmp_path / "zero", "eval.every=0"))
    drift = trainer.target_drift()
    assert drift["target_kl_to_original"] == pytest.approx(0, abs=1e-7)
    assert drift["target_argmax_agreement"] == 1.0
    assert drift["target_val_loss"] == pytest.approx(trainer.original_val_loss)
    for _ in range(3):  # (not fit: its end merges the adapters away)
        trainer.train_step()
    moved = trainer.target_drift()
    assert moved["target_kl_to_original"] > 1e-6 and 0 <= moved["target_argmax_agreement"] <= 1


@pytest.fixture(scope="module")
def lora_run(tiny_dir, source, data_dir, tmp_path_factory):
    if importlib.util.find_spec("peft") is None:
        pytest.skip("LoRA needs peft")
    out = tmp_path_factory.mktemp("e3co") / "run"
    train(config(tiny_dir, source, data_dir, out))
    return out


def test_a_lora_run_trains_both_and_writes_the_drift_report(lora_run, tiny_dir, source, data_dir, tmp_path):
    evals = read_metrics(lora_run, "eval")
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals:
        assert {"target_val_loss", "original_target_val_loss", "target_val_loss_drift"} <= set(r)
        assert r["target_val_loss_drift"] == pytest.approx(
            r["target_val_loss"] - r["original_target_val_loss"]
        )
        assert r["target_kl_to_original"] > 0 and 0 <= r["target_argmax_agreement"] <= 1
        assert len(r["accuracy_per_step"]) == 2
    assert evals[-1]["target_val_loss"] != evals[-1]["original_target_val_loss"]  # the target trained
    # the head trained: its weights differ from the same seed's fresh head (a new run folder: no resume)
    fresh = Trainer(config(tiny_dir, source, data_dir, tmp_path / "fresh")).head.state_dict()
    trained = load_eagle3(str(lora_run / "final")).state_dict()
    assert not torch.equal(trained["fc.weight"], fresh["fc.weight"].to(trained["fc.weight"]))
    assert torch.equal(trained["d2t"], fresh["d2t"])


def test_final_target_loads_with_the_heads_hash_and_the_original_is_refused(lora_run, tiny_dir, tiny_target):
    final = lora_run / "final"
    cotrained = Target.load(str(final / "target"), device="cpu")
    merged, original = cotrained.model.state_dict(), tiny_target.model.state_dict()
    assert not any(".lora_" in k for k in merged)  # adapters merged away
    assert torch.equal(merged["model.embed_tokens.weight"], original["model.embed_tokens.weight"])  # frozen
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[name], original[name])
    head = load_eagle3(str(final), cotrained)
    assert head.config.cotrained and head.config.target == str(final / "target")
    assert head.config.target_weights_hash == cotrained.weights_hash() != tiny_target.weights_hash()
    with pytest.raises(BadInputError, match="target_weights_hash") as err:
        load_eagle3(str(final), tiny_target)
    assert "--target" in str(err.value) and "#any-target" in str(err.value)
    told = load_eagle3(f"{final}#any-target", tiny_target)  # told: paired anyway
    assert torch.equal(told.fc.weight, head.fc.weight)


def test_the_shipped_target_is_the_one_the_last_drift_report_scored(
    lora_run, tiny_dir, tiny_target, source, data_dir, tmp_path
):
    """final/target (adapters merged) against the original on the same validation rows gives the last
    evaluation row's numbers (there: the adapted target against itself with adapters off), to float32
    rounding of the merge; the original against itself gives KL 0 and agreement 1 (the control)."""
    from draftsmith.train.objectives.cotrain import drift_sums

    batches = list(Trainer(config(tiny_dir, source, data_dir, tmp_path / "val")).val_batches())
    cotrained = Target.load(str(lora_run / "final" / "target"), device="cpu")
    ce, n, kl, agree = drift_sums(cotrained, tiny_target, batches).tolist()
    last = read_metrics(lora_run, "eval")[-1]
    assert ce / n == pytest.approx(last["target_val_loss"], rel=1e-4)
    assert kl / n == pytest.approx(last["target_kl_to_original"], rel=1e-3, abs=1e-6)
    assert agree / n == pytest.approx(last["target_argmax_agreement"], abs=1e-5)
    _, n0, kl0, agree0 = drift_sums(tiny_target, tiny_target, batches).tolist()
    assert kl0 == pytest.approx(0, abs=1e-6) and agree0 == n0


def test_speculative_decoding_with_the_cotrained_head_is_greedy_identical(lora_run):
    final = lora_run / "final"
    cotrained = Target.load(str(final / "target"), device="cpu")
    drafter = eagle3_drafter(load_eagle3(str(final), cotrained), cotrained, chain(2))
    prompts = [cotrained.encode("w1 w2 w3"), cotrained.encode("w7 w8"), cotrained.encode("w40 w41 w42 w43")]
    spec = generate_speculative(cotrained, drafter, prompts, SamplingParams(), 16)
    plain = generate_plain(cotrained, prompts, SamplingParams(), 16)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]  # zero mismatches


def test_generate_refuses_the_original_target_unless_told(lora_run, tiny_dir, capsys):
    final = lora_run / "final"
    argv = ["generate", "--prompt", "w1 w2 w3", "--max-new-tokens", "8", "--json"]
    assert main([*argv, "--target", str(tiny_dir), "--draft", f"eagle3:{final}"]) == 2
    assert "target_weights_hash" in capsys.readouterr().err
    assert main([*argv, "--target", str(tiny_dir), "--draft", f"eagle3:{final}#any-target"]) == 0
    told = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    original = Target.load(str(tiny_dir), device="cpu")
    plain = generate_plain(original, [original.encode("w1 w2 w3")], SamplingParams(), 8)[0]
    assert told["token_ids"] == plain.token_ids  # still lossless with the original target
    assert main([*argv, "--target", str(final / "target"), "--draft", f"eagle3:{final}"]) == 0
    assert main([*argv, "--target", str(tiny_dir), "--draft", f"eagle3:{final}#bogus"]) == 2
    capsys.readouterr()
    bench = ["bench", "--target", str(tiny_dir), "--draft", f"eagle3:{final}", "--num-prompts", "1"]
    assert main([*bench, "--out", str(final.parent / "bench"), "--no-plots", "--no-roofline"]) == 2
    assert "target_weights_hash" in capsys.readouterr().err  # bench refuses it too, before measuring


def test_export_checks_the_target_it_names(lora_run, tiny_dir, tmp_path, capsys):
    run = str(lora_run)
    base = ["export", run, "--format", "speculators"]
    assert main([*base, "--verifier", str(tiny_dir), "--out", str(tmp_path / "a")]) == 2
    assert "--any-target" in capsys.readouterr().err
    assert main([*base, "--verifier", str(tiny_dir), "--any-target", "--out", str(tmp_path / "b")]) == 0
    assert main([*base, "--out", str(tmp_path / "c")]) == 0  # default: the head's own co-trained target
    written = json.loads((tmp_path / "c" / "config.json").read_text())
    assert written["speculators_config"]["verifier"]["name_or_path"] == str(lora_run / "final" / "target")
    assert main(["export", run, "--format", "eagle3", "--out", str(tmp_path / "d")]) == 0
    assert (
        main(["export", run, "--format", "eagle3", "--target", str(tiny_dir), "--out", str(tmp_path / "e")])
        == 2
    )
    assert main(["export", run, "--out", str(tmp_path / "own")]) == 0  # draftsmith's layout: with target/
    assert (tmp_path / "own" / "target" / "config.json").is_file()
    assert main(["export", str(tmp_path / "own"), "--format", "eagle3", "--out", str(tmp_path / "f")]) == 0
    for folder in ("c", "d", "f"):  # the binding survives the engine layouts: the original is still refused
        original = Target.load(str(tiny_dir), device="cpu")
        with pytest.raises(BadInputError, match="target_weights_hash"):
            load_eagle3(str(tmp_path / folder), original)
        load_eagle3(str(tmp_path / folder), Target.load(str(lora_run / "final" / "target"), device="cpu"))


def test_full_cotraining_moves_the_weights_and_stays_lossless(
    tiny_dir, tiny_target, source, data_dir, tmp_path
):
    out = tmp_path / "full"
    train(config(tiny_dir, source, data_dir, out, "cotrain.method=full", "train.max_steps=2", "eval.every=0"))
    cotrained = Target.load(str(out / "final" / "target"), device="cpu")
    merged, original = cotrained.model.state_dict(), tiny_target.model.state_dict()
    assert torch.equal(merged["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
    assert not torch.equal(
        merged["model.layers.1.mlp.up_proj.weight"], original["model.layers.1.mlp.up_proj.weight"]
    )
    last = read_metrics(out, "eval")[-1]
    assert "target_val_loss_drift" in last and "target_kl_to_original" not in last  # no original kept (MTP's)
    head = load_eagle3(str(out / "final"), cotrained)
    prompts = [cotrained.encode("w1 w2 w3"), cotrained.encode("w9 w10")]
    spec = generate_speculative(
        cotrained, eagle3_drafter(head, cotrained, chain(2)), prompts, SamplingParams(), 12
    )
    assert [r.token_ids for r in spec] == [
        r.token_ids for r in generate_plain(cotrained, prompts, SamplingParams(), 12)
    ]


@needs_peft
def test_adapters_the_weights_hash_does_not_read_are_warned_about(
    tiny_dir, source, data_dir, tmp_path, caplog
):
    """artifacts.weights_hash reads a few tensors (final norm, q_proj of the first and last layers, the
    last down_proj): adapters on v_proj alone leave it unchanged, so the binding cannot tell the targets
    apart; the run says so instead of shipping a binding that silently accepts the original."""
    out = tmp_path / "v"
    extra = ["cotrain.lora_target_modules=v_proj", "train.max_steps=1", "eval.every=0"]
    with caplog.at_level("WARNING", logger="draftsmith"):
        train(config(tiny_dir, source, data_dir, out, *extra))
    assert "weights hash equals the original's" in caplog.text


@needs_peft
def test_resume_is_exact(tiny_dir, source, data_dir, tmp_path):
    """Stopped after step 2 and resumed by a new Trainer == an uninterrupted run, bitwise."""
    extra = ["checkpoint.every=1", "eval.every=0", "train.max_steps=4"]
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


def test_the_memory_preflight_counts_the_cotrained_targets_activations(tiny_dir, capsys):
    """Co-trained, the target's forward with gradients replaces the frozen one's no_grad forward, and the
    adapters' state is resident (the recipe's keys on the tiny target; no weights or data are read)."""
    recipe = [
        "--config",
        str(ROOT / "configs" / "eagle3-cotrain-lora-smollm2-135m.yaml"),
        f"target={tiny_dir}",
    ]
    argv = ["train", "--preflight", *recipe, "head.aux_layers=0,1,2", "head.draft_vocab_size=64"]
    assert main([*argv, "--world-size", "1"]) == 0
    cotrained = capsys.readouterr().out
    assert main([*argv, "cotrain.enabled=false", "--world-size", "1"]) == 0
    frozen = capsys.readouterr().out
    assert "target activations (co-training)" in cotrained and "LoRA optimizer (AdamW)" in cotrained
    assert "target forward (no_grad)" in frozen and "target forward (no_grad)" not in cotrained
    assert "co-training (lora)" in cotrained and "co-training" not in frozen


# ---- bad input ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad,says",
    [
        (["data.mode=offline"], "cotrain.enabled: got True, expected data.mode=online"),
        (["cotrain.method=full", "target=model.Q8_0.gguf"], "target: got 'model.Q8_0.gguf'"),
        (["cotrain.self_distill=true"], "cotrain.self_distill: got True"),
        (["head.cotrain_weight=0"], "head.cotrain_weight: got 0"),
        (["cotrain.eagle3_weight=0"], "head.cotrain_weight: got 0"),  # the old key, read as its new place
    ],
)
def test_bad_cotrain_configs_exit_2_naming_the_field(tiny_dir, source, data_dir, tmp_path, capsys, bad, says):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("{}\n")
    code = main(
        ["train", "--config", str(cfg_path), *overrides(tiny_dir, source, data_dir, tmp_path / "x"), *bad]
    )
    assert code == 2
    assert says in capsys.readouterr().err


def test_a_quantized_hf_target_cannot_cotrain_in_full(tiny_dir, source, data_dir, tmp_path, monkeypatch):
    """A GGUF is refused by name (above); a quantized HF checkpoint (quantization_config) when the target
    is made trainable, naming cotrain.method."""
    monkeypatch.setattr(
        "transformers.LlamaConfig.quantization_config", {"quant_method": "bitsandbytes"}, raising=False
    )
    with pytest.raises(BadInputError, match="cotrain.method"):
        Trainer(config(tiny_dir, source, data_dir, tmp_path / "q", "cotrain.method=full"))
