"""The vLLM bench baselines (runtime/bench/vllm_method.py): method names parse or are refused naming the
field;
the vLLM Python is found in the documented order; worker replies become BatchOutput/SpecCounters by the
bench's counting conventions; a fake worker speaking the JSON-lines protocol exercises the process handling
(ready, requests, an error line -> exit code 2, a crash quoting its log, a hang killed after the timeout);
a draftsmith head is exported in its kind's vLLM layout (the kind's `vllm` declaration), foreign folders pass
as they are. One slow test runs the real vLLM (.venv-vllm) and checks greedy ids against draftsmith's plain
decoding."""

import json
import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from draftsmith.runtime.bench import vllm_method, worker_method
from draftsmith.runtime.bench.vllm_method import (
    VllmMethod,
    batch_output,
    build_vllm_method,
    find_vllm_python,
    head_for_vllm,
    is_vllm_method,
    parse_vllm_method,
    spec_counters,
)
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, save_head
from draftsmith.runtime.heads.head_kind import LayoutOptions
from draftsmith.runtime.verify.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[2]
VLLM = LayoutOptions(engine="vllm")
FAKE_WORKER = """
import json, os, sys, time
mode, args = os.environ.get("FAKE_MODE", "ok"), sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "argv": args}) + "\\n")
if mode == "load_error":
    print(json.dumps({"error": "RuntimeError: cannot load", "traceback": "..."}), flush=True)
    sys.exit(3)
if mode == "crash":
    sys.stderr.write("Fatal: the engine died\\n")
    sys.exit(1)
if mode == "hang":
    time.sleep(120)
spec = "--speculative-config"
spec_config = json.loads(args[args.index(spec) + 1]) if spec in args else None
k = spec_config["num_speculative_tokens"] if spec_config else None
eager = "--enforce-eager" in args  # as vLLM: a GPU build with graphs reports device cuda, enforce_eager False
tp = int(args[args.index("--tensor-parallel-size") + 1])
ready = {"ready": True, "device": "cpu" if eager else "cuda", "has_triton": False, "enforce_eager": eager}
print(json.dumps({**ready, "speculative_config": spec_config, "tensor_parallel_size": tp}))
sys.stdout.flush()
for line in sys.stdin:
    req = json.loads(line)
    if req.get("cmd") == "quit":
        break
    with open(os.environ["FAKE_RECORD"], "a") as f:
        f.write(json.dumps({"request": req}) + "\\n")
    if mode == "run_error":
        print(json.dumps({"error": "ValueError: bad request", "traceback": "..."}), flush=True)
        continue
    ids = [[p[-1] + i + 1 for i in range(req["max_new_tokens"])] for p in req["prompts"]]
    spec = k and {"drafts": 4, "draft_tokens": 4 * k, "accepted_tokens": 3, "accepted_per_pos": [2, 1, 0]}
    reply = {"token_ids": ids, "wall_s": 0.5, "ttft_s": [0.1, None][: len(ids)], "spec": spec}
    print(json.dumps(reply), flush=True)
"""


# ---- names and the vLLM Python ------------------------------------------------------------------------


def test_method_names_parse():
    assert parse_vllm_method("vllm") is None
    assert parse_vllm_method("vllm-eagle3:runs/x/final") == (head_kinds.get("eagle3"), "runs/x/final")
    assert parse_vllm_method("vllm-medusa:m") == (head_kinds.get("medusa"), "m")
    assert is_vllm_method("vllm") and is_vllm_method("vllm-eagle3:d") and not is_vllm_method("eagle3:d")
    for bad in ("vllm-eagle3:", "vllm-eagle3: ", "vllm-ngram:x", "vllm-mtp", "plain", "VLLM"):
        with pytest.raises(BadInputError, match="--baselines"):
            parse_vllm_method(bad)
    with pytest.raises(BadInputError, match="@chain:K"):
        build_vllm_method("vllm-eagle3:d@static:binary-3", SimpleNamespace(path="/x"), 1, 256)


