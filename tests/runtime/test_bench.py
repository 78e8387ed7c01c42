"""`draftsmith bench`: prompt sources (MT-bench / Spec-Bench files, categories, line-numbered errors),
multi-turn conversations built from each method's own answers, interleaving, speedup and greedy-identity
bookkeeping on fake methods with known times, the roofline arithmetic, and the whole command on a tiny
target (results.json rows, meta.json, report.md, plots, skipped batch-1-only baselines, exit codes)."""

import json

import pytest
import torch

from draftsmith.runtime.bench import compare as bench
from draftsmith.runtime.bench.prompt_sets import BenchPrompt, load_bench_prompts
from draftsmith.runtime.bench.roofline import kv_bytes_per_token, roofline, weight_bytes
from draftsmith.runtime.bench.types import BatchOutput, SpecCounters
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["w1 w2", "w3 w4"]},
    {"question_id": 82, "category": "coding", "turns": ["w5"]},
    {"question_id": 83, "category": "writing", "turns": ["w6 w7 w8"]},
]


def write_questions(path, rows=QUESTIONS):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# ---- prompt sources ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mtbench", "specbench"])
def test_question_files_keep_turns_and_categories(tmp_path, kind):
    path = write_questions(tmp_path / "question.jsonl")
    got = load_bench_prompts(f"{kind}:{path}", 10)
    assert got[0] == BenchPrompt(("w1 w2", "w3 w4"), "writing", "81")
    assert [q.id for q in load_bench_prompts(f"{kind}:{path}", 10, ["writing"])] == ["81", "83"]
    assert len(load_bench_prompts(f"{kind}:{path}", 1)) == 1


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", "question.jsonl:2"),
        ('{"question_id": 1, "category": "x", "turns": []}', "question.jsonl:2 turns"),
        ('{"question_id": 1, "category": "x", "turns": ["", "a"]}', "question.jsonl:2 turns"),
        ('{"category": "x", "turns": ["a"]}', "question_id"),
    ],
)
def test_malformed_question_lines_name_the_line(tmp_path, line, match):
    path = tmp_path / "question.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\n" + line + "\n")
    with pytest.raises(BadInputError, match=match):
        load_bench_prompts(f"mtbench:{path}", 5)


def test_bad_sources_and_filters(tmp_path):
    path = write_questions(tmp_path / "question.jsonl")
    with pytest.raises(BadInputError, match="categories of"):
        load_bench_prompts(f"mtbench:{path}", 5, ["roleplay"])
    with pytest.raises(BadInputError, match="only question files"):
        load_bench_prompts("humaneval", 5, ["coding"])
    with pytest.raises(BadInputError, match="mtbench:FILE"):
        load_bench_prompts("mmlu", 5)
    with pytest.raises(BadInputError, match="existing"):
        load_bench_prompts(f"specbench:{tmp_path / 'missing.jsonl'}", 5)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(BadInputError, match="at least one question"):
        load_bench_prompts(f"mtbench:{tmp_path / 'empty.jsonl'}", 5)


# ---- the measurement core on fake methods -----------------------------------------------------------


class FakeTarget:
    """encode/decode on word ids; enough for run_group."""

    def encode(self, text, chat=True):
        return [int(w[1:]) for w in text.split()]

    def encode_chat(self, messages):
        return [t for m in messages for t in [90 if m["role"] == "user" else 91, *self.encode(m["content"])]]

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


class FakeMethod:
    """Answers each prompt with its last token + offset, repeated; takes `seconds_per_token` per token."""

    def __init__(self, name, seconds_per_token, offset=0, calls=None):
        self.name, self.spt, self.offset, self.calls, self.prompts = (
            name,
            seconds_per_token,
            offset,
            calls,
            [],
        )

    def run(self, prompts, params, max_new_tokens, seed):
        self.prompts += prompts
        if self.calls is not None:
            self.calls.append(self.name)
        tokens = [[(p[-1] + self.offset) % 80] * max_new_tokens for p in prompts]
        wall = self.spt * max_new_tokens
        spec = SpecCounters.from_cycles([1, 2], [2, 2]) if self.name != "plain" else None
        forwards = sum(len(t) for t in tokens) if spec is None else 3 * len(prompts)
        return BatchOutput(tokens, wall, [0.1 * wall] * len(prompts), spec, forwards)


