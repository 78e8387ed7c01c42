"""Data steps in a multi-process run: `train.process_group_timeout_s` reaches the process group on GPU
(NCCL) and CPU (gloo) alike; a wait that runs out is a refusal naming the key and the `draftsmith data`
commands to run first, and those commands make exactly the data a run then reuses; each rank captures its
part of an offline capture. The `distributed` tests launch 2 gloo processes: rank 0 sleeping in the data
steps past a 3 s timeout ends the job with that refusal in seconds (never a hang), and an offline run
leaves one capture part per rank, equal (torch.equal) to an unsharded capture.
Run: pytest tests/train/test_process_group.py (and -m distributed for the two launches)."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from train_data import tiny_train_overrides

from draftsmith.data_recipes import capture as cap
from draftsmith.data_recipes.capture import CaptureFolder, capture
from draftsmith.data_recipes.capture_reader import TOKEN_TENSORS
from draftsmith.data_recipes.parts import part_name
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.train.config import load_train_config
from draftsmith.train.loop import accelerator_setup
from draftsmith.train.loop.data_steps import capture_dir, data_commands, ensure_data
from draftsmith.train.loop.process_group import TIMEOUT_KEY, rank0_first, wait_for_ranks

AUX = (0, 1, 2)
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"


def offline_config(tiny_dir, source, data_dir, out, *extra):
    overrides = [f"target={tiny_dir}", f"output_dir={out}", *tiny_train_overrides(source, data_dir)]
    overrides += ["data.mode=offline", "data.storage_dtype=float32", *extra]
    return load_train_config(None, overrides)


class RecordingAccelerator:
    """Stands in for accelerate.Accelerator: records the keyword arguments build_accelerator passes."""

    seen: dict = {}

    def __init__(self, **kwargs):
        RecordingAccelerator.seen = kwargs
        self.state = SimpleNamespace(deepspeed_plugin=None)


@pytest.mark.parametrize("cuda", [True, False], ids=["gpu", "cpu"])
def test_build_accelerator_gives_the_process_group_the_configured_timeout(cuda, monkeypatch, tmp_path):
    import accelerate

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    monkeypatch.setattr(accelerator_setup.torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(accelerate, "Accelerator", RecordingAccelerator)
    cfg = load_train_config(None, [f"output_dir={tmp_path}", "train.process_group_timeout_s=77"])
    accelerator_setup.build_accelerator(cfg, None)
    [handler] = RecordingAccelerator.seen["kwargs_handlers"]
    # What Accelerate hands init_process_group: only the values that differ from its defaults.
    expected = {"timeout": timedelta(seconds=77)} | ({} if cuda else {"backend": "gloo"})
    assert handler.to_kwargs() == expected  # on a GPU the backend stays Accelerate's choice (NCCL)


def test_the_timeout_is_generous_by_default_and_must_be_positive(tmp_path):
    assert load_train_config(None, [f"output_dir={tmp_path}"]).train.process_group_timeout_s >= 1800
    with pytest.raises(BadInputError, match=TIMEOUT_KEY):
        load_train_config(None, [f"output_dir={tmp_path}", "train.process_group_timeout_s=0"])


class FakeAccelerator:
    """One rank of a multi-process run, in this process: barriers are recorded, or raise `error`."""

    def __init__(self, rank: int, world: int, error: Exception | None = None, log: list | None = None):
        self.process_index, self.num_processes, self.error = rank, world, error
        self.is_main_process = rank == 0
        self.log = log if log is not None else []

    def wait_for_everyone(self):
        self.log.append("wait")
        if self.error is not None:
            raise self.error


def test_a_wait_that_times_out_is_a_refusal_naming_the_key_and_the_commands(tmp_path):
    cfg = load_train_config(None, [f"output_dir={tmp_path}", "train.process_group_timeout_s=3"])
    gloo = RuntimeError(
        "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"
    )
    commands = ["draftsmith data prepare --source x --out y", "draftsmith data vocab --data y"]
    with pytest.raises(BadInputError) as err:
        wait_for_ranks(FakeAccelerator(1, 2, gloo), cfg, "the data steps on rank 0", commands)
    assert err.value.field == TIMEOUT_KEY and err.value.got == 3
    assert "rank 1 waited 3 s: " in err.value.hint and "Timed out waiting 3000ms" in err.value.hint
    assert all(f"`{c}`" in err.value.hint for c in commands)
    # Another failure (a peer that died) is not called a timeout.
    with pytest.raises(DraftsmithError, match="another rank probably failed first") as err:
        wait_for_ranks(FakeAccelerator(1, 2, RuntimeError("Connection closed by peer")), cfg, "x", commands)
    assert not isinstance(err.value, BadInputError)
    wait_for_ranks(None, cfg, "x", commands)  # one process: nothing to wait for


def test_rank_0_runs_first_and_the_others_after_it(tmp_path):
    cfg = load_train_config(None, [f"output_dir={tmp_path}"])
    for rank, expected in ((0, ["body", "wait"]), (1, ["wait", "body"])):
        log = []
        with rank0_first(FakeAccelerator(rank, 2, log=log), cfg, "the data steps", []):
            log.append("body")
        assert log == expected, rank


def test_the_printed_commands_make_the_data_a_run_reuses(
    tiny_dir, tiny_target, source, tmp_path, monkeypatch, capsys
):
    """The commands a refusal prints, run in order, leave every data step done: ensure_data on rank 1 of
    2 then prepares, counts and captures nothing. With part 1 of the capture left out, rank 1 captures
    exactly the rows of part 1 (its shard), part 0 untouched."""
    cfg = offline_config(tiny_dir, source, tmp_path / "data", tmp_path / "run")
    commands = data_commands(cfg, tiny_target, AUX, world=2)
    assert [shlex.split(c)[2] for c in commands] == ["prepare", "vocab", "capture", "capture"]
    for command in commands[:3]:  # prepare, vocab, capture part 0
        assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    captured = capture_dir(tmp_path / "data", AUX, "float32")
    assert sorted(p.name for p in captured.iterdir()) == [part_name(0, 2)]

    from draftsmith.data_recipes import prepare as prep
    from draftsmith.data_recipes import vocab

    def no_work(*args, **kwargs):
        raise AssertionError("a data step ran again")

    monkeypatch.setattr(prep, "write_splits", no_work)
    monkeypatch.setattr(vocab, "count_supervised", no_work)
    rows, real = [], cap.capture_row
    monkeypatch.setattr(
        cap, "capture_row", lambda target, ids, layers: rows.append(ids) or real(target, ids, layers)
    )
    log = []
    paths = ensure_data(cfg, tiny_target, AUX, progress=False, acc=FakeAccelerator(1, 2, log=log))
    assert log == ["wait", "wait", "wait"]  # rank 0's data steps, the ranks' look at the capture, every part
    part1 = CaptureFolder(captured / part_name(1, 2))
    assert [r["input_ids"].tolist() for r in part1] == rows and len(rows) > 0
    whole = tmp_path / "whole"
    capture(
        tiny_target,
        paths.prepared,
        whole,
        aux_layers=AUX,
        storage_dtype="float32",
        split="all",
        progress=False,
    )
    assert_same_capture(CaptureFolder(paths.capture), CaptureFolder(whole))
    # Now every part exists: rank 0 finds all done too, the last command included.
    rows.clear()
    assert main(shlex.split(commands[3])[1:]) == 0 and rows == []
    ensure_data(cfg, tiny_target, AUX, progress=False, acc=FakeAccelerator(0, 2))
    assert rows == []


def assert_same_capture(a: CaptureFolder, b: CaptureFolder) -> None:
    assert len(a) == len(b) > 0
    for k in range(len(a)):
        for name in TOKEN_TENSORS:
            assert torch.equal(a[k][name], b[k][name]), (k, name)
        assert (a[k]["row_index"], a[k]["id"]) == (b[k]["row_index"], b[k]["id"])


# ---- two processes --------------------------------------------------------------------------------------
SLOW_RANK_0 = """
import os, sys, time
from draftsmith.data_recipes import prepare

