"""`data regenerate|capture --engine vllm` without vLLM: the requests, per-(row, turn) seeds, resume
bookkeeping and capture feeding, driven by a fake worker that answers with draftsmith's own engine on
the tiny target (so the vLLM path must reproduce `regenerate` exactly), plus the bad inputs (MLA under
--engine vllm among them). The GPU path's arguments (each build's flags, the worker's LLM(...) arguments,
the CPU connector's private vLLM names) are checked without a GPU in test_vllm_gpu_path.py. The runs with
a real vLLM are in scripts/check_vllm.sh data (a 3.4 GB venv: not CI's default suite); the recipes
(scripts/vllm_data_parallel.sh, vllm_env_gpu.sh) in test_vllm_recipes.py."""

import json
import random
import sys

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
from draftsmith.runtime.errors import BadInputError
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
