"""Two processes on CPU through `accelerate launch` with the shipped configs: DDP over gloo, FSDP2 over
gloo, DeepSpeed ZeRO-2 and ZeRO-3. Each must really run 2 processes, train the same head (up to float
reduction order), resume from its own checkpoint, and refuse a resume into another world size. Run:
pytest -m distributed (the first DeepSpeed run JIT-builds a small op, ~30 s: deepspeed_shm_comm)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_data import write_conversations

from draftsmith.runtime.cli.main import main
from draftsmith.train.loop.checkpoints import finished_checkpoints

pytestmark = pytest.mark.distributed
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"
LAUNCHERS = ["ddp-cpu", "fsdp-cpu", "deepspeed-zero2", "deepspeed-zero3"]


@pytest.fixture(scope="module")
def job(tiny_dir, tmp_path_factory):
    """A tiny train config (target, 40 conversations) shared by every launcher."""
    root = tmp_path_factory.mktemp("dist")
    source = write_conversations(root / "convs.jsonl")
    cfg = {
        "target": str(tiny_dir),
        "head": {"aux_layers": "0,1,2", "draft_vocab_size": 64},
        "data": {
            "source": str(source),
            "dir": str(root / "data"),
            "max_length": 64,
            "validation_fraction": 0.2,
        },
        "train": {"max_steps": 4, "batch_size": 2, "warmup_steps": 0, "ttt_steps": 3},
        "eval": {"every": 2, "max_rows": 4},
        "checkpoint": {"every": 2, "keep": 2},
        "log": {"every": 1, "progress": False},
    }
    path = root / "train.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return root, path


def launch(launcher: str, cfg: Path, *overrides: str) -> subprocess.CompletedProcess:
    if launcher.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", str(CONFIGS / f"{launcher}.yaml")]
    cmd += ["-m", "draftsmith.train", "--config", str(cfg), *overrides]
    # gloo can hang at exit (a torch deadlock): draftsmith.train leaves with os._exit; timeout = a guard
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=CONFIGS.parents[1])


@pytest.fixture(scope="module")
def finals(job):
    root, cfg = job
    outs = {}
    for launcher in LAUNCHERS:
        out = root / launcher
        done = launch(launcher, cfg, f"output_dir={out}")
        assert done.returncode == 0, done.stderr[-3000:]
        outs[launcher] = out
    return outs


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_two_processes_train_and_save_a_head(finals, launcher):
    out = finals[launcher]
    last = finished_checkpoints(out)[-1]
    assert json.loads((last / "trainer_state.json").read_text())["world_size"] == 2
    assert (last / "random_states_1.pkl").is_file()  # the second process saved its RNG: it existed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]
    assert (out / "final" / "model.safetensors").is_file()


def test_every_launcher_trains_the_same_head(finals):
    heads = {name: load_file(str(out / "final" / "model.safetensors")) for name, out in finals.items()}
    ref = heads["ddp-cpu"]
    for name, tensors in heads.items():
        for key, value in tensors.items():
            if value.is_floating_point():
                assert torch.allclose(value, ref[key], rtol=0, atol=1e-5), (name, key)
            else:
                assert torch.equal(value, ref[key]), (name, key)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_resume_continues_and_another_world_size_is_refused(job, finals, launcher, capsys):
    root, cfg = job
    out = finals[launcher]
    done = launch(launcher, cfg, f"output_dir={out}", "train.max_steps=6")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stderr and finished_checkpoints(out)[-1].name == "step-000006"
    code = main(["train", "--config", str(cfg), f"output_dir={out}", "train.max_steps=8"])  # 1 process
    assert code == 2
    assert "written by 2 processes" in capsys.readouterr().err


def test_mtp_lora_cotraining_on_two_processes_matches_one_launcher_to_another(job, tmp_path):
    """MTP co-training (LoRA): the target is part of the prepared model, so DDP and ZeRO-2 must both
    train it; the two launchers give the same modules and the same merged target; ZeRO-3 is refused."""
    pytest.importorskip("peft")
    root, cfg = job
    extra = ["head.type=mtp", "head.num_modules=2", "cotrain.enabled=true", "cotrain.lora_rank=4"]
    outs = {}
    for launcher in ["ddp-cpu", "deepspeed-zero2"]:
        outs[launcher] = tmp_path / launcher
        done = launch(launcher, cfg, f"output_dir={outs[launcher]}", *extra)
        assert done.returncode == 0, done.stderr[-3000:]
        evals = [json.loads(r) for r in (outs[launcher] / "metrics.jsonl").read_text().splitlines()]
        assert all("target_val_loss_drift" in r for r in evals if r["kind"] == "eval")
    for name in ["model.safetensors", "target/model.safetensors"]:
        a, b = (load_file(str(outs[k] / "final" / name)) for k in outs)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.allclose(a[key].float(), b[key].float(), rtol=0, atol=1e-5), (name, key)
    done = launch("deepspeed-zero3", cfg, f"output_dir={tmp_path / 'z3'}", *extra)
    # each rank exits 2 with the message; the launcher itself then reports a failure (1)
    assert done.returncode != 0 and "cotrain.enabled: got 'true under ZeRO-3/FSDP'" in done.stderr
