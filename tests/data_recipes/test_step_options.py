"""A bad numeric option of `data regenerate | capture` exits 2 naming it before an engine is chosen or
started, whatever the engine (data_recipes/step_options.py): `--engine auto` on a CPU-only machine with a
vLLM Python picks vLLM for regenerate, which never reads --batch-size, and draftsmith's engine never reads
--tensor-parallel-size or --max-num-seqs, so such values used to pass on one engine. The vLLM Python here
is a fake that records being started (even the find_spec probe of engine_choice.py) and answers "has vllm".

    OMP_NUM_THREADS=1 python -m pytest -q tests/data_recipes/test_step_options.py
"""

import pytest
import torch

from draftsmith.runtime.cli.main import main

REGENERATE_CASES = [
    ("--batch-size", "0", "--batch-size"),
    ("--batch-size", "-3", "--batch-size"),
    ("--max-new-tokens", "0", "--max-new-tokens"),
    ("--num-shards", "0", "--num-shards"),
    ("--shard-index", "1", "--shard-index"),  # of --num-shards 1
    ("--tensor-parallel-size", "0", "--tensor-parallel-size"),
    ("--max-num-seqs", "0", "--max-num-seqs"),
    ("--tp-size", "0", "--tp-size"),
    ("--process-group-timeout-s", "0", "--process-group-timeout-s"),
    ("--top-k", "-1", "top_k"),  # SamplingParams' field name, as both engines name it
]
CAPTURE_CASES = [
    ("--shard-tokens", "0", "--shard-tokens"),
    ("--num-shards", "-1", "--num-shards"),
    ("--tensor-parallel-size", "0", "--tensor-parallel-size"),
    ("--max-num-seqs", "-2", "--max-num-seqs"),
]


@pytest.fixture
def vllm_python(tmp_path, monkeypatch):
    """A CPU-only machine (where auto picks vLLM for regenerate) and a fake vLLM Python: (path, marker)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    marker = tmp_path / "started"
    python = tmp_path / "vllm-env" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    python.chmod(0o755)
    return python, marker


def run(step, tiny_dir, tmp_path, python, *extra):
    argv = ["data", step, "--target", str(tiny_dir), "--device", "cpu", "--vllm-python", str(python)]
    argv += ["--data", str(tmp_path / "no-data"), "--out", str(tmp_path / "out"), *extra]
    return main(argv)


@pytest.mark.parametrize(
    "step, flag, value, field",
    [("regenerate", *c) for c in REGENERATE_CASES] + [("capture", *c) for c in CAPTURE_CASES],
)
@pytest.mark.parametrize("engine", ["auto", "vllm", "draftsmith"])
def test_a_bad_number_exits_2_before_any_engine(
    step, flag, value, field, engine, tiny_dir, tmp_path, vllm_python, capsys
):
    python, marker = vllm_python
    assert run(step, tiny_dir, tmp_path, python, "--engine", engine, flag, value) == 2
    err = capsys.readouterr().err
    assert field in err and repr(int(value)) in err  # the flag and the value it got
    assert "no-data" not in err  # refused for the number, not for the missing --data
    assert not marker.exists()  # no interpreter started: not even engine_choice's probe


def test_good_numbers_pass_the_check_and_auto_would_start_vllm(tiny_dir, tmp_path, vllm_python, capsys):
    """The control: the same command with valid numbers gets past the check to the engine choice (the probe
    runs the fake vLLM Python) and on to the step, which refuses the missing --data."""
    python, marker = vllm_python
    assert run("regenerate", tiny_dir, tmp_path, python, "--batch-size", "1", "--max-num-seqs", "1") == 2
    assert "no-data" in capsys.readouterr().err
    assert marker.exists()
