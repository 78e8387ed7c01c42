"""The EAGLE-3 trainer on a tiny random target: artifacts, exact resume in a new process,
the numerics guard, refusals (exit code 2), the sample order, the LR schedule, trackers."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file
from train_data import online_and_offline_losses, read_metrics, run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError
from draftsmith.train.config import load_train_config
from draftsmith.train.loop import trainer as trainer_module
from draftsmith.train.loop.checkpoints import check_resume, finished_checkpoints
from draftsmith.train.loop.data_steps import SampleOrder
from draftsmith.train.loop.trainer import NonFiniteError, Trainer, lr_lambda, train
from draftsmith.train.objectives import heads as heads_module


def overrides(tiny_dir, source, data_dir, out, *extra):
    return run_overrides(tiny_dir, source, data_dir, out, "train.ttt_steps=3", *extra)


def config(tiny_dir, source, data_dir, out, *extra):
    return load_train_config(None, overrides(tiny_dir, source, data_dir, out, *extra))


metrics = read_metrics


def test_run_writes_metrics_checkpoints_and_a_loadable_head(
    tiny_dir, tiny_target, source, data_dir, tmp_path
):
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.core.speculative import generate_speculative
    from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
    from draftsmith.runtime.heads.eagle3 import load_head
    from draftsmith.runtime.verify.sampling import SamplingParams
    from draftsmith.runtime.verify.tree import chain

    out = tmp_path / "run"
    last = train(config(tiny_dir, source, data_dir, out, "checkpoint.keep=2"))
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:
        assert {"loss", "accuracy_per_step", "simulated_tau", "lr", "grad_norm", "tokens_per_s"} <= set(r)
        assert len(r["accuracy_per_step"]) == 3 and r["simulated_tau"] >= 1.0
    assert [r["step"] for r in metrics(out, "eval")] == [3, 6] and last["step"] == 6
    evals = metrics(out, "eval")
    assert evals[1]["loss"] < evals[0]["loss"]  # it learns: the same validation rows score better
    assert [p.name for p in finished_checkpoints(out)] == ["step-000004", "step-000006"]  # rotated
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["max_steps"] == 6

    head = load_head(out / "final", tiny_target)  # strict load, checked against the target
    trained = load_file(str(out / "checkpoints" / "step-000006" / "model.safetensors"))
    assert torch.equal(head.fc.weight, trained["head.fc.weight"])
    prompts = [tiny_target.encode("w1 w2 w3"), tiny_target.encode("w7 w8")]
    drafter = eagle3_drafter(head, tiny_target, chain(3))
    spec = generate_speculative(tiny_target, drafter, prompts, SamplingParams(), 12)
    plain = generate_plain(tiny_target, prompts, SamplingParams(), 12)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]  # zero mismatches


def test_two_layer_norm_output_head_trains_and_drafts(tiny_dir, tiny_target, source, data_dir, tmp_path):
    """head.num_layers=2 head.norm_output=true: the run learns, final/ loads as that head, and it drafts
    with zero greedy mismatches."""
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.core.speculative import generate_speculative
    from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
    from draftsmith.runtime.heads.eagle3 import load_head
    from draftsmith.runtime.verify.sampling import SamplingParams
    from draftsmith.runtime.verify.tree import parse_tree_spec

    out = tmp_path / "run"
    train(config(tiny_dir, source, data_dir, out, "head.num_layers=2", "head.norm_output=true"))
    evals = metrics(out, "eval")
    assert evals[-1]["loss"] < evals[0]["loss"]
    head = load_head(out / "final", tiny_target)
    assert (head.config.num_layers, head.config.norm_output) == (2, True)
    prompts = [tiny_target.encode("w1 w2 w3"), tiny_target.encode("w7 w8")]
    drafter = eagle3_drafter(head, tiny_target, parse_tree_spec("dynamic:depth=3,topk=2,tokens=6"))
    spec = generate_speculative(tiny_target, drafter, prompts, SamplingParams(), 12, batch_size=2)
    plain = generate_plain(tiny_target, prompts, SamplingParams(), 12)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]


def _run_to_end(cfg_path, *extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "draftsmith.train", "--config", str(cfg_path), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("accum,stop", [(2, 3), (1, "epoch_end")], ids=["mid-epoch,accum2", "epoch-end"])
def test_resume_in_a_new_process_is_exact(tiny_dir, source, data_dir, tmp_path, monkeypatch, accum, stop):
    """Interrupted after a checkpoint, resumed by a new process == one uninterrupted run, bitwise."""
    extra = [f"train.grad_accum={accum}", "checkpoint.every=1", "checkpoint.keep=20", "eval.every=0"]
    probe = Trainer(config(tiny_dir, source, data_dir, tmp_path / "probe", *extra))
    per_epoch = len(probe.train_rows) / (2 * accum)
    stop = int(per_epoch) if stop == "epoch_end" else stop
    if stop == "epoch_end":
        assert per_epoch == int(per_epoch)
    steps = stop + 3
    extra.append(f"train.max_steps={steps}")

    straight = tmp_path / "straight"
    train(config(tiny_dir, source, data_dir, straight, *extra))

    resumed = tmp_path / "resumed"
    real_save = trainer_module.save_checkpoint

    class Killed(Exception):
        pass

    def save_then_die(acc, out, state, keep):
        real_save(acc, out, state, keep)
        if state["step"] == stop:
            raise Killed

    monkeypatch.setattr(trainer_module, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        train(config(tiny_dir, source, data_dir, resumed, *extra))
    assert finished_checkpoints(resumed)[-1].name == f"step-{stop:06d}"
    cfg_path = tmp_path / "resume.yaml"
    cfg_path.write_text((resumed / "config.yaml").read_text())
    done = _run_to_end(cfg_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resumed from {finished_checkpoints(resumed)[stop - 1]}" in done.stderr

    a, b = straight / "checkpoints" / f"step-{steps:06d}", resumed / "checkpoints" / f"step-{steps:06d}"
    for name in ("model.safetensors",):
        ta, tb = load_file(str(a / name)), load_file(str(b / name))
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    opt_a = torch.load(a / "optimizer.bin", weights_only=True)["state"]
    opt_b = torch.load(b / "optimizer.bin", weights_only=True)["state"]
    assert opt_a.keys() == opt_b.keys()
    for k in opt_a:
        assert all(torch.equal(opt_a[k][s], opt_b[k][s]) for s in opt_a[k])
    rng_a = torch.load(a / "random_states_0.pkl", weights_only=False)
    rng_b = torch.load(b / "random_states_0.pkl", weights_only=False)
    assert torch.equal(rng_a["torch_manual_seed"], rng_b["torch_manual_seed"])
    assert rng_a["random_state"] == rng_b["random_state"]
    fields = ("step", "loss", "lr", "grad_norm", "accuracy_per_step")
    assert [{f: r[f] for f in fields} for r in metrics(straight)] == [
        {f: r[f] for f in fields} for r in metrics(resumed)
    ]
    fa, fb = (
        load_file(str(straight / "final" / "model.safetensors")),
        load_file(str(resumed / "final" / "model.safetensors")),
    )
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


@pytest.mark.parametrize("precision", ["no", "bf16"])  # bf16: where DeepSpeed skips silently (A14)
def test_nan_batch_stops_the_run_and_saves_nothing_after(
    tiny_dir, source, data_dir, tmp_path, monkeypatch, precision
):
    real = heads_module.make_batch
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        batch = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:  # the third micro-batch = step 3
            batch["features"][0, 1, 0] = float("nan")
        return batch

    monkeypatch.setattr(heads_module, "make_batch", poisoned)
    out = tmp_path / "nan"
    with pytest.raises(NonFiniteError, match=r"non-finite loss at step 3, micro-batch 0, rank 0, rows \['"):
        train(
            config(
                tiny_dir,
                source,
                data_dir,
                out,
                "checkpoint.every=1",
                "checkpoint.keep=10",
                f"train.mixed_precision={precision}",
            )
        )
    assert [p.name for p in finished_checkpoints(out)] == ["step-000001", "step-000002"]
    assert not (out / "final").exists()


def test_inf_gradient_stops_the_run_and_checkpoints_stay_finite(tiny_dir, source, data_dir, tmp_path):
    out = tmp_path / "inf"
    trainer = Trainer(config(tiny_dir, source, data_dir, out, "checkpoint.every=1", "checkpoint.keep=10"))
    trainer.head.fc.weight.register_hook(lambda g: g * float("inf") if trainer.step == 2 else g)
    with pytest.raises(NonFiniteError, match="non-finite gradient norm at step 3"):
        trainer.fit()
    assert [p.name for p in finished_checkpoints(out)] == ["step-000001", "step-000002"]
    for ckpt in finished_checkpoints(out):
        assert all(torch.isfinite(t).all() for t in load_file(str(ckpt / "model.safetensors")).values())


def test_resume_refuses_other_data_unless_allowed(tiny_dir, source, data_dir, tmp_path):
    out = tmp_path / "run"
    train(config(tiny_dir, source, data_dir, out, "train.max_steps=2"))
    other = tmp_path / "other-data"
    with pytest.raises(BadInputError, match="resume: got 'a checkpoint trained on data"):
        Trainer(config(tiny_dir, source, other, out, "train.max_steps=3", "data.max_samples=30"))
    trainer = Trainer(
        config(
            tiny_dir,
            source,
            other,
            out,
            "train.max_steps=3",
            "data.max_samples=30",
            "train.allow_data_change=true",
        )
    )
    assert trainer.step == 2


def test_resume_refuses_another_world_size():
    cfg = load_train_config(None, [])
    state = {"world_size": 2, "data_hash": "abc", "config_hash": "x"}
    with pytest.raises(BadInputError, match="written by 2 processes"):
        check_resume(state, 1, "abc", cfg)
    cfg.train.allow_world_size_change = True
    check_resume(state, 1, "abc", cfg)


def test_data_made_for_another_target_is_refused(tiny_dir, source, tmp_path):
    data = tmp_path / "data"
    cfg = config(tiny_dir, source, data, tmp_path / "a", "train.max_steps=1")
    train(cfg)
    record_path = data / "prepared" / "draftsmith_data.json"
    record = json.loads(record_path.read_text())
    record["inputs"]["fingerprint"]["tokenizer_hash"] = "0" * 16
    record_path.write_text(json.dumps(record))
    with pytest.raises(BadInputError, match="data.dir: got 'data made with tokenizer_hash"):
        Trainer(config(tiny_dir, source, data, tmp_path / "b"))


@pytest.mark.parametrize(
    "bad,field",
    [
        ("train.no_such_key=1", "train.no_such_key"),
        ("head.draft_vocab_size=0", "head.draft_vocab_size"),
        ("head.draft_vocab_size=1000", "head.draft_vocab_size: got 1000, expected an integer in [1, 128]"),
        ("train.lr=-1", "train.lr"),
        ("data.mode=sideways", "data.mode"),
        ("head.aux_layers=0,1,9", "head.aux_layers: got [0, 1, 9]"),
        ("head.num_layers=0", "head.num_layers"),
    ],
)
def test_bad_config_values_exit_2_naming_the_field(tiny_dir, source, data_dir, tmp_path, capsys, bad, field):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("{}\n")
    code = main(
        ["train", "--config", str(cfg_path), *overrides(tiny_dir, source, data_dir, tmp_path / "x"), bad]
    )
    assert code == 2
    assert field in capsys.readouterr().err


def test_sample_order_covers_each_epoch_once_across_ranks():
    n, batch, accum, world = 12, 2, 1, 2
    orders = [SampleOrder(n, 7, batch, accum, world, rank) for rank in range(world)]
    epochs = [
        [row for step in range(3 * e, 3 * e + 3) for o in orders for row in o.rows(step, 0)] for e in (0, 1)
    ]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(n))  # each epoch: every row once
    assert epochs[0] != epochs[1]  # reshuffled per epoch
    assert SampleOrder(n, 7, batch, accum, world, 1).rows(3, 0) == orders[1].rows(3, 0)  # a pure function


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    f = lr_lambda(warmup=4, total=44, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0 and f(44) == pytest.approx(0.1) and f(24) == pytest.approx(0.55)
    assert all(f(s) >= f(s + 1) for s in range(4, 50))
    short = lr_lambda(warmup=50, total=5, min_ratio=0.0)  # a smoke run: warmup cut to a tenth (0 here)
    assert short(0) == 1.0 and short(5) == pytest.approx(0.0)


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_trackers_write_the_runs_metrics_to_its_folder(
    tiny_dir, source, data_dir, tmp_path, monkeypatch, tracker
):
    """Both trackers are installed by `make test` (the dev extra): wandb runs offline without a key, and
    each run's tracker files land in its own folder, holding the losses metrics.jsonl holds."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    for name in ("first", "second"):  # a second run in one process must not write into the first's
        out = tmp_path / name
        train(config(tiny_dir, source, data_dir, out, "train.max_steps=2", f"log.tracker={tracker}"))
        expected = {r["step"]: r["loss"] for r in metrics(out)}
        assert sorted(expected) == [1, 2]
        assert tracked_losses(tracker, out) == pytest.approx(expected, rel=1e-6)  # tracker files: float32
    if tracker == "wandb":
        assert os.environ["WANDB_MODE"] == "offline"
        assert len(list((tmp_path / "first" / "wandb").glob("offline-run-*"))) == 1


