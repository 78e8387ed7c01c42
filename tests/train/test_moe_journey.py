"""The biggest-target journey at simulated scale: a tiny Qwen3-MoE on 4 gloo ranks with expert parallelism,
from the preflight to greedy decoding with the head it trained.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_moe_journey.py -q -m distributed   # ~1 minute

What a user with Qwen3-235B-A22B on 8 GPUs walks (docs/scale.md, "Targets larger than one GPU"), each step the
command they would type:
1. `draftsmith train --preflight --world-size 4` for offline EAGLE-3 under `target_placement=ep`: the
   capture is missing, so the preflight counts it under its placement and prints the commands that make
   the data beforehand; the test runs them as printed.
2. `draftsmith data prepare` (one process).
3. `torchrun --nproc-per-node 4 ... data capture --target-placement ep --ep-size 2`: 2 groups of 2 ranks,
   each holding the target with its experts split (4 of 8 a rank, attention whole: 1 KV head), each
   group's rank 0 driving; each group writes one part, and the parts read as one capture. It agrees with
   a one-process capture to fp32 rounding (tests/tolerances.py's rule: only the order of the experts'
   float sums changes, and the routers see the same hidden states).
4. `draftsmith train` offline on one process: it finds the capture done (writes nothing there), makes its
   draft vocabulary, and reads only the target's parts.
5. `draftsmith export --format eagle3`, then the export loaded by the runtime as `--draft eagle3:DIR`:
   greedy speculative decoding emits exactly the whole target's plain greedy tokens, and drafts were
   accepted (the head trained on the EP capture predicts the target).
"""

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from family_models import make_family_dir
from tolerances import layer_accumulations, model_sums, rounding_atol
from train_data import tiny_train_overrides, write_conversations
from transformers import AutoConfig

from draftsmith.runtime.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MAX_LENGTH = 64


def free_port() -> int:
    with socket.socket() as s:  # other jobs on this machine may hold torchrun's default port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(processes: int, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    cmd += ["--master_port", str(free_port()), "-m", "draftsmith.runtime.cli", *argv]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def largest_miss(got_dir: Path, want_dir: Path, config) -> float:
    """The largest feature difference of two captures in units of the fp32 bound at each row's scale."""
    from draftsmith.data_recipes.capture import CaptureFolder

    got, want = CaptureFolder(got_dir), CaptureFolder(want_dir)
    assert got.row_ids() == want.row_ids()
    width = max(config.intermediate_size, config.moe_intermediate_size)
    sums = model_sums(config.hidden_size, width, config.num_hidden_layers, seq=MAX_LENGTH)
    worst = 0.0
    for i in range(len(want.row_ids())):
        a, b = got[i], want[i]
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        for key in ("aux_hidden", "last_hidden"):
            bound = rounding_atol(torch.float32, sums, float(b[key].abs().max()))
            worst = max(worst, float((a[key] - b[key]).abs().max()) / bound)
    return worst


@pytest.mark.distributed
def test_a_moe_target_on_expert_parallel_ranks_from_preflight_to_greedy_identity(tmp_path, capsys):
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.core.speculative import generate_speculative
    from draftsmith.runtime.core.target import Target
    from draftsmith.runtime.drafters.drafting import build_drafter
    from draftsmith.runtime.verify.sampling import SamplingParams
    from draftsmith.runtime.verify.tree import chain

    target = make_family_dir(tmp_path / "qwen3-moe", "qwen3_moe")
    data, run, export = tmp_path / "data", tmp_path / "run", tmp_path / "export"
    source = write_conversations(tmp_path / "convs.jsonl", n=24)
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text("{}\n")
    train = ["train", "--config", str(config_file), f"target={target}", f"output_dir={run}"]
    train += [*tiny_train_overrides(source, data), "data.mode=offline", "data.storage_dtype=float32"]
    train += [f"data.max_length={MAX_LENGTH}", "train.max_steps=30", "train.batch_size=4", "eval.every=0"]
    train += ["train.ttt_steps=2", "checkpoint.every=30"]

    # 1. the preflight under EP plans the capture it needs and prints its commands
    assert main([*train, "target_placement=ep", "ep_size=2", "--preflight", "--world-size", "4"]) == 0
    said = capsys.readouterr().out
    commands = said.split("to make it beforehand instead:\n")[1].strip().splitlines()
    prepare, capture = (shlex.split(line) for line in commands)
    assert prepare[:3] == ["draftsmith", "data", "prepare"], commands
    assert capture[:5] == ["torchrun", "--nproc-per-node", "4", "-m", "draftsmith.runtime.cli"], commands
    assert capture[-4:] == ["--target-placement", "ep", "--ep-size", "2"], commands

    # 2-3. the commands as printed: prepare in one process, the capture on 2 groups of 2 EP ranks
    assert main(prepare[1:]) == 0
    torchrun(4, *capture[5:])
    captured = Path(capture[capture.index("--out") + 1])
    assert sorted(p.name for p in captured.glob("part-*")) == ["part-00000-of-00002", "part-00001-of-00002"]
    alone = capture[5:-4]
    alone[alone.index("--out") + 1] = str(tmp_path / "one-process")
    assert main(alone) == 0
    assert largest_miss(captured, tmp_path / "one-process", AutoConfig.from_pretrained(target)) <= 1.0

    # 4. offline training finds the capture done (it writes nothing there) and reads only the parts
    shards = {p: p.stat().st_mtime_ns for p in captured.rglob("*.safetensors")}
    assert main(train) == 0
    assert (run / "final").is_dir()
    assert {p: p.stat().st_mtime_ns for p in captured.rglob("*.safetensors")} == shards

    # 5. export, load in the runtime, greedy identity with plain decoding
    assert main(["export", str(run), "--format", "eagle3", "--out", str(export)]) == 0
    whole = Target.load(str(target), device="cpu", dtype="float32")
    prompts = [whole.encode(f"w{i} w{i + 1} w{i + 2}") for i in range(4)]
    drafter = build_drafter(f"eagle3:{export}", whole, chain(3), device="cpu", dtype="float32")
    spec = generate_speculative(whole, drafter, prompts, SamplingParams(), 24, batch_size=2)
    plain = generate_plain(whole, prompts, SamplingParams(), max_new_tokens=24)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert sum(sum(r.accepted_lengths) for r in spec) > 0  # the head's drafts were accepted


