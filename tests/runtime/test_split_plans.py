"""Split-target plans refused before anything loads (runtime/core/split_run.py), and the collective counter
(runtime/core/collectives.py) on a one-process gloo group. No processes are launched here."""

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from family_models import make_family_dir
from tiny_models import make_tiny_dir

from draftsmith.runtime.core.collectives import CollectiveCounter, collective_kind, per_cycle
from draftsmith.runtime.core.launch import Launch
from draftsmith.runtime.core.split_run import Split, plan_split
from draftsmith.runtime.errors import BadInputError


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(make_tiny_dir(tmp_path_factory.mktemp("llama")))  # 4 query heads over 2 KV heads


def refused(split: Split, folder: str, launch: Launch) -> BadInputError:
    with pytest.raises(BadInputError) as err:
        plan_split(split, "generate", folder, launch)
    return err.value


def test_a_placement_without_a_launcher_names_the_torchrun_line(llama):
    err = refused(Split("tp", tp_size=2), llama, Launch())
    assert err.field == "--target-placement" and "WORLD_SIZE unset" in str(err.got)
    assert "torchrun --nproc-per-node 2 -m draftsmith.runtime.cli generate --target-placement tp" in str(err)


def test_sizes_the_heads_or_the_launch_cannot_take_are_refused(llama):
    err = refused(Split("tp", tp_size=3), llama, Launch(world=3, local_world=3))
    assert err.field == "--tp-size"  # 4 heads over 3 ranks
    err = refused(Split("tp", tp_size=2), llama, Launch(world=4, local_world=4))
    assert err.field == "--tp-size" and "one group" in str(err)  # generate runs one engine, not 2 groups
    err = refused(Split("replicate"), llama, Launch(world=2, local_world=2))
    assert err.field == "--target-placement" and "tp or ep" in str(err)


def test_ep_for_a_dense_target_and_a_bad_timeout_are_refused(llama, tmp_path):
    err = refused(Split("ep", ep_size=2), llama, Launch(world=2, local_world=2))
    assert err.field == "--target-placement" and "dense" in str(err)
    err = refused(Split("tp", tp_size=2, timeout_s=0), llama, Launch(world=2, local_world=2))
    assert err.field == "--process-group-timeout-s"
    moe = str(make_family_dir(tmp_path / "moe", "qwen3_moe"))  # 8 experts
    err = refused(Split("ep", ep_size=3), moe, Launch(world=3, local_world=3))
    assert err.field == "--ep-size"


def test_a_group_of_one_or_no_split_is_the_whole_target(llama):
    assert plan_split(Split(), "generate", llama, Launch()) is None
    assert plan_split(Split("tp", tp_size=1), "generate", llama, Launch()) is None
    layout = plan_split(Split("tp", tp_size=2), "generate", llama, Launch(world=2, rank=1, local_world=2))
    assert (layout.tp, layout.tp_rank, layout.dp) == (2, 1, 1)


def test_collective_kinds_by_op_name():
    assert collective_kind("c10d::allreduce_") == "all_reduce"
    assert collective_kind("_c10d_functional::all_gather_into_tensor") == "all_gather"
    assert collective_kind("c10d::_reduce_scatter_base_") == "reduce_scatter"
    assert collective_kind("c10d::broadcast_") == "broadcast"
    assert collective_kind("_c10d_functional::wait_tensor") is None
    assert collective_kind("aten::mm") is None


def test_the_counter_counts_collectives_and_bytes_by_phase(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setitem(os.environ, "MASTER_ADDR", "127.0.0.1")
    monkeypatch.setitem(os.environ, "MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        counter = CollectiveCounter()
        x = torch.ones(10)  # 40 bytes
        with counter:
            dist.all_reduce(x)  # outside any phase: "other"
            for _ in range(3):
                with counter.phase("verify"):
                    dist.all_reduce(x)
                    dist.broadcast(x, src=0)
                    _ = x @ x  # not a collective
            with counter.phase("draft"):
                pass
            dist.broadcast_object_list([{"tokens": [1, 2, 3]}], src=0)  # its length, then its bytes
        report = counter.report()
    finally:
        dist.destroy_process_group()
    assert report["verify"]["entries"] == 3
    assert report["verify"]["all_reduce"] == {"count": 3, "bytes": 120}
    assert report["verify"]["broadcast"] == {"count": 3, "bytes": 120}
    assert report["other"]["all_reduce"]["count"] == 1 and report["other"]["broadcast"]["count"] == 2
    cycles = per_cycle(report)
    assert cycles["cycles"] == 3 and cycles["per_cycle"]["verify"]["all_reduce"] == {
        "count": 1.0,
        "bytes": 40.0,
    }
    assert (
        cycles["per_cycle"]["draft"] == {} and "other" not in cycles["per_cycle"]
    )  # entered, nothing issued


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    from draftsmith.runtime.cli.main import main

    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("verb", ["generate", "bench"])
def test_the_verbs_refuse_a_split_without_a_launcher_or_with_what_it_cannot_run(
    verb, llama, capsys, monkeypatch
):
    for name in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    run = ["--prompt", "w1 w2", "--max-new-tokens", "2"] if verb == "generate" else ["--baselines", "plain"]
    split = ["--target-placement", "tp", "--tp-size", "2", "--target", llama, "--device", "cpu"]
    code, err = run_cli([verb, *split, *run], capsys)
    assert code == 2 and f"torchrun --nproc-per-node 2 -m draftsmith.runtime.cli {verb}" in err
    code, err = run_cli([verb, *split, *run, "--quantize", "int8"], capsys)
    assert code == 2 and "--quantize" in err and "split target" in err
    if verb == "bench":
        code, err = run_cli([verb, *split, "--baselines", "plain,hf"], capsys)
        assert code == 2 and "--baselines" in err and "plain only" in err
    else:
        code, err = run_cli([verb, *split, *run, "--attention", "triton"], capsys)
        assert code == 2 and "--attention" in err


def test_the_module_entry_torchrun_launches_exits_with_main_s_code():
    """`python -m draftsmith.runtime.cli` (what every torchrun line runs) exits 2 on bad input, as the
    `draftsmith` script does (it used to drop main's code and exit 0)."""
    import subprocess
    import sys

    argv = [
        sys.executable,
        "-m",
        "draftsmith.runtime.cli",
        "generate",
        "--max-new-tokens",
        "0",
        "--prompt",
        "hi",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--max-new-tokens" in done.stderr