def test_every_kind_vllm_serves_declares_a_layout_it_has():
    """eagle3, peagle, mtp, medusa, dflash declare how vLLM serves them; the layout is one of theirs."""
    served = {name: kind.vllm for name, kind in head_kinds.KINDS.items() if kind.vllm is not None}
    assert set(served) == {"eagle3", "peagle", "mtp", "medusa", "dflash"}
    for name, serve in served.items():
        assert serve.layout in head_kinds.get(name).layouts, name
    assert served["mtp"].speculative_config("out", 1) == {"method": "mtp", "num_speculative_tokens": 1}
    assert served["peagle"].speculative_config("out", 3) == {
        "method": "eagle3", "model": "out", "num_speculative_tokens": 3, "parallel_drafting": True
    }  # fmt: skip


def fake_find_spec(has_vllm: bool):
    real = worker_method.importlib.util.find_spec
    return lambda name, *a: (object() if has_vllm else None) if name == "vllm" else real(name, *a)


def test_find_vllm_python_order(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(worker_method.importlib.util, "find_spec", fake_find_spec(True))
    assert find_vllm_python() == sys.executable
    monkeypatch.setattr(worker_method.importlib.util, "find_spec", fake_find_spec(False))
    assert find_vllm_python() is None
    local = tmp_path / ".venv-vllm" / "bin" / "python"
    local.parent.mkdir(parents=True)
    local.touch()
    assert find_vllm_python() == str(local)
    monkeypatch.setenv("DRAFTSMITH_VLLM_PYTHON", "/opt/vllm/bin/python")
    assert find_vllm_python() == "/opt/vllm/bin/python"


def test_no_vllm_python_or_no_target_folder_is_bad_input(monkeypatch):
    monkeypatch.setattr(vllm_method, "find_vllm_python", lambda: None)
    with pytest.raises(BadInputError, match="check_vllm.sh --keep-env") as err:
        VllmMethod("vllm", SimpleNamespace(path="/x"), None, 3, 1, 256)
    assert err.value.exit_code == 2 and err.value.field == "--baselines"
    monkeypatch.setattr(vllm_method, "find_vllm_python", lambda: "/nowhere/bin/python")
    with pytest.raises(BadInputError, match="/nowhere/bin/python"):
        VllmMethod("vllm", SimpleNamespace(path="/x"), None, 3, 1, 256)
    with pytest.raises(BadInputError, match="local folder"):
        VllmMethod("vllm", SimpleNamespace(path=None), None, 3, 1, 256, python=sys.executable)


# ---- replies -> BatchOutput ---------------------------------------------------------------------------


def test_plain_reply_counts_one_forward_per_token():
    reply = {"token_ids": [[5, 6, 7], [8]], "wall_s": 1.5, "ttft_s": [0.2, None], "spec": None}
    out = batch_output(reply, None)
    assert out.token_ids == [[5, 6, 7], [8]] and out.wall_s == 1.5 and out.ttft_s == [0.2, None]
    assert out.spec is None and out.target_forwards == 4


def test_spec_reply_follows_the_bench_conventions():
    spec = {"drafts": 10, "draft_tokens": 30, "accepted_tokens": 9, "accepted_per_pos": [6, 2, 1]}
    counters = spec_counters(spec, 3)
    assert (counters.cycles, counters.drafted_tokens, counters.accepted_tokens) == (10, 30, 9)
    assert counters.drafted_per_position == [10, 10, 10] and counters.accepted_length_counts is None
    assert counters.accept_rates() == [0.6, 0.2, 0.1]
    reply = {"token_ids": [[1] * 12, [2] * 7], "wall_s": 2.0, "ttft_s": [0.1, 0.3], "spec": spec}
    out = batch_output(reply, 3)
    assert out.spec == counters and out.target_forwards == 2 + 10  # one prefill per request + cycles


# ---- process handling with a fake worker ----------------------------------------------------------------


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """The fake worker in place of vllm_worker.py; returns the records it writes (argv, pid, requests)."""
    script = tmp_path / "fake_worker.py"
    script.write_text(textwrap.dedent(FAKE_WORKER))
    record = tmp_path / "record.jsonl"
    monkeypatch.setattr(vllm_method, "WORKER", script)
    monkeypatch.setenv("FAKE_RECORD", str(record))
    return lambda: [json.loads(line) for line in record.read_text().splitlines()]


def make(name="vllm", **kw):
    target = SimpleNamespace(path="/targets/tiny", dtype=torch.float32)
    return VllmMethod(name, target, parse_vllm_method(name), 3, 2, 256, python=sys.executable, **kw)


def kept_log(err: pytest.ExceptionInfo) -> Path:
    """The log a failed worker leaves, named in the error (removed here, after checking it is there)."""
    log = Path(str(err.value).split("worker log ")[1].split(" ends")[0])
    assert log.is_file()
    log.unlink()
    return log


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_fake_worker_round_trip(fake):
    with make() as method:
        out = method.run([[1, 2], [10]], SamplingParams(temperature=0.7, top_k=5), max_new_tokens=3, seed=9)
        assert out.token_ids == [[3, 4, 5], [11, 12, 13]] and out.ttft_s == [0.1, None]
        assert out.spec is None and out.target_forwards == 6
    records = fake()
    argv = records[0]["argv"]
    assert argv[argv.index("--model") + 1] == "/targets/tiny" and "--draft" not in argv
    assert argv[argv.index("--dtype") + 1] == "float32" and argv[argv.index("--max-num-seqs") + 1] == "2"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1" and "--enforce-eager" in argv  # no GPU here
    request = records[1]["request"]
    assert (request["temperature"], request["top_k"], request["top_p"], request["seed"]) == (0.7, 5, 1.0, 9)
    assert method.proc is None and gone(records[0]["pid"]) and not method.log_path.exists()


def test_on_a_gpu_the_rows_run_with_cuda_graphs_over_the_tp_size(fake):
    """A fair GPU baseline: vLLM's CUDA graphs (no --enforce-eager) and its tensor parallelism; the row's
    facts are what the worker says vLLM built."""
    target = SimpleNamespace(path="/targets/tiny", dtype=torch.float32, device=torch.device("cuda"))
    with VllmMethod("vllm", target, None, 3, 2, 256, python=sys.executable, tp_size=4) as method:
        assert method.facts["vllm_tp"] == 4 and method.facts["cuda_graphs"] is True
    argv = fake()[0]["argv"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4" and "--enforce-eager" not in argv


def test_fake_worker_speculative(fake, tmp_path):
    head = tmp_path / "official"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    with make(f"vllm-eagle3:{head}") as method:
        out = method.run([[1], [2]], SamplingParams(), max_new_tokens=4, seed=0)
        with pytest.raises(BadInputError, match="triton-cpu"):  # vLLM-CPU's spec sampler: junk without it
            method.run([[1]], SamplingParams(temperature=0.5), max_new_tokens=4, seed=0)
    assert out.spec.cycles == 4 and out.spec.accepted_per_position == [2, 1, 0]
    assert out.spec.drafted_per_position == [4, 4, 4] and out.target_forwards == 2 + 4
    argv = fake()[0]["argv"]
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    assert argv[argv.index("--model") + 1] == "/targets/tiny"
    assert len(fake()) == 2  # the refused request never reached the worker


def test_an_export_holding_the_target_is_served_as_the_model(fake, monkeypatch, tmp_path):
    """MTP's MiMo export is the target with the module: vLLM serves it as the model, the speculative
    config names no draft model; the layout is written with the bench's target as --target."""
    seen = {}

    def export(kind, head, tmp, options):
        seen.update(kind=kind.name, head=head, options=options)
        return str(tmp / "head")

    monkeypatch.setattr(vllm_method, "head_for_vllm", export)
    with make("vllm-mtp:runs/mtp/final") as method:
        assert method.k == 3
    argv = fake()[0]["argv"]
    assert argv[argv.index("--model") + 1] == str(method.tmp / "head")
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "mtp", "num_speculative_tokens": 3}
    assert seen["kind"] == "mtp" and seen["head"] == "runs/mtp/final"
    assert (seen["options"].target, seen["options"].engine) == ("/targets/tiny", "vllm")


def test_worker_load_error_is_bad_input(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "load_error")
    with pytest.raises(BadInputError, match="RuntimeError: cannot load") as err:
        make()
    assert err.value.exit_code == 2 and gone(fake()[0]["pid"])
    kept_log(err)


def test_worker_crash_quotes_its_log(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "crash")
    with pytest.raises(BadInputError, match="the engine died") as err:
        make()
    assert "exited (code 1)" in str(err.value)
    kept_log(err)


def test_worker_hang_times_out_and_is_killed(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "hang")
    with pytest.raises(BadInputError, match="did not answer in 1 s") as err:
        make(ready_timeout_s=1.0)
    assert gone(fake()[0]["pid"])
    kept_log(err)


def test_request_error_raises_and_worker_stays(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "run_error")
    method = make()
    try:
        with pytest.raises(DraftsmithError, match="ValueError: bad request"):
            method.run([[1]], SamplingParams(), max_new_tokens=2, seed=0)
        assert method.proc.poll() is None
    finally:
        method.close()
    method.log_path.unlink(missing_ok=True)
    assert gone(fake()[0]["pid"])


# ---- heads for vLLM ------------------------------------------------------------------------------------


def test_draftsmith_head_is_exported_with_vllm_ids(tiny_target, tmp_path):
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(tiny_target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64))
    head.set_draft_vocab(torch.arange(0, 128, 2))
    save_head(head, tmp_path / "run" / "final")
    eagle3 = head_kinds.get("eagle3")
    for given in (tmp_path / "run" / "final", tmp_path / "run"):  # a head folder, or a run folder
        out = Path(head_for_vllm(eagle3, str(given), tmp_path / f"tmp-{given.name}", VLLM))
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        assert config["draftsmith"]["aux_ids_written_for"] == "vllm"
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


