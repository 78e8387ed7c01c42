"""`generate --ssd` and `--draft-process` on the command line: tokens equal to plain decoding, the "ssd"
metrics and the trace in --json, bad input -> exit 2.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/runtime/test_ssd_cli.py -q [-m distributed]
"""

import json

import pytest

from draftsmith.runtime.bench.ssd_replay import fit_cost, read_trace, simulate
from draftsmith.runtime.cli.main import main


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def base(tiny_dir):
    return [
        "generate",
        "--target",
        str(tiny_dir),
        "--prompt",
        "w1 w2 w1 w2 w1",
        "--max-new-tokens",
        "16",
        "--json",
    ]


def test_ssd_json_equals_plain_and_traces(tiny_dir, tmp_path, capsys):
    code, out, err = run(base(tiny_dir), capsys)
    assert code == 0, err
    plain = json.loads(out)
    trace = tmp_path / "trace.jsonl"
    extra = ["--draft", "self:layers=2", "--tree", "chain:3", "--ssd", "--ssd-fanout", "6"]
    code, out, err = run([*base(tiny_dir), *extra, "--ssd-trace", str(trace)], capsys)
    assert code == 0, err
    row = json.loads(out)
    assert row["token_ids"] == plain["token_ids"]
    assert row["accepted_lengths"] and len(row["accepted_lengths"]) == row["cycles"]
    ssd = row["ssd"]
    assert ssd["fanout_budget"] == 6 and len(ssd["hit_rate_per_position"]) == 4
    assert ssd["lookups"] == row["cycles"] - 1
    cycles = read_trace(trace)
    assert [c.accepted for c in cycles] == row["accepted_lengths"]
    pred = simulate(cycles, 6, fit_cost(cycles))
    assert pred.tokens == sum(a + 1 for a in row["accepted_lengths"])


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--draft", "ngram", "--tree", "chain:3", "--ssd", "--ssd-fanout", "3"], "--ssd-fanout"),
        (
            ["--draft", "ngram", "--tree", "chain:2", "--draft-process", "--draft-device", "cuda:9"],
            "--draft-device",
        ),
        (["--draft", "ngram", "--draft-device", "cpu"], "--draft-device"),
        (["--draft", "ngram", "--tree", "static:binary-3", "--ssd"], "--tree"),
        (["--draft", "ngram", "--tree", "auto:2", "--ssd"], "--tree"),
        (["--draft", "none", "--ssd"], "--draft"),
        (["--draft", "self:layers=1", "--tree", "chain:2", "--ssd", "--ssd-saguaro", "0"], "--ssd-saguaro"),
        (["--draft", "eagle3:/nowhere", "--draft-process"], "--draft"),
    ],
)
def test_bad_ssd_flags_exit_2(tiny_dir, capsys, extra, field):
    code, out, err = run(["generate", "--target", str(tiny_dir), "--prompt", "w1", *extra], capsys)
    assert code == 2, err
    assert field in err and "expected" in err and out == ""


@pytest.mark.distributed
def test_draft_process_json_equals_plain(tiny_dir, capsys):
    code, out, err = run(base(tiny_dir), capsys)
    plain = json.loads(out)
    extra = ["--draft", "self:layers=2", "--tree", "chain:2", "--draft-process", "--ssd", "--ssd-fanout", "4"]
    code, out, err = run([*base(tiny_dir), *extra], capsys)
    assert code == 0, err
    row = json.loads(out)
    assert row["token_ids"] == plain["token_ids"]
    assert row["ssd"]["target_idle_s"] > 0 and "hit_rate" in row["ssd"]


@pytest.mark.distributed
def test_draft_process_that_cannot_load_its_drafter_exits_2(tiny_dir, tmp_path, capsys):
    extra = ["--draft", f"model:{tmp_path / 'missing'}", "--tree", "chain:2", "--draft-process"]
    code, out, err = run([*base(tiny_dir), *extra], capsys)
    assert code == 2, err
    assert "--draft" in err and out == ""
