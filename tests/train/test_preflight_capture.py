"""The memory preflight's capture phase (train/preflight/capture.py) and fixed GPU overheads
(train/preflight/units.py gpu_overheads): an offline run without its capture counts the whole target it
loads to make one, plans a capture command that fits, and refuses (exit 2) before that load when it does
not fit; with the capture there, only the parts count.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_preflight_capture.py -q
"""

import re
import shlex

import pytest
import torch
from train_data import run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.train.config import load_train_config
from draftsmith.train.preflight.capture import draftsmith_capture
from draftsmith.train.preflight.estimate import Knobs, Setup, estimate
from draftsmith.train.preflight.shapes import TargetShapes
from draftsmith.train.preflight.units import CUDA_CONTEXT

LLAMA_70B = "meta-llama/Llama-3.3-70B-Instruct"
QWEN_235B = "Qwen/Qwen3-235B-A22B"


def preflight(capsys, *argv: str) -> str:
    assert main(["train", "--preflight", *argv, "train.preflight_device_gb=80", "--world-size", "8"]) == 0
    return capsys.readouterr().out


def capture_flags(capsys) -> set[str]:
    """The flags `draftsmith data capture` takes, from its --help."""
    assert main(["data", "capture", "--help"]) == 0
    return set(re.findall(r"--[a-z0-9-]+", capsys.readouterr().out))


def capture_command(text: str) -> str:
    """The advised capture command line (a torchrun launch, or one process)."""
    lines = [line.strip() for line in text.splitlines()]
    return next(x for x in lines if x.startswith(("torchrun ", "draftsmith data capture ")))


def test_offline_without_a_capture_counts_the_whole_target(tmp_path, capsys):
    """Llama-3.3-70B offline on 8 x 80 GB: training reads only the parts (fits), but the capture it must
    make first loads the whole target under the default placement (replicate: 141.1 GB a rank), so the
    verdict is NO and the advice is a TP capture command that fits, with flags `data capture` has."""
    argv = [f"target={LLAMA_70B}", "data.mode=offline", "data.max_length=4096", "train.batch_size=1"]
    out = preflight(capsys, *argv, f"data.dir={tmp_path}")
    assert "capture phase (" in out and "target_placement=replicate" in out
    assert re.search(r"target weights \(the capture\) +141\.1 GB", out)
    assert re.search(r"\n  target weights +4\.2 GB", out)  # the training phase: the parts
    training = re.search(r"training peak +([\d.]+) GB +([\d.]+) GB +([\d.]+) GB +([\d.]+) GB", out)
    assert training and min(map(float, training.groups())) < 80  # under ZeRO (DDP: the head's [T, T] scores)
    assert re.search(r"peak = max\(capture, training\) +1[45]\d\.\d GB", out)
    assert re.search(r"fits in 80\.0 GB\? +NO", out) and "the capture phase does not fit" in out

    command = capture_command(out)
    assert command.startswith("torchrun --nproc-per-node 8 -m draftsmith.runtime.cli data capture ")
    words = shlex.split(command)
    tp = int(words[words.index("--tp-size") + 1])
    assert words[words.index("--target-placement") + 1] == "tp"
    assert words[words.index("--out") + 1] == str(tmp_path / "capture-1-39-76-bfloat16")  # the run's folder
    assert {w for w in words if w.startswith("--")} <= capture_flags(capsys) | {"--nproc-per-node"}

    cfg = load_train_config(None, argv)
    shapes = TargetShapes.load(LLAMA_70B, torch.bfloat16)
    knobs = Knobs.from_config(cfg, shapes)
    setup = Setup("ddp", 8, "cuda", "bf16")
    assert draftsmith_capture(shapes, knobs, setup, 3, parts=True).peak > 80e9  # the in-job capture
    assert draftsmith_capture(shapes, knobs, Setup("ddp", 8, "cuda", "bf16", tp=tp), 3, False).peak <= 80e9
    assert draftsmith_capture(shapes, knobs, Setup("ddp", 8, "cuda", "bf16", tp=2), 3, False).peak > 80e9
    assert tp == 4  # the mildest that fits: TP=2 leaves 72.7 GB of weights a rank


def test_an_online_run_advised_offline_gets_the_capture_that_can_run(capsys):
    """Qwen3-235B-A22B: draftsmith's TP stops at its 4 KV heads (too little), so the offline advice plans
    vLLM's TP over 8 GPUs, and never a draftsmith TP size it cannot run."""
    out = preflight(capsys, f"target={QWEN_235B}", "data.max_length=4096", "train.batch_size=1")
    assert "data.mode=offline (a capture first" in out
    command = capture_command(out)
    words = shlex.split(command)
    assert words[:3] == ["draftsmith", "data", "capture"] and "--tp-size" not in words
    assert words[words.index("--engine") + 1] == "vllm"
    assert words[words.index("--tensor-parallel-size") + 1] == "8"
    assert {w for w in words if w.startswith("--")} <= capture_flags(capsys)