def loss_atol(config, step: int, steps: int, scale: float) -> float:
    """Rounding between two summation orders of step `step`'s loss: the target's longest path (the
    experts' partial sums now added over ranks), the head's `steps` unrolled layers over its
    [embedding; feature] and draft vocabulary of 64, the token mean; per earlier step its forward and
    backward again (tests/tolerances.py's rule, as tests/train/test_target_placement.py derives it)."""
    h, width = config.hidden_size, max(config.intermediate_size, config.moe_intermediate_size)
    target = model_sums(h, width, config.num_hidden_layers, seq=MAX_LENGTH, vocab=config.vocab_size)
    draft = layer_accumulations(2 * h, config.intermediate_size, (steps + 1) * MAX_LENGTH) + 4 * h + 64
    forward = target + steps * draft + 2 * MAX_LENGTH
    return rounding_atol(torch.float32, (2 * step - 1) * forward, scale)


def accelerate(processes: int, *argv: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [launcher, "launch", "--config_file", str(ROOT / "configs/accelerate/ddp-cpu.yaml")]
    cmd += ["--num_processes", str(processes), "--main_process_port", str(free_port())]
    done = subprocess.run([*cmd, "-m", "draftsmith.train", *argv], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.distributed
def test_online_training_and_regeneration_under_ep_match_one_process(tmp_path):
    """`target_placement=ep` in the two other places it runs: online EAGLE-3 training on 2 ranks (one
    group: the same rows as one process) trains the one-process losses to rounding, and `data regenerate
    --target-placement ep` on 2 ranks gives the one-process greedy answers (the family model's logits are
    sharpened, so no answer rests on a near tie)."""
    from draftsmith.data_recipes.parts import load_prepared

    target = make_family_dir(tmp_path / "qwen3-moe", "qwen3_moe")
    source = write_conversations(tmp_path / "convs.jsonl", n=16)
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text("{}\n")
    argv = ["--config", str(config_file), f"target={target}", *tiny_train_overrides(source, tmp_path / "d")]
    argv += [f"data.max_length={MAX_LENGTH}", "train.max_steps=3", "train.batch_size=2", "train.ttt_steps=2"]
    argv += ["eval.every=0", "checkpoint.every=3", "log.every=1"]
    assert main(["train", *argv, f"output_dir={tmp_path / 'one'}"]) == 0
    accelerate(2, *argv, f"output_dir={tmp_path / 'ep'}", "target_placement=ep")
    config = AutoConfig.from_pretrained(target)
    for a, b in zip(train_rows(tmp_path / "ep"), train_rows(tmp_path / "one"), strict=True):
        assert a["step"] == b["step"] and abs(a["loss"] - b["loss"]) <= loss_atol(
            config, b["step"], 2, abs(b["loss"])
        ), (a, b)

    regen = ["--target", str(target), "--data", str(tmp_path / "d" / "prepared"), "--dtype", "float32"]
    regen += ["--max-new-tokens", "8", "--batch-size", "3"]
    assert main(["data", "regenerate", *regen, "--out", str(tmp_path / "regen-one")]) == 0
    torchrun(2, "data", "regenerate", *regen, "--out", str(tmp_path / "regen-ep"), "--target-placement", "ep")
    got, want = (conversations(load_prepared(tmp_path / name)) for name in ("regen-ep", "regen-one"))
    assert got == want and len(want) == 16


def conversations(ds) -> dict[str, str]:
    return {row["id"]: row["messages"] for split in ds for row in ds[split]}


def train_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]
