"""The `draftsmith` command: --help on every verb, the generate --json contract, bad input -> exit 2."""

import json
import subprocess
import sys

import pytest
from tiny_models import make_tiny_dir

from draftsmith.runtime.cli.main import build_parser, main

CONTRACT_FIELDS = {
    "prompt_token_ids", "token_ids", "text", "new_tokens", "target_forwards", "mean_accepted",
    "accept_rate_per_position", "wall_s", "tokens_per_s",
}  # fmt: skip


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("verb", ["generate", "demo", "calibrate"])
def test_help_on_every_verb_teaches(verb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([verb, "--help"])
    assert exit_info.value.code == 0
    assert "examples:" in capsys.readouterr().out


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "draftsmith.runtime.cli", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "generate" in out.stdout and "demo" in out.stdout


def test_generate_json_contract(tiny_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w1 w2 w3"}\n\n{"prompt": "w4"}\n{"prompt": "w5 w6 w7 w8 w9"}\n')
    argv = [
        "generate",
        "--target",
        str(tiny_dir),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "6",
        "--json",
    ]
    code, out, err = run([*argv, "--batch-size", "2"], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert CONTRACT_FIELDS <= row.keys()
        assert row["new_tokens"] == len(row["token_ids"]) <= 6
        assert row["mean_accepted"] == row["new_tokens"] / row["target_forwards"] == 1.0
        assert row["accept_rate_per_position"] == []
        assert row["tokens_per_s"] > 0 and row["wall_s"] > 0
    assert rows[0]["prompt_token_ids"] == [4, 7, 8, 9, 5]  # <|user|> w1 w2 w3 <|assistant|>
    code, out_single, _ = run(argv, capsys)  # batch size 1 gives the same tokens
    assert [json.loads(x)["token_ids"] for x in out_single.splitlines()] == [r["token_ids"] for r in rows]


def test_generate_plain_text_and_no_chat(tiny_dir, capsys):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2", "--no-chat", "--max-new-tokens", "4"]
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0 and json.loads(out)["prompt_token_ids"] == [7, 8]
    code, out, err = run(argv, capsys)
    assert code == 0 and out.strip() and "tok/s" in err


@pytest.fixture(scope="module")
def short_context_dir(tmp_path_factory):
    return make_tiny_dir(tmp_path_factory.mktemp("tiny-ctx"), max_positions=8)


def test_generate_speculative_json_equals_plain(tiny_dir, capsys):
    argv = [
        "generate",
        "--target",
        str(tiny_dir),
        "--prompt",
        "w1 w2 w1 w2 w1",
        "--max-new-tokens",
        "12",
        "--json",
    ]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    plain = json.loads(out)
    for draft, tree in [("self:layers=2", "chain:3"), ("ngram", "dynamic:depth=3,topk=2,tokens=5")]:
        code, out, err = run([*argv, "--draft", draft, "--tree", tree], capsys)
        assert code == 0, err
        row = json.loads(out)
        assert CONTRACT_FIELDS <= row.keys()
        assert row["token_ids"] == plain["token_ids"]
        assert row["mean_accepted"] == round(row["new_tokens"] / row["target_forwards"], 4)
        assert len(row["accept_rate_per_position"]) == 3
        assert all(0.0 <= r <= 1.0 for r in row["accept_rate_per_position"])
        assert row["cycles"] == row["target_forwards"] - 1  # the prefill makes the first token
        assert "tau" in err


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--temperature", "-1"], "temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--top-p", "0"], "top_p"),
        (["--top-p", "1.5"], "top_p"),
        (["--top-k", "-1"], "top_k"),
        (["--top-k", "2.5"], "--top-k"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--batch-size", "0"], "--batch-size"),
        (["--draft", "nope"], "--draft"),
        (["--draft", "self:layers=0"], "--draft"),
        (["--draft", "self:layers=3"], "--draft"),  # the tiny target has 3 layers: N in 1..2
        (["--draft", "eagle3:/nowhere"], "eagle3 head"),
        (["--draft", "ngram", "--tree", "pyramid:3"], "--tree"),
        (["--draft", "ngram", "--tree", "chain:0"], "--tree"),
        (["--draft", "ngram", "--tree", "static:[-1, 0, 5]"], "tree parents[2]"),
        (["--draft", "ngram", "--tree", "dynamic:depth=2,topk=2"], "--tree"),
        (["--draft", "ngram", "--tree", "static:binary-3"], "--tree"),
        (["--dtype", "float8"], "--dtype"),
        (["--device", "tpu9"], "--device"),
    ],
)
def test_bad_flags_exit_2(tiny_dir, capsys, extra, field):
    code, out, err = run(["generate", "--target", str(tiny_dir), "--prompt", "w1", *extra], capsys)
    assert code == 2, err
    assert field in err and "expected" in err and out == ""


def test_argparse_errors_exit_2(tiny_dir, capsys):
    code, out, err = run(
        ["generate", "--target", str(tiny_dir), "--prompt", "w1", "--temperature", "nan"], capsys
    )
    assert code == 2 and "NaN" in err
    code, out, err = run(["generate", "--prompt", "a", "--prompts", "f.txt"], capsys)  # mutually exclusive
    assert code == 2 and "not allowed with" in err
    code, out, err = run(["generate"], capsys)  # a prompt source is required
    assert code == 2 and "required" in err
    assert run(["generate", "--help"], capsys)[0] == 0


def test_bad_targets_and_prompts_exit_2(tiny_dir, short_context_dir, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"text": "no prompt field"}\n')
    cases = [
        (["--target", "nope-model", "--prompt", "x"], "--target"),
        (["--target", str(tmp_path / "missing"), "--prompt", "x"], "no such path"),
        (["--target", str(tmp_path), "--prompt", "x"], "config.json"),
        (["--target", str(tiny_dir), "--prompts", str(empty)], "at least one prompt"),
        (["--target", str(tiny_dir), "--prompts", str(tmp_path / "none.txt")], "an existing file"),
        (["--target", str(tiny_dir), "--prompts", str(bad_jsonl)], '"prompt" field'),
        (["--target", str(short_context_dir), "--prompt", "w1 w2 w3 w4 w5 w6 w7 w8", "--no-chat"], "context"),
    ]
    for argv, message in cases:
        code, out, err = run(["generate", *argv], capsys)
        assert code == 2, (argv, err)
        assert message in err and out == ""


# ---- issue 45 item 5: key=value overrides anywhere on the line ---------------------------------------------

CONFIG = __import__("pathlib").Path(__file__).resolve().parents[2] / "configs" / "eagle3-smollm2-135m.yaml"


def test_train_takes_overrides_on_both_sides_of_an_option(tiny_dir, tmp_path, capsys, monkeypatch):
    from draftsmith.train.loop import trainer

    seen = []
    monkeypatch.setattr(trainer, "train", seen.append)
    argv = ["train", "train.max_steps=7", "--config", str(CONFIG), "data.max_length=99", f"target={tiny_dir}"]
    code, _, err = run([*argv, f"output_dir={tmp_path / 'run'}", "train.max_steps=8"], capsys)
    assert code == 0, err
    cfg = seen[0]
    assert (cfg.train.max_steps, cfg.data.max_length, cfg.target) == (8, 99, str(tiny_dir))  # the last wins


def test_demo_takes_overrides_on_both_sides_of_an_option(capsys, monkeypatch):
    from draftsmith.runtime.cli import demo

    seen = []
    monkeypatch.setattr(
        demo, "demo_main", lambda path, overrides, quick, train: seen.append((overrides, train))
    )
    for argv in (["x=1", "--train"], ["x=1", "--train", "y=2"], ["--train", "x=1", "--quick", "y=2"]):
        code, _, err = run(["demo", *argv], capsys)
        assert code == 0, err
        assert seen.pop() == ([a for a in argv if "=" in a], True)


def test_an_unknown_option_among_overrides_is_still_refused(capsys):
    code, _, err = run(["train", "a=1", "--config", str(CONFIG), "--bogus", "b=2"], capsys)
    assert code == 2 and "unrecognized arguments: --bogus" in err, err
    code, _, err = run(["generate", "--prompt", "w1", "a=1"], capsys)  # generate takes no overrides
    assert code == 2 and "unrecognized arguments: a=1" in err, err