def test_foreign_heads_pass_as_they_are_or_are_refused(tmp_path):
    official, speculators, sglang = tmp_path / "official", tmp_path / "spec", tmp_path / "sglang"
    configs = {
        official: {"architectures": ["LlamaForCausalLMEagle3"]},
        speculators: {"speculators_model_type": "eagle3"},
        sglang: {
            "architectures": ["LlamaForCausalLMEagle3"],
            "draftsmith": {"aux_ids_written_for": "sglang"},
        },
    }
    for folder, config in configs.items():
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    eagle3 = head_kinds.get("eagle3")
    assert head_for_vllm(eagle3, str(official), tmp_path, VLLM) == str(official)
    assert head_for_vllm(eagle3, str(speculators), tmp_path, VLLM) == str(speculators)
    with pytest.raises(BadInputError, match="SGLang's ids"):
        head_for_vllm(eagle3, str(sglang), tmp_path, VLLM)
    with pytest.raises(BadInputError, match="--baselines"):
        head_for_vllm(eagle3, str(tmp_path / "missing"), tmp_path, VLLM)


def test_a_head_of_another_kind_is_refused_naming_it(tiny_target, tmp_path):
    head = Eagle3Head(Eagle3Config.for_target(tiny_target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64))
    head.set_draft_vocab(torch.arange(0, 128, 2))
    save_head(head, tmp_path / "final")
    with pytest.raises(BadInputError, match="head_type is eagle3") as err:
        head_for_vllm(head_kinds.get("medusa"), str(tmp_path / "final"), tmp_path / "tmp", VLLM)
    assert err.value.field == "--baselines"


