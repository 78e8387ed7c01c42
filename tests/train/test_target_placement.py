"""The frozen target in tensor-parallel shards (`target_placement: tp`, runtime/core/placement.py).

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_target_placement.py -q                 # bad inputs
    OMP_NUM_THREADS=1 python -m pytest tests/train/test_target_placement.py -q -m distributed  # ~1 minute

The distributed tests save the tiny random Llama as three safetensors shards plus an index and train it
for 4 steps on 1, 2 and 4 gloo processes. TP changes only the order of float sums: each row-parallel
projection (o_proj, down_proj) adds two partial dot products of H/2 (I/2) terms through an all-reduce.
So the runs agree to float32 rounding, bounded by tests/tolerances.py's rule: `n` roundings of 2^-23 at
the loss's scale, with n the sums on the longest path to a step's loss: the target (3 layers, its logits),
the head's K = 3 unrolled steps (a decoder layer over [embedding; feature], fc over 3 aux states, the
draft LM head and the soft cross-entropy over its vocabulary), the mean over the tokens, and, per earlier
optimizer step, that forward again and its backward (the weights a step sees carry their rounding). What
the bound is good for: the negative control, the same run on a checkpoint whose layer-1 query heads sit
in the other rank's half (what a wrong shard order gives), misses it by more than 5x at some step, and the
TP runs stay more than three orders of magnitude inside it (observed: ~3e-5 on losses ~100).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny_dir, tiny_config, tiny_model, tiny_tokenizer
from tolerances import layer_accumulations, model_sums, rounding_atol
from train_data import write_conversations

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.placement import Layout, check_placement, placement_shard_fraction
from draftsmith.runtime.errors import BadInputError

ROOT = Path(__file__).resolve().parents[2]
STEPS, TTT, MAX_LENGTH = 4, 3, 64
H, INTERMEDIATE, LAYERS, VOCAB, DRAFT_VOCAB = 64, 128, 3, 128, 64


# ---- bad inputs (exit 2, naming the key), no processes ------------------------------------------------
def test_a_family_without_a_plan_this_loader_runs_is_refused():
    config = tiny_config()
    config.base_model_tp_plan = {}
    with pytest.raises(BadInputError, match="target_placement: .*no tensor-parallel plan"):
        check_placement(config, "tp", 2, world=2)
    config.base_model_tp_plan = {
        **tiny_config().base_model_tp_plan,
        "layers.*.mlp.gate_proj": "packed_colwise",
    }
    with pytest.raises(BadInputError, match="target_placement: .*packed_colwise"):
        check_placement(config, "tp", 2, world=2)


@pytest.mark.parametrize(
    "tp, world, names",
    [(3, 3, "num_attention_heads=4, num_key_value_heads=2"), (4, 4, "num_key_value_heads=2")],
)
def test_a_tp_size_that_does_not_divide_the_heads_is_refused(tp, world, names):
    with pytest.raises(BadInputError, match=f"tp_size: got {tp}, .*divides the target's {names}") as err:
        check_placement(tiny_config(), "tp", tp, world=world)
    assert "[1, 2]" in str(err.value) or "[1]" in str(err.value)  # the sizes that would work


def test_a_world_the_mesh_cannot_form_is_refused():
    with pytest.raises(BadInputError, match=r"tp_size: got 2, .*divisor of the 3 process\(es\)"):
        check_placement(tiny_config(), "tp", 2, world=3)
    config = tiny_config()
    config.num_key_value_heads = 4
    with pytest.raises(BadInputError, match=r"tp_size: got 4, .*2 process\(es\) per node"):
        check_placement(config, "tp", 4, world=4, local_world=2)  # a TP group across two nodes


def test_the_mesh_layout_and_the_share_each_rank_holds():
    layout = check_placement(tiny_config(), "tp", 2, world=8, rank=5)
    assert (layout.dp, layout.dp_rank, layout.tp_rank) == (4, 2, 1)  # ranks 4, 5 form TP group 2
    assert check_placement(tiny_config(), "tp", None, world=2) == Layout(2, 2, 0)  # unset: every process
    assert check_placement(tiny_config(), "replicate", None, world=4, rank=3) == Layout(1, 4, 3)
    # per layer q, o [H, H], k, v [H/2, H], gate, up, down [I, H]: split; embedding, LM head, norms whole
    split = LAYERS * (2 * H * H + 2 * (H // 2) * H + 3 * INTERMEDIATE * H)
    whole = split + 2 * VOCAB * H + (2 * LAYERS + 1) * H
    assert placement_shard_fraction(tiny_config(), 2) == (whole - split + split // 2) / whole
    assert placement_shard_fraction(tiny_config(), 1) == 1.0


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("placement")
    source = write_conversations(root / "convs.jsonl")
    cfg = {
        "head": {"aux_layers": "0,1,2", "draft_vocab_size": DRAFT_VOCAB},
        "data": {"source": str(source), "max_length": MAX_LENGTH, "validation_fraction": 0.2},
        "train": {"max_steps": STEPS, "batch_size": 2, "warmup_steps": 0, "ttt_steps": TTT},
        "eval": {"every": 0, "max_rows": 4},
        "checkpoint": {"every": 0, "keep": 1},
        "log": {"every": 1, "progress": False},
    }
    path = root / "train.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return root, path


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["target_placement=tp", "tp_size=3"], "tp_size: got 3, expected a size that divides"),
        (["target_placement=tp", "tp_size=2"], r"tp_size: got 2, expected a divisor of the 1 process(es)"),
        (["tp_size=2"], "tp_size: got 2, expected unset with target_placement=replicate"),
        (["target_placement=tp", "tp_size=0"], "tp_size: got 0, expected an integer >= 1"),
        (["target_placement=tp", "head.type=mtp", "cotrain.enabled=true"], "target_placement: got 'tp'"),
    ],
)
def test_train_refuses_a_placement_before_the_target_loads(
    job, tiny_dir, tmp_path, capsys, overrides, message
):
    root, cfg = job
    argv = ["train", "--config", str(cfg), f"target={tiny_dir}", f"output_dir={tmp_path / 'run'}"]
    assert main([*argv, f"data.dir={root / 'data'}", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err, err[-800:]


def test_train_refuses_tp_for_a_target_without_a_plan(job, tmp_path, capsys):
    folder = make_tiny_dir(tmp_path / "no-plan")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "base_model_tp_plan": {}}))
    root, cfg = job
    argv = ["train", "--config", str(cfg), f"target={folder}", f"output_dir={tmp_path / 'run'}"]
    assert main([*argv, f"data.dir={tmp_path / 'data'}", "target_placement=tp"]) == 2
    assert "target_placement: got \"tp for model_type 'llama'\"" in capsys.readouterr().err


# ---- distributed: the sharded runs against one process ------------------------------------------------
def loss_atol(step: int, scale: float) -> float:
    """Rounding allowed between two summation orders of step `step`'s loss (see the module docstring)."""
    target = model_sums(H, INTERMEDIATE, LAYERS, seq=MAX_LENGTH, vocab=VOCAB)
    draft = layer_accumulations(2 * H, INTERMEDIATE, (TTT + 1) * MAX_LENGTH) + 3 * H + H + DRAFT_VOCAB
    forward = target + TTT * draft + 2 * MAX_LENGTH  # + the mean over the micro-batch's tokens
    return rounding_atol(torch.float32, (2 * step - 1) * forward, scale)