real = prepare.prepare


def slow_on_rank_0(*args, **kwargs):
    if os.environ.get("RANK") == "0":
        time.sleep(float(os.environ["RANK_0_SLEEP_S"]))
    return real(*args, **kwargs)


prepare.prepare = slow_on_rank_0
from draftsmith.runtime.cli.main import main

code = main(["train", *sys.argv[1:]])
sys.stdout.flush(), sys.stderr.flush()
os._exit(code)
"""


def launch(entry: list[str], tiny_dir, folder: Path, overrides, env=None) -> subprocess.CompletedProcess:
    """`accelerate launch` of 2 gloo processes running `entry` (a script or -m draftsmith.train)."""
    config = folder / "train.json"
    config.write_text(json.dumps({"target": str(tiny_dir)}))  # JSON is YAML; the rest are overrides
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1", **(env or {})}
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", str(CONFIGS / "ddp-cpu.yaml"), *entry]
    cmd += ["--config", str(config), *overrides]
    # the timeout guards the test itself: a hang fails it instead of stalling the suite
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=CONFIGS.parents[1])


@pytest.mark.distributed
def test_a_data_step_longer_than_the_timeout_ends_the_job_with_a_refusal(tiny_dir, source, tmp_path):
    script = tmp_path / "slow_rank_0.py"
    script.write_text(SLOW_RANK_0)
    overrides = [f"output_dir={tmp_path / 'run'}", *tiny_train_overrides(source, tmp_path / "data")]
    overrides += ["train.process_group_timeout_s=3", "train.max_steps=2"]
    started = time.monotonic()
    done = launch([str(script)], tiny_dir, tmp_path, overrides, env={"RANK_0_SLEEP_S": "240"})
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    assert elapsed < 120, elapsed  # rank 1 gave up after 3 s; the launcher then stopped rank 0's sleep
    assert (
        f"{TIMEOUT_KEY}: got 3, expected more seconds than the wait for the data steps on rank 0"
        in done.stderr
    )
    assert "rank 1 waited 3 s" in done.stderr and "`draftsmith data prepare --target" in done.stderr


@pytest.mark.distributed
def test_an_offline_run_on_two_processes_captures_one_part_per_rank(tiny_dir, tiny_target, source, tmp_path):
    data, out = tmp_path / "data", tmp_path / "run"
    cfg = offline_config(tiny_dir, source, data, out)
    overrides = [f"output_dir={out}", *tiny_train_overrides(source, data), "data.mode=offline"]
    overrides += ["data.storage_dtype=float32", "train.max_steps=2", "train.batch_size=2", "eval.max_rows=4"]
    done = launch(["-m", "draftsmith.train"], tiny_dir, tmp_path, overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "final" / "model.safetensors").is_file()
    captured = capture_dir(data, AUX, "float32")
    assert sorted(p.name for p in captured.iterdir() if p.is_dir()) == [part_name(0, 2), part_name(1, 2)]
    assert cfg.data.dir == str(data)
    whole = tmp_path / "whole"
    capture(
        tiny_target,
        data / "prepared",
        whole,
        aux_layers=AUX,
        storage_dtype="float32",
        split="all",
        progress=False,
    )
    assert_same_capture(CaptureFolder(captured), CaptureFolder(whole))