def test_second_turn_follows_the_methods_own_answer():
    method = FakeMethod("m", 0.01, offset=1)
    conv = BenchPrompt(("w1 w2", "w3"))
    run = bench.run_group(method, FakeTarget(), [conv], SamplingParams(), 2, 0, chat=True)
    first, second = method.prompts
    assert first == [90, 1, 2]
    assert second == [90, 1, 2, 91, 3, 3, 90, 3]  # user turn 1, its own answer (w3 w3), user turn 2
    assert len(run.turns) == 2 and run.wall_s == pytest.approx(0.04)


def test_methods_rotate_and_speedup_is_a_ratio_of_rates():
    calls = []
    methods = {
        n: FakeMethod(n, s, calls=calls) for n, s in [("plain", 0.02), ("fast", 0.01), ("wrong", 0.02)]
    }
    methods["wrong"].offset = 1  # different greedy tokens: must be reported
    convs = [BenchPrompt((f"w{i}",)) for i in range(1, 4)]
    per = bench.compare_at(methods, FakeTarget(), convs, SamplingParams(), 4, 1, 1, 0, True)
    timed = calls[3:]  # after one warm-up call per method
    assert timed == ["plain", "fast", "wrong", "fast", "wrong", "plain", "wrong", "plain", "fast"]
    rows = {n: bench.summarize(n, runs, per["plain"], SamplingParams(), 1, convs) for n, runs in per.items()}
    assert rows["fast"]["speedup_vs_plain"] == pytest.approx(2.0)
    assert rows["fast"]["mean_accepted"] == pytest.approx(12 / 9, abs=1e-4)  # 4 tokens per 3 forwards
    assert rows["fast"]["efficiency"] == pytest.approx(2.0 / (12 / 9), rel=1e-3)
    assert rows["fast"]["accept_rate_per_position"] == [1.0, 0.5]
    assert rows["fast"]["accepted_length_counts"] == [0, 3, 3]
    assert rows["fast"]["greedy_identical"] is True
    assert rows["wrong"]["greedy_identical"] is False and len(rows["wrong"]["greedy_mismatches"]) == 3
    assert rows["plain"]["ttft_ms"]["median"] == pytest.approx(8.0)
    assert rows["plain"]["tpot_ms"]["median"] == pytest.approx((0.08 - 0.008) / 3 * 1000)
    assert "greedy_identical" not in bench.summarize(
        "fast", per["fast"], per["plain"], SamplingParams(1.0), 1, convs
    )


def test_spec_counters_pool_and_rate():
    c = SpecCounters.from_cycles([0, 2, 1], [2, 2, 1])
    assert c.accepted_per_position == [2, 1] and c.drafted_per_position == [3, 2]
    c.add(SpecCounters.from_cycles([3], [3]))
    assert c.accept_rates() == [3 / 4, 2 / 3, 1.0] and c.accepted_length_counts == [1, 1, 1, 1]


# ---- roofline ---------------------------------------------------------------------------------------


def test_roofline_arithmetic(tiny_target):
    weights, params = weight_bytes(tiny_target.model)
    embed = tiny_target.model.get_input_embeddings().weight
    total = sum(p.numel() for p in tiny_target.model.parameters())
    assert params == total and weights == 4 * (total - embed.numel())  # untied: the table is not read
    assert kv_bytes_per_token(tiny_target.config, torch.float32) == 2 * 3 * 2 * 16 * 4
    machine = {"bandwidth_gb_s": 1.0, "matmul_tflops": 1e-6}  # 1 GB/s, 1 MFLOP/s: compute-bound
    line = roofline(tiny_target, machine, batch_size=2, context=10)
    assert line["bound"] == "compute"
    assert line["ceiling_tokens_per_s"] == pytest.approx(2 / (2 * 2 * params / 1e6), rel=1e-3)
    fast = roofline(tiny_target, {"bandwidth_gb_s": 1e-3, "matmul_tflops": 1.0}, 1, 10)
    assert fast["bound"] == "memory"
    assert fast["memory_bound_tokens_per_s"] == pytest.approx(1e6 / fast["bytes_per_step"], abs=0.01)


