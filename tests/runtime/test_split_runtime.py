"""The runtime on a target split over gloo ranks (issue 42): lossless for every drafter kind, counted.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_split_runtime.py -q   # ~2 minutes (5 launches)

tests/split_worker.py runs under torchrun: rank 0 drives the engine (runtime/core/split_run.py), the other
ranks replay its target calls. Three targets, each saved as sharded safetensors: the tiny Llama at TP = 2,
a tiny Llama with 4 KV heads at TP = 4, and a tiny Qwen3-MoE at EP = 2 (experts split 4 a rank, its one
KV head whole on each rank).

Greedy identity is exact (zero mismatches) against one process's plain decoding of the same checkpoint. TP
changes only the order of float32 sums (a row-parallel o_proj / down_proj adds n partial dot products
through an all-reduce; an EP layer adds the ranks' expert outputs), a relative change of a few float32
ulps in each logit; the tiny targets' logits are sharpened (tests/tiny_models.py: LM head x 8) so their
top-two gaps are orders of magnitude above that (tests/data_recipes/test_tp_steps.py bounds the same
split's features by tests/tolerances.py's rule), and a failure names whether the first difference was a
near tie (runtime/verify/near_tie.py).

Sampled speculation on the split target is held against the split target's own exact law of the first 3
tokens (chi-square, tests/engine_checks.py) for a chain, a static tree and a dynamic tree whose drafts are
accepted (the oracle: the target's own layers) and for heads whose drafts are rejected (the residual
path); the negative control (every draft accepted) must fail the same test.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from family_models import make_family_dir
from tiny_models import random_prompts, tiny_config, tiny_tokenizer

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.verify.near_tie import first_mismatch
from draftsmith.runtime.verify.sampling import SamplingParams

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "split_worker.py"
SPLIT_DRAFTER = "self static tree (split drafter)"
PROMPTS = random_prompts(4, seed=4)  # tests/split_worker.py's


def free_port() -> int:
    with socket.socket() as s:  # other jobs on this machine may hold torchrun's default port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(size: int, *argv: str, timeout: int = 480) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run` with `size` processes, one thread each, on a free port."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={size}",
        f"--master-port={free_port()}",
    ]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.run([*cmd, *argv], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def launch(folder: Path, placement: str, size: int, what: str, out: Path) -> dict:
    done = torchrun(size, str(WORKER), str(folder), placement, str(size), what, str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def llama_dir(path: Path, kv_heads: int = 2) -> Path:
    from transformers import AutoModelForCausalLM

    config = tiny_config()
    config.num_key_value_heads = kv_heads
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharpened, as tests/tiny_models.py's
    model.save_pretrained(path, max_shard_size="200KB")
    tiny_tokenizer().save_pretrained(path)
    assert len(list(path.glob("model-*.safetensors"))) > 1  # a sharded checkpoint with an index
    return path


SETUPS = {
    "llama tp 2": (lambda p: llama_dir(p), "tp", 2),
    "llama tp 4": (lambda p: llama_dir(p, kv_heads=4), "tp", 4),
    "qwen3_moe ep 2": (lambda p: make_family_dir(p, "qwen3_moe"), "ep", 2),
}


LAW_SETUPS = {k: SETUPS[k] for k in ("llama tp 2", "qwen3_moe ep 2")}


@pytest.fixture(scope="module", params=list(SETUPS))
def greedy_run(request, tmp_path_factory):
    make, placement, size = SETUPS[request.param]
    folder = make(tmp_path_factory.mktemp(request.param.replace(" ", "-")))
    got = launch(folder, placement, size, "greedy", folder / "greedy.json")
    target = Target.load(str(folder), device="cpu", dtype="float32")
    plain = generate_plain(target, PROMPTS, SamplingParams(), 16, batch_size=2)
    return request.param, got, plain, target


def test_every_drafter_on_a_split_target_gives_one_process_plain_greedy(greedy_run):
    name, got, plain, target = greedy_run
    runs = {k: v for k, v in got.items() if "tokens" in v}
    assert len(runs) == 19  # plain, 13 drafters (SSD, the drafter process), 4 static paths, auto:3
    for kind, run in runs.items():
        for prompt, got_ids, want in zip(PROMPTS, run["tokens"], plain, strict=True):
            mismatch = first_mismatch(target, prompt, got_ids, want.token_ids)
            assert mismatch is None, f"{name}: {kind} differs from one-process plain greedy: {mismatch}"


def test_a_drafter_at_tp_1_adds_no_collective_and_a_cycle_costs_one_message(greedy_run):
    """The design's claim as a count: a cycle costs the group what a plain step costs (one message from
    rank 0: its length and its bytes, two c10d broadcasts, carrying the candidates and the last cycle's
    cache compaction; the layers' all-reduces), and drafting at TP = 1 issues nothing. The split drafter
    (self: the target's own first layer) pays all-reduces and messages in its draft phase."""
    name, got, _, _ = greedy_run
    step = got["plain"]["collectives"]["per_cycle"]["step"]
    assert step["broadcast"]["count"] == 2 and step["all_reduce"]["count"] > 0
    for kind, run in got.items():
        if "collectives" not in run or kind in ("plain", SPLIT_DRAFTER):
            continue
        per_cycle = run["collectives"]["per_cycle"]
        assert per_cycle.get("draft", {}) == {}, (
            f"{name}: {kind} drafts with collectives {per_cycle['draft']}"
        )
        verify = {k: v["count"] for k, v in per_cycle["verify"].items()}
        assert verify == {k: v["count"] for k, v in step.items()}, f"{name}: {kind}"
    split = got[SPLIT_DRAFTER]["collectives"]["per_cycle"]["draft"]
    assert split["all_reduce"]["count"] > 0 and split["broadcast"]["count"] > 0


def test_ssd_over_a_split_drafter_is_refused_clearly(greedy_run):
    name, got, _, _ = greedy_run
    error = got["ssd over self"]["error"]
    assert error and "cannot be copied" in error and "TP = 1" in error


def test_self_drafting_on_the_static_path_of_a_split_target_is_refused(greedy_run):
    error = greedy_run[1]["self static path"]["error"]
    assert error and "--cuda-graphs" in error and "TP = 1" in error


@pytest.mark.parametrize("setup", list(LAW_SETUPS))
def test_sampled_speculation_on_a_split_target_keeps_its_law(setup, tmp_path):
    make, placement, size = LAW_SETUPS[setup]
    got = launch(make(tmp_path / "target"), placement, size, "laws", tmp_path / "laws.json")
    control = got.pop("control: always accept (must fail)")
    assert control["stat"] > control["threshold"], f"the law test did not see always-accept: {control}"
    for name, check in got.items():
        assert check["stat"] < check["threshold"], (
            f"{name}: chi2 {check['stat']:.1f} >= {check['threshold']:.1f}"
        )
    assert min(got[k]["tau"] for k in got if k.startswith("oracle")) > 3  # accepting paths were exercised


def test_a_follower_that_dies_ends_rank_0_with_an_error_not_a_hang(tmp_path):
    folder = llama_dir(tmp_path / "llama")
    out = tmp_path / "died.json"
    start = time.perf_counter()
    done = torchrun(2, str(WORKER), str(folder), "tp", "2", "follower dies", str(out), timeout=240)
    assert done.returncode != 0  # torchrun reports the follower's exit
    assert time.perf_counter() - start < 100  # well inside the worker's 120 s process-group timeout
    error = json.loads(out.read_text())["error"]
    assert error and "rank 0: waiting for the group's other ranks failed" in error


def torchrun_cli(argv: list[str], size: int = 2) -> subprocess.CompletedProcess:
    return torchrun(size, "-m", "draftsmith.runtime.cli", *argv, timeout=300)


def test_generate_and_bench_run_on_a_split_target_under_torchrun(tmp_path):
    """The verbs end to end: rows only from rank 0, the split target's answers, collectives counted."""
    folder = llama_dir(tmp_path / "llama")
    common = ["--target", str(folder), "--device", "cpu", "--dtype", "float32", "--no-chat"]
    split = ["--target-placement", "tp", "--tp-size", "2"]
    prompt = ["--prompt", "w1 w2 w3 w1 w2 w3 w1", "--max-new-tokens", "12"]
    done = torchrun_cli(["generate", *split, *common, *prompt, "--draft", "ngram", "--json"])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1  # rank 1 prints nothing
    target = Target.load(str(folder), device="cpu", dtype="float32")
    plain = generate_plain(target, [rows[0]["prompt_token_ids"]], SamplingParams(), 12)
    assert rows[0]["token_ids"] == plain[0].token_ids
    per_cycle = rows[0]["collectives"]["per_cycle"]
    assert per_cycle["draft"] == {} and per_cycle["verify"]["broadcast"]["count"] == 2
    out = tmp_path / "bench"
    bench = [
        "bench",
        *split,
        *common,
        "--prompts",
        "humaneval",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "8",
    ]
    bench += ["--batch-sizes", "1", "--baselines", "plain", "--draft", "ngram", "--tree", "chain:2"]
    done = torchrun_cli([*bench, "--no-plots", "--no-roofline", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads((out / "results.json").read_text())
    rows = found["rows"] if isinstance(found, dict) else found
    assert {r["method"] for r in rows} == {"plain", "ngram@chain:2"}
    assert all(r["greedy_identical"] for r in rows if "greedy_identical" in r)
    assert all(
        "verify" in r["collectives"]["per_cycle"] or "step" in r["collectives"]["per_cycle"] for r in rows
    )
