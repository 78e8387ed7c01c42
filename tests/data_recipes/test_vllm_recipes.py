"""The vLLM data recipes as far as a CPU can check them: scripts/vllm_data_parallel.sh (one vLLM engine per
GPU or tensor-parallel group, each writing one part of --out) prints the right devices, shard indices and
part folders under --dry-run, refuses what it sets itself, and, run for real with a stand-in CLI on
draftsmith's engine, leaves parts that read as one folder; scripts/vllm_env_gpu.sh --dry-run pins the
tested vLLM range. Neither has run on a GPU.
Run: `python -m pytest -q tests/data_recipes/test_vllm_recipes.py`."""

import json
import os
import subprocess
import sys

import pytest

from draftsmith.data_recipes import vllm_engine
from draftsmith.data_recipes.capture_reader import CaptureFolder
from draftsmith.data_recipes.prepare import prepare

CONVERSATIONS = [
    [{"role": "user", "content": "w1 w2 w3"}, {"role": "assistant", "content": "w4 w5"}],
    [{"role": "user", "content": "w7"}, {"role": "assistant", "content": "w8 w9"}],
    [{"role": "user", "content": "w20 w21 w22 w23"}, {"role": "assistant", "content": "w24"}],
]


@pytest.fixture
def prepared(tmp_path, tiny_target):
    source = tmp_path / "conv.jsonl"
    source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    out = tmp_path / "prepared"
    prepare(tiny_target, str(source), out, max_length=256, validation_fraction=0.0, progress=False)
    return out


def dry_run(script: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", f"scripts/{script}", *argv], capture_output=True, text=True, timeout=60)


def dry_run_parts(*argv: str) -> list[tuple[str, list[str], str]]:
    """(CUDA_VISIBLE_DEVICES, the command's words, the part folder) of each line of a --dry-run."""
    import shlex

    done = dry_run("vllm_data_parallel.sh", *argv)
    assert done.returncode == 0, done.stderr
    parts = []
    for line in done.stdout.splitlines():
        command, part = line.split("  # -> ")
        env, *words = shlex.split(command)
        parts.append((env.removeprefix("CUDA_VISIBLE_DEVICES="), words, part))
    return parts


@pytest.mark.parametrize(
    "gpus, tp, devices",
    [("4", "1", ["0", "1", "2", "3"]), ("4", "2", ["0,1", "2,3"]), ("0,2,5,7", "2", ["0,2", "5,7"])],
)
def test_the_data_parallel_recipe_gives_each_part_its_gpus(gpus, tp, devices):
    from draftsmith.data_recipes.parts import part_name

    step = ["data", "capture", "--target", "my target", "--data", "d", "--out", "o", "--max-num-seqs", "64"]
    parts = dry_run_parts("--gpus", gpus, "--tp", tp, "--dry-run", "--", *step)
    n = len(devices)
    assert [env for env, _, _ in parts] == devices
    for k, (_, words, part) in enumerate(parts):
        assert words[: len(step) + 1] == [".venv/bin/draftsmith", *step]
        added = words[len(step) + 1 :]
        assert added == ["--engine", "vllm", "--tensor-parallel-size", tp, "--num-shards", str(n),
                         "--shard-index", str(k)]  # fmt: skip
        assert part == f"o/{part_name(k, n)}"  # the folder parts.py reads back as one


@pytest.mark.parametrize(
    "argv, why",
    [
        (
            ["--gpus", "3", "--tp", "2", "--", "data", "capture", "--out", "o"],
            "--tp 2 must divide the 3 GPUs",
        ),
        (
            ["--gpus", "2", "--", "data", "capture", "--out", "o", "--shard-index", "1"],
            "--shard-index is set",
        ),
        (["--gpus", "2", "--", "data", "capture", "--out", "o", "--engine=draftsmith"], "--engine is set"),
        (["--gpus", "2", "--", "data", "prepare", "--out", "o"], "expected capture or regenerate"),
        (["--gpus", "2", "--", "data", "capture", "--data", "d"], "the step needs --out"),
        (["--gpus", "0", "--", "data", "capture", "--out", "o"], "expected at least 1 GPU"),
        (["--gpus", "a,b", "--", "data", "capture", "--out", "o"], "a count or a comma list"),
    ],
)
def test_the_data_parallel_recipe_refuses_what_it_sets_or_cannot_split(argv, why):
    done = dry_run("vllm_data_parallel.sh", "--dry-run", *argv)
    assert done.returncode == 2 and why in done.stderr and not done.stdout, done.stderr


def test_the_data_parallel_recipe_writes_parts_that_read_as_one(tiny_dir, prepared, tmp_path):
    """The real launch on CPU: a stand-in CLI runs each part on draftsmith's engine (there is no vLLM here)
    with the GPUs it was given; the script waits for both and reads OUT back as one folder."""
    calls = tmp_path / "calls.txt"
    cli = tmp_path / "draftsmith"
    cli.write_text(f"""#!{sys.executable}
import os, sys
argv = sys.argv[1:]
argv[argv.index("--engine") + 1] = "draftsmith"  # the step as vLLM would run it, on draftsmith's engine
del argv[argv.index("--tensor-parallel-size") : argv.index("--tensor-parallel-size") + 2]
with open({str(calls)!r}, "a") as f:
    f.write(os.environ["CUDA_VISIBLE_DEVICES"] + " " + argv[argv.index("--shard-index") + 1] + "\\n")
from draftsmith.runtime.cli.main import main
sys.exit(main(argv))
""")
    cli.chmod(0o755)
    out = tmp_path / "hidden"
    step = ["data", "capture", "--target", str(tiny_dir), "--data", str(prepared), "--out", str(out)]
    step += ["--device", "cpu", "--dtype", "float32", "--aux-layers", "0,1", "--split", "all"]
    env = {**os.environ, "DRAFTSMITH": str(cli), "DRAFTSMITH_PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "scripts/vllm_data_parallel.sh", "--gpus", "3,1", "--", *step], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(calls.read_text().split("\n")[:-1]) == ["1 1", "3 0"]
    assert f"{out} reads as one folder: capture" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["part-00000-of-00002", "part-00001-of-00002"]
    assert len(CaptureFolder(out)) == len(CONVERSATIONS)


def test_the_gpu_environment_pins_the_tested_range(tmp_path):
    done = dry_run("vllm_env_gpu.sh", "--dry-run", str(tmp_path / "venv"))
    assert done.returncode == 0, done.stderr
    assert f"pip install 'vllm{vllm_engine.tested_vllm_range()}'" in done.stdout, done.stdout
    assert "torch.version.cuda" in done.stdout and not (tmp_path / "venv").exists()