# ---- the real vLLM -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_vllm_matches_draftsmith_greedy(smollm2, monkeypatch):
    """Plain vLLM and vLLM EAGLE-3 (our head, exported) give draftsmith's greedy ids; sane counters."""
    from draftsmith.runtime.core.engine import generate_plain

    python, head = REPO / ".venv-vllm" / "bin" / "python", REPO / "runs" / "eagle3-smollm2-135m" / "final"
    if not python.exists():
        pytest.skip("no .venv-vllm (bash scripts/check_vllm.sh --keep-env builds it)")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    prompts = [smollm2.encode("Name three primary colors."), smollm2.encode("What is 12 times 7?")]
    params = SamplingParams()
    expected = [r.token_ids for r in generate_plain(smollm2, prompts, params, max_new_tokens=12)]
    methods = [("vllm", None)] + ([(f"vllm-eagle3:{head}", str(head))] if head.is_dir() else [])
    for name, head_dir in methods:
        spec = parse_vllm_method(name)
        with VllmMethod(name, smollm2, spec, 2, 2, 512, python=str(python)) as method:
            out = method.run(prompts, params, max_new_tokens=12, seed=0)
        assert out.token_ids == expected, name
        assert all(t is None or 0 < t <= out.wall_s for t in out.ttft_s)
        if head_dir is None:
            assert out.spec is None and out.target_forwards == sum(map(len, expected))
        else:
            assert out.spec.cycles > 0 and out.spec.drafted_per_position == [out.spec.cycles] * 2
            assert all(a <= d for a, d in zip(out.spec.accepted_per_position, out.spec.drafted_per_position))
            assert out.target_forwards == len(prompts) + out.spec.cycles
    if not head.is_dir():
        pytest.skip(f"plain vLLM checked; no head at {head} for vllm-eagle3")
