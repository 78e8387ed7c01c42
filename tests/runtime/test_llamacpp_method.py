"""The llama.cpp bench baselines (runtime/bench/llamacpp_method.py, runtime/workers/llamacpp_worker.py):
names parse or are refused naming the field; the GGUF defaults to the one the target folder was converted
from; the worker's decoding loop (against a fake Llama) stops at EOS or the budget, starts each request from
an empty cache and samples the target's law (no min-p, penalties); replies become BatchOutput with the
counted forwards; a fake worker exercises the process path and the row facts. Slow tests run the real
llama.cpp (.venv-llamacpp) against draftsmith's plain decoding of the same GGUF."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.runtime.bench import llamacpp_method
from draftsmith.runtime.bench.llamacpp_method import (
    LlamaCppMethod,
    batch_output,
    is_llamacpp_method,
    parse_llamacpp_method,
    target_gguf,
)
from draftsmith.runtime.bench.types import is_baseline
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[2]
LLAMACPP_PYTHON = REPO / ".venv-llamacpp" / "bin" / "python"
spec = importlib.util.spec_from_file_location("llamacpp_worker", REPO / "runtime/workers/llamacpp_worker.py")
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)

FAKE_WORKER = """
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"argv": args}) + "\\n")
print(json.dumps({"ready": True, "llama_cpp_version": "9.9", "file_type": "Q4_1"}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req.get("cmd") == "quit":
        break
    with open(os.environ["FAKE_RECORD"], "a") as f:
        f.write(json.dumps({"request": req}) + "\\n")
    ids = [[p[-1] + 1] * req["max_new_tokens"] for p in req["prompts"]]
    print(json.dumps({"token_ids": ids, "wall_s": 0.25, "ttft_s": [0.05], "forwards": [3]}), flush=True)
"""


def gguf_file(path: Path) -> Path:
    path.write_bytes(b"GGUF" + bytes(12))
    return path


def test_names_parse_or_are_refused():
    assert parse_llamacpp_method("llamacpp") == (False, None)
    assert parse_llamacpp_method("llamacpp-lookup:m.gguf") == (True, "m.gguf")
    assert is_llamacpp_method("llamacpp:x.gguf") and not is_llamacpp_method("vllm")
    assert is_baseline("llamacpp") and is_baseline("llamacpp-lookup:m.gguf") and not is_baseline("llamacpp:")
    for bad in ("llamacpp:", "llamacpp-lookup: ", "llama.cpp", "llamacpp2"):
        with pytest.raises(BadInputError, match="--baselines"):
            parse_llamacpp_method(bad)


def test_the_gguf_defaults_to_the_target_source(tmp_path):
    folder = tmp_path / "target"
    folder.mkdir()
    target = SimpleNamespace(path=str(folder))
    with pytest.raises(BadInputError, match="llamacpp:FILE.gguf") as err:
        target_gguf("llamacpp", target)  # a folder not converted from a GGUF
    assert err.value.exit_code == 2
    source = gguf_file(tmp_path / "m.Q4_1.gguf")
    (folder / llamacpp_method.CONVERSION_RECORD).write_text(json.dumps({"source": str(source)}))
    assert target_gguf("llamacpp", target) == source
    source.unlink()
    with pytest.raises(BadInputError, match="not converted from a GGUF file found here"):
        target_gguf("llamacpp", target)


def test_bad_gguf_or_no_llamacpp_is_bad_input(tmp_path, monkeypatch):
    target = SimpleNamespace(path=str(tmp_path), eos_token_ids=[2])
    with pytest.raises(BadInputError, match="no such file"):
        LlamaCppMethod(f"llamacpp:{tmp_path / 'missing.gguf'}", target)
    (tmp_path / "page.gguf").write_text("<html>")
    with pytest.raises(BadInputError, match="a GGUF file"):
        LlamaCppMethod(f"llamacpp:{tmp_path / 'page.gguf'}", target)
    monkeypatch.setattr(llamacpp_method, "find_llamacpp_python", lambda: None)
    with pytest.raises(BadInputError, match="setup_llamacpp.sh") as err:
        LlamaCppMethod(f"llamacpp:{gguf_file(tmp_path / 'ok.gguf')}", target)
    assert err.value.exit_code == 2 and err.value.field == "--baselines"


def test_reply_counts_the_worker_forwards():
    out = batch_output({"token_ids": [[5, 6, 7]], "wall_s": 0.5, "ttft_s": [0.1], "forwards": [2]})
    assert out.token_ids == [[5, 6, 7]] and out.target_forwards == 2 and out.spec is None
    assert out.wall_s == 0.5 and out.ttft_s == [0.1]


class FakeLlama:
    """llama-cpp-python's Llama as the worker uses it: generate() yields a script of tokens."""

    def __init__(self, script):
        self.script, self.calls, self.forwards = script, [], 0
        self.metadata = {"general.file_type": "3"}

    def token_eos(self):
        return 2

    def set_seed(self, seed):
        self.calls.append(("seed", seed))

    def reset(self):
        self.calls.append(("reset",))

    def generate(self, tokens, **sampler):
        self.calls.append(("generate", list(tokens), sampler))
        for token in self.script:
            self.forwards += 1
            yield token


def test_worker_stops_at_eos_or_budget_and_samples_the_law():
    llm = FakeLlama([7, 8, 2, 9])
    request = {"max_new_tokens": 10, "temperature": 0.7, "top_k": 0, "top_p": 0.9, "seed": 5}
    tokens, reason, ttft, forwards = worker.decode_one(llm, [1, 2], {**request, "eos_token_ids": [2]}, 3)
    assert (tokens, reason, forwards) == ([7, 8, 2], "stop", 3) and ttft >= 0
    assert llm.calls[0] == ("seed", 8) and llm.calls[1] == ("reset",)  # seed S + row, an empty cache
    sampler = llm.calls[2][2]
    assert (sampler["temp"], sampler["top_k"], sampler["top_p"]) == (0.7, 0, 0.9)
    assert (sampler["min_p"], sampler["typical_p"], sampler["repeat_penalty"]) == (0.0, 1.0, 1.0)
    tokens, reason, _, _ = worker.decode_one(FakeLlama([7, 8, 9, 10]), [1], {"max_new_tokens": 2}, 0)
    assert (tokens, reason) == ([7, 8], "length")
    assert worker.file_type(llm) == "Q4_1"


def test_fake_worker_round_trip_and_row_facts(monkeypatch, tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(textwrap.dedent(FAKE_WORKER))
    record = tmp_path / "record.jsonl"
    monkeypatch.setattr(llamacpp_method, "WORKER", script)
    monkeypatch.setenv("FAKE_RECORD", str(record))
    gguf = gguf_file(tmp_path / "m.gguf")
    target = SimpleNamespace(path=str(tmp_path), eos_token_ids=[2, 0])
    with LlamaCppMethod(f"llamacpp-lookup:{gguf}", target, python=sys.executable, threads=3) as method:
        out = method.run([[4]], SamplingParams(), max_new_tokens=2, seed=1)
        assert method.unsupported(2, SamplingParams()) and method.unsupported(1, SamplingParams()) is None
    assert out.token_ids == [[5, 5]] and out.target_forwards == 3
    assert method.facts == {"engine": "llama.cpp (llama-cpp-python 9.9)", "weights": "Q4_1", "gguf": "m.gguf"}
    records = [json.loads(line) for line in record.read_text().splitlines()]
    argv = records[0]["argv"]
    assert argv[argv.index("--lookup") + 1] == "10" and argv[argv.index("--threads") + 1] == "3"
    assert records[1]["request"]["eos_token_ids"] == [2, 0]


@pytest.fixture(scope="module")
def f32_gguf(smollm2, tmp_path_factory):
    """The embedded target's fp32 folder written as an F32 GGUF by llama.cpp's own converter."""
    converter = LLAMACPP_PYTHON.parents[1] / "converter"
    if not (converter / "convert_hf_to_gguf.py").is_file():
        pytest.skip("no .venv-llamacpp/converter (bash scripts/setup_llamacpp.sh builds it)")
    out = tmp_path_factory.mktemp("gguf") / "smollm2.F32.gguf"
    env = {**os.environ, "PYTHONPATH": f"{converter / 'gguf-py'}:{converter / 'deps'}"}
    cmd = [sys.executable, str(converter / "convert_hf_to_gguf.py"), str(smollm2.path), "--outtype", "f32"]
    subprocess.run([*cmd, "--outfile", str(out)], env=env, check=True, capture_output=True)
    return out


def llamacpp_rows(name: str, target, prompts, max_new_tokens: int):
    if not LLAMACPP_PYTHON.exists():
        pytest.skip("no .venv-llamacpp (bash scripts/setup_llamacpp.sh builds it)")
    with LlamaCppMethod(name, target, python=str(LLAMACPP_PYTHON)) as method:
        outs = [method.run([p], SamplingParams(), max_new_tokens, 0) for p in prompts]
        return outs, method.facts["weights"]


PROMPTS = ("Name three primary colors.", "What is 12 times 7?", "Write a haiku about the sea.")


@pytest.mark.slow
def test_llamacpp_f32_is_draftsmith_greedy(smollm2, f32_gguf):
    """llama.cpp on the same fp32 weights (F32 GGUF) decodes draftsmith's plain greedy tokens, up to
    first differences the near-tie rule accepts; one forward per token; its prompt lookup changes nothing."""
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.verify.near_tie import first_mismatch

    prompts = [smollm2.encode(p) for p in PROMPTS]
    expected = [r.token_ids for r in generate_plain(smollm2, prompts, SamplingParams(), max_new_tokens=24)]
    plain, weights = llamacpp_rows(f"llamacpp:{f32_gguf}", smollm2, prompts, 24)
    assert weights == "F32"
    for prompt, ref, out in zip(prompts, expected, plain):
        tokens = out.token_ids[0]
        assert out.target_forwards == len(tokens)  # the prefill makes the first token
        if tokens != ref:
            assert first_mismatch(smollm2, prompt, tokens, ref).near_tie, (tokens, ref)
    lookup, _ = llamacpp_rows(f"llamacpp-lookup:{f32_gguf}", smollm2, prompts, 24)
    assert [o.token_ids for o in lookup] == [o.token_ids for o in plain]
    assert sum(o.target_forwards for o in lookup) <= sum(o.target_forwards for o in plain)


@pytest.mark.slow
def test_llamacpp_runs_the_target_gguf_by_default(smollm2):
    """Without :GGUF the row runs the embedded target's own Q4_1 file, and says so."""
    outs, weights = llamacpp_rows("llamacpp", smollm2, [smollm2.encode(PROMPTS[0])], 8)
    assert weights == "Q4_1" and len(outs[0].token_ids[0]) == 8


def test_report_rows_name_the_weights():
    from draftsmith.runtime.bench.report import format_table

    base = {"temperature": 0.0, "batch_size": 1, "tokens_per_s": 90.0, "speedup_vs_plain": 3.0,
            "ttft_ms": {"median": None}, "tpot_ms": {"median": None}}  # fmt: skip
    table = format_table([{**base, "method": "llamacpp", "weights": "Q4_1"}, {**base, "method": "plain"}])
    assert "| llamacpp [Q4_1 weights] |" in table and "| plain |" in table