def test_with_its_capture_made_only_the_parts_count(tiny_dir, source, tmp_path, capsys):
    """The same decision as the run's: a fresh data folder has no capture (the phase is counted); a CPU
    run that fits makes it in-job as before; then `--preflight` finds it and counts the parts only."""
    data = tmp_path / "data"
    argv = run_overrides(tiny_dir, source, data, tmp_path / "run", "data.mode=offline", "train.max_steps=1")
    argv += ["eval.every=0", "checkpoint.every=0", "device=cpu"]
    assert main(["train", "--preflight", *argv, "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    assert f"no finished capture in {data / 'capture-0-1-2-bfloat16'}" in out
    assert "target weights (the capture)" in out and "fixed GPU overheads" not in out  # a CPU: none
    assert "the capture fits in the job; to make it beforehand instead:" in out
    words = shlex.split(capture_command(out))
    assert words[:3] == ["draftsmith", "data", "capture"] and "--target-placement" not in words
    assert words[words.index("--out") + 1] == str(data / "capture-0-1-2-bfloat16")
    tp = ["target_placement=tp", "tp_size=2", "--world-size", "2"]  # the run's own placement, as flags
    assert main(["train", "--preflight", *argv, *tp]) == 0
    words = shlex.split(capture_command(capsys.readouterr().out))
    assert words[:5] == ["torchrun", "--nproc-per-node", "2", "-m", "draftsmith.runtime.cli"]
    assert words[-4:] == ["--target-placement", "tp", "--tp-size", "2"]

    config = tmp_path / "cfg.yaml"
    config.write_text("{}\n")
    assert main(["train", "--config", str(config), *argv]) == 0  # the capture made in-job
    assert "memory preflight of the capture" in capsys.readouterr().err
    assert (data / "capture-0-1-2-bfloat16" / "draftsmith_data.json").is_file()
    assert main(["train", "--preflight", *argv, "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "capture phase" not in out and "capture peak" not in out
    assert "embedding + final norm + LM head (offline" in out


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    """The tiny target with 48 layers: its whole weights (7 MB) outweigh a small head's training run."""
    from tiny_models import tiny_config, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    config = tiny_config()
    config.num_hidden_layers = 48
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("deep-llama")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def test_the_run_refuses_before_loading_a_target_its_capture_cannot_hold(
    deep_dir, source, tmp_path, capsys, monkeypatch
):
    """A budget above the training phase and below the in-job capture (the whole target beside the parts
    training holds): check_before_load lets the run start, the capture check stops it (exit 2) before the
    whole target loads, naming the capture to run first as its own job (which fits: no parts)."""
    from draftsmith.runtime.core.target import Target

    def never(*args, **kwargs):
        raise AssertionError("the whole target loaded before the capture check refused")

    data = tmp_path / "data"
    argv = run_overrides(deep_dir, source, data, tmp_path / "run", "data.mode=offline", "train.batch_size=1")
    argv += ["device=cpu", "train.max_steps=1", "train.ttt_steps=1", "eval.every=0", "checkpoint.every=0"]
    cfg = load_train_config(None, argv)
    shapes = TargetShapes.load(str(deep_dir), torch.float32)
    knobs = Knobs.from_config(cfg, shapes)
    setup = Setup("single", 1, "cpu", "no")
    training = estimate(shapes, knobs, setup).peak
    in_job = draftsmith_capture(shapes, knobs, setup, 3, parts=True, placement="replicate").peak
    alone = draftsmith_capture(shapes, knobs, setup, 3, parts=False, placement="replicate").peak
    assert training < alone < in_job  # a capture of its own does not hold training's parts beside it
    budget = (alone + in_job) / 2 / 1e9

    monkeypatch.setattr(Target, "load", never)
    config = tmp_path / "cfg.yaml"
    config.write_text("{}\n")
    assert main(["train", "--config", str(config), *argv, f"train.preflight_device_gb={budget}"]) == 2
    err = capsys.readouterr().err
    assert "memory per rank: the capture phase" in err and "(train.preflight_device_gb)" in err
    assert f"no finished capture in {data / 'capture-0-1-2-bfloat16'}" in err
    command = capture_command(err)
    words = shlex.split(command)
    assert words[:3] == ["draftsmith", "data", "capture"]  # one process: no launcher
    assert words[words.index("--out") + 1] == str(data / "capture-0-1-2-bfloat16")
    assert "to try anyway: train.preflight=warn" in err
    assert not (data / "capture-0-1-2-bfloat16" / "draftsmith_data.json").exists()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_fixed_overheads_on_a_gpu_and_none_on_a_cpu(monkeypatch):
    """CUDA context + NCCL buffers (world and TP communicators: NCCL_BUFFSIZE x 32 channels x 2 peers)
    + 5% allocator slack over the rest of the peak; no such term on a CPU."""
    cfg = load_train_config(None, [f"target={LLAMA_70B}", "data.max_length=4096", "train.batch_size=1"])
    shapes = TargetShapes.load(LLAMA_70B, torch.bfloat16)
    knobs = Knobs.from_config(cfg, shapes)

    def overhead(setup):
        return next((t for t in estimate(shapes, knobs, setup).terms if t.name.startswith("fixed GPU")), None)

    assert overhead(Setup("zero3", 8, "cpu", "no")) is None
    gpu = estimate(shapes, knobs, Setup("zero3", 8, "cuda", "bf16", tp=4))
    term = overhead(gpu.setup)
    rest = gpu.peak - term.bytes
    assert term.bytes == pytest.approx(CUDA_CONTEXT + 2 * (4 << 20) * 32 * 2 + 0.05 * rest)
    assert "estimates:" in term.how
    monkeypatch.setenv("NCCL_BUFFSIZE", str(8 << 20))  # NCCL's own variable is read
    assert overhead(gpu.setup).bytes == pytest.approx(term.bytes + 2 * (4 << 20) * 32 * 2)
    one = estimate(shapes, knobs, Setup("single", 1, "cuda", "bf16"))  # one process: no communicator
    single = overhead(one.setup)
    assert single.bytes == pytest.approx(CUDA_CONTEXT + 0.05 * (one.peak - single.bytes))
