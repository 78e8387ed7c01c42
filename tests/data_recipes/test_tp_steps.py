"""`draftsmith data capture|regenerate --target-placement tp` under torchrun (data_recipes/tp_steps.py).

    OMP_NUM_THREADS=1 python -m pytest tests/data_recipes/test_tp_steps.py -q                 # bad inputs
    OMP_NUM_THREADS=1 python -m pytest tests/data_recipes/test_tp_steps.py -q -m distributed  # ~1 minute

The distributed tests save the tiny random Llama as three safetensors shards plus an index and run the
standalone steps on 2 and 4 gloo processes against one process. TP changes only the order of float
sums (each row-parallel o_proj / down_proj adds two partial dot products through an all-reduce), so a
capture agrees with the one-process capture to float32 rounding, bounded by tests/tolerances.py's rule:
`model_sums` roundings of 2^-23 at the features' scale, the sums on the longest path through the 3
layers at the rows' length. The negative control, a checkpoint whose layer-1 query heads sit in the
other rank's half (what a wrong shard order gives), misses that bound by more than 5x. Regeneration is
greedy on a target whose logits are sharpened (tests/tiny_models.py: the LM head x 8), so its top-two
gaps are orders of magnitude above a 4-ulp near tie of runtime/verify/near_tie.py and the answers must be
identical; a failure reports whether the first difference was a near tie. Sampled regeneration under TP
must be identical too: the group's rank 0 samples with the same per-(row, turn) generators.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny_dir, tiny_model, tiny_tokenizer
from tolerances import model_sums, rounding_atol
from train_data import write_conversations

from draftsmith.data_recipes.capture import CaptureFolder
from draftsmith.data_recipes.common import read_record
from draftsmith.data_recipes.parts import require_whole
from draftsmith.data_recipes.tp_steps import plan_step
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.launch import Launch, wait_error
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.near_tie import first_mismatch

ROOT = Path(__file__).resolve().parents[2]
H, INTERMEDIATE, LAYERS, MAX_LENGTH = 64, 128, 3, 48
CAPTURE = ["--dtype", "float32", "--split", "all", "--aux-layers", "0,1,2", "--storage-dtype", "float32"]
REGEN = ["--dtype", "float32", "--max-new-tokens", "8", "--batch-size", "3"]


def feature_atol(scale: float) -> float:
    return rounding_atol(torch.float32, model_sums(H, INTERMEDIATE, LAYERS, seq=MAX_LENGTH), scale)


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-3-shards")
    tiny_model().save_pretrained(folder, max_shard_size="200KB")
    tiny_tokenizer().save_pretrained(folder)
    assert len(list(folder.glob("model-*-of-00003.safetensors"))) == 3
    return folder


@pytest.fixture(scope="module")
def swapped_dir(sharded_dir, tmp_path_factory):
    """The negative control: layer 1's query heads 0-1 and 2-3 exchanged, as if each rank had loaded
    the other's q_proj shard."""
    folder = tmp_path_factory.mktemp("tiny-swapped")
    shutil.copytree(sharded_dir, folder, dirs_exist_ok=True)
    name = "model.layers.1.self_attn.q_proj.weight"
    file = json.loads((sharded_dir / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(sharded_dir / file))
    tensors[name] = torch.cat([tensors[name][H // 2 :], tensors[name][: H // 2]])
    save_file(tensors, str(folder / file), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def prepared(sharded_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-data")
    source = write_conversations(root / "convs.jsonl", n=10)
    out = root / "prepared"
    argv = ["data", "prepare", "--target", str(sharded_dir), "--source", str(source), "--out", str(out)]
    assert main([*argv, "--max-length", str(MAX_LENGTH), "--validation-fraction", "0.3"]) == 0
    return out


def free_port() -> int:
    with socket.socket() as s:  # other jobs on this machine may hold torchrun's default port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(processes: int, *argv: str, script: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    cmd += ["--master_port", str(free_port())]
    cmd += [script] if script else ["-m", "draftsmith.runtime.cli"]
    done = subprocess.run([*cmd, *argv], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def step(name: str, target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["data", name, "--target", str(target), "--data", str(data), "--out", str(out), *extra]


def assert_captures_close(got: CaptureFolder, want: CaptureFolder) -> float:
    """Same rows and tokens, features within the rounding bound; returns the largest error / bound."""
    assert got.row_ids() == want.row_ids()
    worst = 0.0
    for i in range(len(want.row_ids())):
        a, b = got[i], want[i]
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        for key in ("aux_hidden", "last_hidden"):
            bound = feature_atol(float(b[key].abs().max()))
            worst = max(worst, float((a[key] - b[key]).abs().max()) / bound)
    return worst


def messages(folder: Path) -> dict[str, list[dict]]:
    from draftsmith.data_recipes.parts import load_prepared

    ds = load_prepared(folder)
    return {row["id"]: json.loads(row["messages"]) for split in ds for row in ds[split]}


def assert_same_answers(got: Path, want: Path, target_dir: Path) -> None:
    """Identical conversations; a failure names the first differing answer and its near-tie verdict."""
    a, b = messages(got), messages(want)
    assert a.keys() == b.keys()
    for row_id, turns in b.items():
        for i, turn in enumerate(turns):
            if a[row_id][i] != turn:
                tie = near_tie_verdict(target_dir, turns[:i], a[row_id][i]["content"], turn["content"])
                pytest.fail(f"{row_id} turn {i}: {a[row_id][i]} != {turn}; {tie}")


def near_tie_verdict(target_dir: Path, history: list[dict], got: str, want: str):
    """runtime/verify/near_tie.py's verdict on the first differing token of two answers to `history`."""
    from draftsmith.data_recipes.regenerate import chat_prompt_ids
    from draftsmith.runtime.core.target import Target

    target = Target.load(str(target_dir), device="cpu", dtype="float32")
    [got_ids, want_ids] = (target.tokenizer(t, add_special_tokens=False)["input_ids"] for t in (got, want))
    return first_mismatch(target, chat_prompt_ids(target, history), got_ids, want_ids)


# ---- bad inputs (exit 2, naming the flag), no processes -------------------------------------------------
def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", ["capture", "regenerate"])
def test_tp_without_a_process_group_is_refused(name, tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data = tmp_path / "prepared"
    source = write_conversations(tmp_path / "c.jsonl", n=4)
    assert (
        main(["data", "prepare", "--target", str(tiny_dir), "--source", str(source), "--out", str(data)]) == 0
    )
    code, err = run_cli(step(name, tiny_dir, data, tmp_path / "out", "--target-placement", "tp"), capsys)
    assert code == 2 and "--target-placement: got 'tp in one process" in err, err
    assert f"torchrun --nproc-per-node N -m draftsmith.runtime.cli data {name}" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "world, flags, message",
    [
        (3, ["--tp-size", "3"], "--tp-size: got 3, expected a size that divides the target's num_attention"),
        (4, ["--tp-size", "4"], "--tp-size: got 4, expected a size that divides the target's num_key_value"),
        (3, ["--tp-size", "2"], r"--tp-size: got 2, expected a divisor of the 3 process(es)"),
        (2, [], None),  # the default placement with explicit --tp-size below
    ],
)
def test_a_tp_size_the_heads_or_the_world_cannot_take_is_refused(
    world, flags, message, tiny_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    data = tmp_path / "data"  # the placement is checked before the data: no prepared folder needed
    placement = ["--target-placement", "tp"] if message else ["--tp-size", "2"]
    code, err = run_cli(step("regenerate", tiny_dir, data, tmp_path / "out", *placement, *flags), capsys)
    want = message or "--tp-size: got 2, expected unset (or 1) with target_placement=replicate"
    assert code == 2 and want in err, err


def test_a_family_without_a_plan_and_a_bad_placement_are_refused(tmp_path, capsys, monkeypatch):
    folder = make_tiny_dir(tmp_path / "no-plan")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "base_model_tp_plan": {}}))
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = step("regenerate", folder, tmp_path / "data", tmp_path / "out", "--target-placement")
    code, err = run_cli([*argv, "tp"], capsys)
    assert code == 2 and "--target-placement: got \"tp for model_type 'llama'\"" in err, err
    code, err = run_cli([*argv, "pp"], capsys)
    assert code == 2 and "--target-placement: got 'pp', expected one of ['replicate', 'tp', 'ep']" in err, err
    code, err = run_cli([*argv, "ep"], capsys)  # expert parallelism for a dense family
    assert code == 2 and "--target-placement: got \"ep for model_type 'llama'\"" in err, err
    code, err = run_cli([*argv, "tp", "--ep-size", "2"], capsys)  # a size for the other placement
    assert code == 2 and "--ep-size: got 2, expected unset (or 1) with target_placement=tp" in err, err


def test_groups_make_their_parts_and_combine_with_explicit_shards(tiny_dir):
    """world 4, tp 2: group g of 2 makes part g of 2; a launch given --num-shards 3 --shard-index 1 (one
    of three machines) makes parts 2 and 3 of 6; replicate: every rank a part."""

    def plan(rank, placement="tp", tp=2, shards=1, index=0):
        args = type("Args", (), {})()
        args.target, args.device, args.num_shards, args.shard_index = str(tiny_dir), "cpu", shards, index
        args.target_placement, args.tp_size, args.process_group_timeout_s = placement, tp, 60
        p = plan_step(args, Launch(4, rank, rank, 4), "capture")
        return p.leader, p.num_shards, p.shard_index

    assert [plan(r) for r in range(4)] == [(True, 2, 0), (False, 2, 0), (True, 2, 1), (False, 2, 1)]
    assert [plan(r, shards=3, index=1) for r in (0, 2)] == [(True, 6, 2), (True, 6, 3)]
    assert [plan(r, "replicate", None) for r in range(4)] == [(True, 4, r) for r in range(4)]
    with pytest.raises(BadInputError, match="--shard-index: got 3"):
        plan(0, shards=3, index=3)


def test_a_wait_that_runs_out_names_the_timeout_flag():
    err = wait_error(1, 5, "every group's part", RuntimeError("Timed out waiting 5000ms for recv"))
    assert isinstance(err, BadInputError) and err.field == "--process-group-timeout-s" and err.got == 5
    other = wait_error(1, 5, "every group's part", RuntimeError("Connection closed by peer"))
    assert not isinstance(other, BadInputError) and "another rank probably failed first" in str(other)


# ---- distributed: the launched steps against one process ----------------------------------------------
@pytest.fixture(scope="module")
def one_process(sharded_dir, swapped_dir, prepared):
    """The one-process runs: capture (and the control's), greedy and sampled regenerate."""
    root = prepared.parent
    outs = {name: root / name for name in ("capture", "swapped", "regen", "regen-sampled")}
    assert main(step("capture", sharded_dir, prepared, outs["capture"], *CAPTURE)) == 0
    assert main(step("capture", swapped_dir, prepared, outs["swapped"], *CAPTURE)) == 0
    assert main(step("regenerate", sharded_dir, prepared, outs["regen"], *REGEN)) == 0
    sampled = [*REGEN, "--temperature", "0.9", "--seed", "3"]
    assert main(step("regenerate", sharded_dir, prepared, outs["regen-sampled"], *sampled)) == 0
    return outs


@pytest.mark.distributed
def test_a_tp2_capture_is_the_one_process_capture(sharded_dir, prepared, one_process):
    out = prepared.parent / "capture-tp2"
    done = launch(2, *step("capture", sharded_dir, prepared, out, *CAPTURE, "--target-placement", "tp"))
    assert "1 group(s) of 2 (tensor parallel)" in done.stderr
    assert not list(out.glob("part-*")) and len(list(out.glob("shard-*.safetensors"))) == 1  # one writer
    assert read_record(out)["inputs_hash"] == read_record(one_process["capture"])["inputs_hash"]
    worst = assert_captures_close(CaptureFolder(out), CaptureFolder(one_process["capture"]))
    assert worst <= 1.0, worst
    control = assert_captures_close(
        CaptureFolder(one_process["swapped"]), CaptureFolder(one_process["capture"])
    )
    assert control > 5, control  # a wrong shard order misses the bound by far
    assert worst < control / 100, (worst, control)  # and TP sits far inside it


@pytest.mark.distributed
def test_a_tp2_greedy_regenerate_gives_the_one_process_answers(sharded_dir, prepared, one_process):
    out = prepared.parent / "regen-tp2"
    launch(2, *step("regenerate", sharded_dir, prepared, out, *REGEN, "--target-placement", "tp"))
    assert read_record(out)["inputs_hash"] == read_record(one_process["regen"])["inputs_hash"]
    assert_same_answers(out, one_process["regen"], sharded_dir)


@pytest.mark.distributed
def test_world_4_tp_2_makes_two_parts_that_read_as_one(sharded_dir, prepared, one_process):
    """Two TP groups of 2: each group's rank 0 writes one part; the folder reads as the one-process
    capture (and, sampled, regeneration: the leader samples with each (row, turn)'s own generator)."""
    out = prepared.parent / "capture-tp2x2"
    tp = ["--target-placement", "tp", "--tp-size", "2"]
    done = launch(4, *step("capture", sharded_dir, prepared, out, *CAPTURE, *tp))
    assert "2 group(s) of 2 (tensor parallel)" in done.stderr and "read as one folder" in done.stderr
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000-of-00002", "part-00001-of-00002"]
    whole = require_whole(out, "--data", ("capture",))
    assert whole["inputs_hash"] == read_record(one_process["capture"])["inputs_hash"]
    assert assert_captures_close(CaptureFolder(out), CaptureFolder(one_process["capture"])) <= 1.0

    regen = prepared.parent / "regen-tp2x2"
    sampled = [*REGEN, "--temperature", "0.9", "--seed", "3", *tp]
    launch(4, *step("regenerate", sharded_dir, prepared, regen, *sampled))
    assert len(list(regen.glob("part-*"))) == 2
    assert (
        require_whole(regen, "--data", ("regenerate",))["inputs_hash"]
        == read_record(one_process["regen-sampled"])["inputs_hash"]
    )
    assert_same_answers(regen, one_process["regen-sampled"], sharded_dir)


@pytest.mark.distributed
def test_a_driven_caches_changes_reach_the_followers(sharded_dir, tmp_path):
    """crop / compact / keep_prefixes / retain on a driven cache are replayed on the follower's copy:
    the forwards after them equal the whole target's, and a speculative decode (which changes its
    caches on its own) emits the whole target's tokens (tests/data_recipes/tp_cache_check.py)."""
    launch(2, str(sharded_dir), str(tmp_path), script=str(Path(__file__).with_name("tp_cache_check.py")))
    r = json.loads((tmp_path / "result.json").read_text())
    assert len(r["steps"]) == 5 and max(r["steps"]) <= feature_atol(r["scale"]), r
    assert r["tokens"] == r["want_tokens"] and max(r["cycles"]) > 1, r