def tracked_losses(tracker: str, out) -> dict:
    """{step: train loss} as the tracker stored it in the run folder."""
    if tracker == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        losses = {}
        for events in out.rglob("events.out.tfevents.*"):  # Accelerate may open a writer per folder
            acc = EventAccumulator(str(events))
            acc.Reload()
            if "train/loss" in acc.Tags()["scalars"]:
                losses.update({e.step: e.value for e in acc.Scalars("train/loss")})
        return losses
    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 30  # wandb's service may still be writing the file: wait for its exit
    while (
        "exit" not in (kinds := [kind for kind, _ in wandb_records(run_file)]) and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert "exit" in kinds, f"{run_file} holds no exit record: {kinds}"
    rows = [record.history.item for kind, record in wandb_records(run_file) if kind == "history"]
    rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r} for r in rows]
    return {row["train/step"]: row["train/loss"] for row in rows if "train/loss" in row}


def wandb_records(path):
    """(kind, record) of an offline wandb run file: wandb's record log (a 7-byte ':W&B' header, then 32 KiB
    blocks of records, each a 7-byte header `crc32 u32, length u16, kind u8` and a chunk; kinds 1 full,
    2 first, 3 middle, 4 last) whose records are `wandb_internal_pb2.Record` protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, chunks = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        chunks = chunk if kind in (1, 2) else chunks + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            yield record.WhichOneof("record_type"), record


def test_offline_mode_trains_exactly_like_online(tiny_dir, source, data_dir, tmp_path):
    """Offline reads `data capture` shards (float32 here) instead of running the target in the step."""
    online, offline = online_and_offline_losses(
        lambda out, *extra: config(tiny_dir, source, data_dir, out, *extra), train, tmp_path
    )
    assert (data_dir / "capture-0-1-2-float32" / "draftsmith_data.json").is_file()
    assert online == offline