# ---- the command end to end -------------------------------------------------------------------------


@pytest.fixture
def machine_cache(tmp_path, monkeypatch):
    from draftsmith.runtime.bench import roofline as roof

    monkeypatch.setattr(roof, "CACHE_DIR", tmp_path / "machine")
    monkeypatch.setattr(roof, "copy_bandwidth", lambda device: 5e9)
    monkeypatch.setattr(roof, "matmul_rate", lambda device, dtype: 1e11)


def test_bench_command_on_a_tiny_target(tiny_dir, tmp_path, machine_cache, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i} w{i + 1}"}) for i in range(4)))
    out = tmp_path / "bench"
    argv = ["bench", "--target", str(tiny_dir), "--draft", "ngram", "--draft", "self:layers=2@chain:2"]
    argv += ["--prompts", f"jsonl:{prompts}", "--num-prompts", "3", "--max-new-tokens", "6"]
    argv += ["--temperatures", "0,1", "--batch-sizes", "1,2", "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads((out / "results.json").read_text())
    methods = ["plain", "hf", "hf-prompt-lookup", "ngram@chain:2", "ngram@auto:2", "self:layers=2@chain:2"]
    assert [r["method"] for r in rows if r["temperature"] == 0 and r["batch_size"] == 1] == methods
    assert {(r["temperature"], r["batch_size"]) for r in rows} == {(0, 1), (0, 2), (1, 1), (1, 2)}
    for r in rows:
        for key in (
            "draft",
            "tree",
            "num_prompts",
            "new_tokens",
            "wall_s",
            "tokens_per_s",
            "speedup_vs_plain",
        ):
            assert key in r
        assert r["num_prompts"] == 3 and r["new_tokens"] > 0
        assert (r["temperature"] == 0) == ("greedy_identical" in r)
        assert r.get("greedy_identical", True), r
    auto = [r for r in rows if r["method"] == "ngram@auto:2"]
    assert all(len(r["depth_share"]) == 3 and abs(sum(r["depth_share"]) - 1) < 1e-3 for r in auto)
    meta = json.loads((out / "meta.json").read_text())
    assert {s["method"] for s in meta["skipped"]} == {"hf-prompt-lookup"} and meta["command"].startswith(
        "draftsmith bench"
    )
    assert meta["roofline"]["machine"]["bandwidth_gb_s"] == 5.0 and len(meta["roofline"]["lines"]) == 2
    assert meta["versions"]["torch"] and meta["request"]["seed"] == 0
    report = (out / "report.md").read_text()
    assert "## Roofline" in report and "speedup_vs_batch.png" in report and "GREEDY MISMATCH" not in report
    for png in ("speedup_vs_batch.png", "acceptance_per_position.png", "accepted_lengths.png"):
        assert (out / png).stat().st_size > 1000
    assert "| ngram@chain:2 | 0 | 1 |" in capsys.readouterr().out


def test_multi_turn_questions_through_the_command(tiny_dir, tmp_path, machine_cache):
    path = write_questions(tmp_path / "question.jsonl")
    out = tmp_path / "bench"
    argv = ["bench", "--target", str(tiny_dir), "--draft", "ngram@chain:2", "--baselines", "plain"]
    argv += ["--prompts", f"mtbench:{path}", "--max-new-tokens", "4", "--out", str(out), "--no-plots"]
    argv += ["--batch-sizes", "1"]
    assert main(argv) == 0
    rows = json.loads((out / "results.json").read_text())
    assert [r["requests"] for r in rows] == [4, 4]  # three questions, one of them with two turns
    assert all(r["greedy_identical"] for r in rows)
    cats = json.loads((out / "meta.json").read_text())["categories"]
    assert {(c["method"], c["category"]) for c in cats} == {
        (m, c) for m in ("plain", "ngram@chain:2") for c in ("coding", "writing")
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--temperatures", "0,x"], "--temperatures"),
        (["--batch-sizes", "1,two"], "--batch-sizes"),
        (["--batch-sizes", "0"], "--batch-sizes"),
        (["--temperatures", "-1"], "--temperatures"),
        (["--baselines", "plain,sglang"], "--baselines"),
        (["--prompts", "mmlu"], "--prompts"),
        (["--prompts", "humaneval", "--categories", "math"], "--categories"),
        (["--draft", "ngram@chain:0"], "--tree"),
        (["--draft", "ngram", "--tree", "auto:99"], "auto:K"),
        (["--baselines", "hf-assisted:/nowhere"], "nowhere"),
        (["--draft", "hf@chain:2+graphs"], "+graphs"),
        (["--attention", "xformers"], "--attention"),
    ],
)
def test_bad_bench_input_exits_2(tiny_dir, tmp_path, machine_cache, capsys, extra, message):
    argv = ["bench", "--target", str(tiny_dir), "--out", str(tmp_path / "b"), "--num-prompts", "1", *extra]
    if "--prompts" not in extra:
        argv += ["--prompts", "humaneval"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("attention", ["flex", "triton"])
def test_bench_with_kernel_attention_is_greedy_identical(tiny_dir, tmp_path, machine_cache, attention):
    """`--attention flex|triton` (FlexAttention eager, the kernel's reference on this CPU) in every layer of
    the target, for draftsmith's engine and transformers' generate() alike: every row equals plain."""
    out = tmp_path / "bench"
    argv = ["bench", "--target", str(tiny_dir), "--draft", "self:layers=2@static:binary-3", "--attention"]
    argv += [attention, "--baselines", "plain,hf", "--prompts", "humaneval", "--num-prompts", "2"]
    argv += [
        "--max-new-tokens",
        "6",
        "--batch-sizes",
        "1,2",
        "--out",
        str(out),
        "--no-plots",
        "--no-roofline",
    ]
    assert main(argv) == 0
    rows = json.loads((out / "results.json").read_text())
    assert len(rows) == 6 and all(r["greedy_identical"] for r in rows), rows
    assert json.loads((out / "meta.json").read_text())["request"]["attention"] == attention


def test_hf_assisted_baseline_runs_at_batch_1_only(tiny_dir, tmp_path, machine_cache):
    out = tmp_path / "bench"
    argv = ["bench", "--target", str(tiny_dir), "--baselines", f"plain,hf-assisted:{tiny_dir}"]
    argv += ["--prompts", "humaneval", "--num-prompts", "2", "--max-new-tokens", "5", "--out", str(out)]
    assert main([*argv, "--batch-sizes", "1,2", "--no-plots", "--no-roofline"]) == 0
    rows = json.loads((out / "results.json").read_text())
    assisted = [r for r in rows if r["method"].startswith("hf-assisted")]
    assert [r["batch_size"] for r in assisted] == [1] and assisted[0]["greedy_identical"]
    skipped = json.loads((out / "meta.json").read_text())["skipped"]
    assert skipped[0]["batch_size"] == 2 and "one sequence at a time" in skipped[0]["why"]
    assert "roofline" not in json.loads((out / "meta.json").read_text())


def test_graphs_suffix_runs_the_static_engine_path(tiny_dir, tmp_path, machine_cache):
    """plain+graphs and DRAFT@TREE+graphs: the static path (eager on CPU), greedy-identical to plain."""
    out = tmp_path / "bench"
    argv = ["bench", "--target", str(tiny_dir), "--baselines", "plain,plain+graphs"]
    argv += ["--draft", "ngram@chain:2+graphs", "--draft", "self:layers=1@chain:2+graphs"]
    argv += ["--prompts", "humaneval", "--num-prompts", "2", "--max-new-tokens", "6", "--out", str(out)]
    assert main([*argv, "--batch-sizes", "1,2", "--no-plots", "--no-roofline"]) == 0
    rows = json.loads((out / "results.json").read_text())
    methods = {r["method"] for r in rows}
    assert methods == {"plain", "plain+graphs", "ngram@chain:2+graphs", "self:layers=1@chain:2+graphs"}
    assert all(r["greedy_identical"] for r in rows if r["temperature"] == 0)
    from draftsmith.runtime.bench.methods import build_method
    from draftsmith.runtime.core.target import Target

    target = Target.load(str(tiny_dir), device="cpu")
    assert build_method("plain+graphs", target, [1]).static and not build_method("plain", target, [1]).static