def feature_atol(scale: float) -> float:
    return rounding_atol(torch.float32, model_sums(H, INTERMEDIATE, LAYERS, seq=MAX_LENGTH), scale)


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-3-shards")
    tiny_model().save_pretrained(folder, max_shard_size="200KB")
    tiny_tokenizer().save_pretrained(folder)
    assert len(list(folder.glob("model-*-of-00003.safetensors"))) == 3
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


@pytest.fixture(scope="module")
def swapped_dir(sharded_dir, tmp_path_factory):
    """The negative control: layer 1's query heads 0-1 and 2-3 exchanged, as if each rank had loaded
    the other's q_proj shard (its k/v heads its own)."""
    folder = tmp_path_factory.mktemp("tiny-swapped")
    shutil.copytree(sharded_dir, folder, dirs_exist_ok=True)
    name = "model.layers.1.self_attn.q_proj.weight"
    file = json.loads((sharded_dir / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(sharded_dir / file))
    tensors[name] = torch.cat([tensors[name][H // 2 :], tensors[name][: H // 2]])
    save_file(tensors, str(folder / file), metadata={"format": "pt"})
    return folder


def launch(
    cfg: Path, processes: int, *overrides: str, launcher: str = "ddp-cpu"
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", str(ROOT / f"configs/accelerate/{launcher}.yaml")]
    cmd += ["--num_processes", str(processes), "-m", "draftsmith.train", "--config", str(cfg), *overrides]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def rows(out: Path, kind: str = "train") -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def runs(job, sharded_dir, swapped_dir):
    """name -> output folder: one process (online, the control, offline) and the launched runs."""
    root, cfg = job
    online, offline = (
        ["data.dir=" + str(root / "online")],
        ["data.mode=offline", "data.storage_dtype=float32"],
    )
    base = [f"target={sharded_dir}"]
    one = {
        "single": [*base, *online],
        "swapped": [f"target={swapped_dir}", f"data.dir={root / 'swapped'}"],
        "single-offline": [*base, *offline, f"data.dir={root / 'offline-1'}"],
    }
    launched = {
        "tp2": (2, [*base, *online, "target_placement=tp"]),
        "ddp2": (2, [*base, *online]),
        "tp2x2": (4, [*base, *online, "target_placement=tp", "tp_size=2"]),
        "tp2-offline": (2, [*base, *offline, f"data.dir={root / 'offline-tp'}", "target_placement=tp"]),
        "tp2-fsdp": (2, [*base, *online, "target_placement=tp"]),  # the head under FSDP2
    }
    outs = {}
    for name, overrides in one.items():
        outs[name] = root / name
        assert main(["train", "--config", str(cfg), f"output_dir={outs[name]}", *overrides]) == 0
    for name, (processes, overrides) in launched.items():
        outs[name] = root / name
        launcher = "fsdp-cpu" if name.endswith("fsdp") else "ddp-cpu"
        done = launch(cfg, processes, f"output_dir={outs[name]}", *overrides, launcher=launcher)
        assert done.returncode == 0, done.stderr[-3000:]
        state = json.loads(
            (outs[name] / "checkpoints" / f"step-{STEPS:06d}" / "trainer_state.json").read_text()
        )
        assert state["world_size"] == processes and (outs[name] / "checkpoints").is_dir()
        assert state["tp_size"] == (2 if "tp" in name else 1)
    return outs


def assert_losses_close(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    for a, b in zip(got, want):
        assert abs(a["loss"] - b["loss"]) <= loss_atol(a["step"], abs(b["loss"])), (
            a["step"],
            a["loss"],
            b["loss"],
        )


@pytest.mark.distributed
def test_the_sharded_online_run_trains_as_one_process_does(runs):
    assert_losses_close(rows(runs["tp2"]), rows(runs["single"]))
    assert_losses_close(rows(runs["tp2-fsdp"]), rows(runs["single"]))  # the head sharded by FSDP2 too
    (got,), (want,) = rows(runs["tp2"], "eval"), rows(runs["single"], "eval")
    assert got["rows"] == want["rows"] == 4 and abs(got["loss"] - want["loss"]) <= loss_atol(
        STEPS + 1, want["loss"]
    )
    tokens = [r["tokens_per_s"] > 0 for r in rows(runs["tp2"])]
    assert all(tokens)


@pytest.mark.distributed
def test_a_wrong_shard_order_misses_that_tolerance(runs):
    """The negative control: what the bound must catch, it catches with room to spare."""
    ratios = [
        abs(a["loss"] - b["loss"]) / loss_atol(a["step"], abs(b["loss"]))
        for a, b in zip(rows(runs["swapped"]), rows(runs["single"]))
    ]
    assert max(ratios) > 5, ratios
    tp_ratios = [
        abs(a["loss"] - b["loss"]) / loss_atol(a["step"], abs(b["loss"]))
        for a, b in zip(rows(runs["tp2"]), rows(runs["single"]))
    ]
    assert max(tp_ratios) < 1e-2, tp_ratios  # the TP runs sit far inside it


@pytest.mark.distributed
def test_the_head_is_data_parallel_across_tp_groups(runs):
    """4 processes as 2 TP groups of 2 read the rows 2 data-parallel processes read, and train the same
    head: the ranks of a group see the same rows (the sample order is the data-parallel one)."""
    assert_losses_close(rows(runs["tp2x2"]), rows(runs["ddp2"]))
    (got,), (want,) = rows(runs["tp2x2"], "eval"), rows(runs["ddp2"], "eval")
    assert got["rows"] == want["rows"] and abs(got["loss"] - want["loss"]) <= loss_atol(
        STEPS + 1, want["loss"]
    )
    heads = [load_file(str(runs[k] / "final" / "model.safetensors")) for k in ("tp2x2", "ddp2")]
    assert heads[0].keys() == heads[1].keys()


@pytest.mark.distributed
def test_the_capture_inside_a_tp_job_is_the_one_process_capture(runs, job):
    """Offline mode: the TP group's rank 0 writes the capture (one part: one group), rank 1 runs every
    forward with it; the features equal a one-process capture's to rounding, training reads the parts."""
    from draftsmith.data_recipes.capture_reader import CaptureFolder

    root, _ = job
    [one], [sharded] = (list((root / d).glob("capture-*")) for d in ("offline-1", "offline-tp"))
    assert not list(sharded.glob("part-*"))  # one TP group of two ranks: one capture, not two parts
    a, b = CaptureFolder(sharded), CaptureFolder(one)
    assert a.row_ids() == b.row_ids()
    for i in range(len(b.row_ids())):
        got, want = a[i], b[i]
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(
            got["loss_mask"], want["loss_mask"]
        )
        for key in ("aux_hidden", "last_hidden"):
            scale = float(want[key].abs().max())
            torch.testing.assert_close(got[key], want[key], atol=feature_atol(scale), rtol=0)
    assert_losses_close(rows(runs["tp2-offline"]), rows(runs["single-offline"]))


@pytest.mark.distributed
@pytest.mark.parametrize("processes", [2, 4])
def test_each_rank_holds_its_shard_and_runs_the_cached_forward(sharded_dir, tmp_path, processes):
    """tests/train/tp_check.py on every rank (2 ranks: one TP group; 4: two groups of 2)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    cmd += [str(Path(__file__).with_name("tp_check.py")), str(sharded_dir), str(tmp_path), "2"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    split = LAYERS * (2 * H * H + 2 * (H // 2) * H + 3 * INTERMEDIATE * H)  # the projections TP splits
    for rank in range(processes):
        r = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert r["tp_size"] == 2 and r["local_kv_heads"] == 1  # 2 KV heads over 2 ranks
        assert r["resident_bytes"] == r["whole_bytes"] - 4 * split // 2  # exactly half of every projection
        atol = feature_atol(r["scale"])
        assert max(r["capture_aux"], r["capture_last"], *r["cached_steps"]) <= atol, r
        assert (len(r["driven"]) == 3) == (rank % 2 == 0) and all(d <= atol for d in r["driven"]), r
        assert r["weights_hash_equal"] and r["layer_state_equal"]
