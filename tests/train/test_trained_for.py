"""The chat template and thinking mode end to end on a tiny target whose template has a thinking mode:
`data prepare --thinking` records it, training copies the data's record into final/config.json, export
carries it into the engine's config.json (which speculators still loads) and the card, and `generate`
refuses a head trained with another mode (exit 2, both sides named) unless --allow-template-mismatch.

    python -m pytest tests/train/test_trained_for.py -q
"""

import json
import shutil

import pytest
from tiny_models import CHAT_TEMPLATE
from train_data import run_overrides

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.artifacts import template_hash, tokenizer_hash

# tests/tiny_models.py's template with a Qwen3-style mode: off writes an empty "think" (w0 w0) before answers
THINKING_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|{{ m['role'] }}|> {{ m['content'] }}",
    "<|{{ m['role'] }}|>{% if m['role'] == 'assistant' and enable_thinking is false %} w0 w0{% endif %}"
    " {{ m['content'] }}",
).replace(
    "<|assistant|>{% endif %}", "<|assistant|>{% if enable_thinking is false %} w0 w0{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def thinking_dir(tiny_dir, tmp_path_factory):
    """The tiny target with the template above (a copy: tiny_dir is shared, read-only)."""
    from transformers import AutoTokenizer

    assert THINKING_TEMPLATE.count("enable_thinking") == 2
    folder = tmp_path_factory.mktemp("thinking") / "tiny-thinking"
    shutil.copytree(tiny_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = THINKING_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


EXTRA = ("train.ttt_steps=2", "train.max_steps=2", "eval.every=2", "data.thinking=off")


@pytest.fixture(scope="module")
def run(thinking_dir, source, tmp_path_factory):
    """A 2-step EAGLE-3 run on data rendered with thinking off."""
    from draftsmith.train.config import load_train_config
    from draftsmith.train.loop.trainer import train

    root = tmp_path_factory.mktemp("run")
    train(load_train_config(None, run_overrides(thinking_dir, source, root / "data", root / "run", *EXTRA)))
    return root


def test_the_data_lines_a_run_prints_carry_its_mode(thinking_dir, source, tmp_path):
    from draftsmith.train.config import load_train_config
    from draftsmith.train.loop.data_steps import data_commands

    cfg = load_train_config(None, run_overrides(thinking_dir, source, tmp_path, tmp_path / "r", *EXTRA))
    assert "--thinking off" in data_commands(cfg, None, [0, 1, 2])[0]  # the prepare line


def test_prepare_records_the_mode_and_refuses_one_the_template_lacks(
    tiny_dir, thinking_dir, source, tmp_path, capsys
):
    common = ["--source", str(source), "--max-length", "64", "--device", "cpu"]
    out = tmp_path / "off"
    assert (
        main(
            [
                "data",
                "prepare",
                "--target",
                str(thinking_dir),
                "--out",
                str(out),
                "--thinking",
                "off",
                *common,
            ]
        )
        == 0
    )
    record = json.loads((out / "draftsmith_data.json").read_text())
    assert record["inputs"]["fingerprint"]["thinking"] == "off"
    assert (
        main(
            [
                "data",
                "prepare",
                "--target",
                str(tiny_dir),
                "--out",
                str(tmp_path / "x"),
                "--thinking",
                "on",
                *common,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--thinking: got 'on'" in err and "has no enable_thinking variable" in err


def test_the_record_goes_from_data_to_the_head_to_its_export(run, thinking_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(thinking_dir)
    expected = {
        "target": str(thinking_dir),
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "template_hash": template_hash(tokenizer),
        "thinking": "off",
    }
    data = json.loads((run / "data" / "prepared" / "draftsmith_data.json").read_text())
    assert data["inputs"]["fingerprint"]["thinking"] == "off"
    head = json.loads((run / "run" / "final" / "config.json").read_text())
    assert head["trained_for"] == expected
    out = tmp_path / "spec"
    assert main(["export", str(run / "run"), "--format", "speculators", "--out", str(out)]) == 0
    exported = json.loads((out / "config.json").read_text())
    assert exported["trained_for"] == expected and "speculators_config" in exported
    assert f"chat template `{expected['template_hash']}`" in (out / "README.md").read_text()
    assert "thinking off (`--thinking off`)" in (out / "README.md").read_text()
    speculators = pytest.importorskip("speculators")
    config = speculators.SpeculatorModelConfig.from_pretrained(str(out))  # an unknown key is no error
    assert type(config) is speculators.Eagle3SpeculatorConfig


def generate(target, draft, *flags):
    base = ["generate", "--target", str(target), "--device", "cpu", "--draft", f"eagle3:{draft}"]
    return main([*base, "--prompt", "w1 w2 w3", "--max-new-tokens", "4", *flags])


def test_generate_refuses_another_mode_unless_overridden(run, thinking_dir, capsys):
    final = run / "run" / "final"
    assert generate(thinking_dir, final, "--thinking", "off") == 0
    capsys.readouterr()
    assert generate(thinking_dir, final) == 2  # the template's default is thinking on
    err = capsys.readouterr().err
    h = json.loads((final / "config.json").read_text())["trained_for"]["template_hash"]
    said = f"head trained with chat template {h} (thinking off); {thinking_dir} renders chat template {h}"
    assert f"{said} (thinking on)" in err
    assert "serve it with --thinking off" in err and "--allow-template-mismatch" in err
    assert generate(thinking_dir, final, "--thinking", "on", "--allow-template-mismatch") == 0
    err = capsys.readouterr().err
    assert err.count("head trained with chat template") == 1  # one warning
    assert generate(thinking_dir, final, "--thinking", "on", "--no-chat") == 2  # nothing would be rendered
    assert "--thinking: got 'on', expected chat-templated prompts" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["eval", "bench"])
def test_eval_and_bench_check_each_head_before_decoding(verb, run, thinking_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "w1 w2 w3"}) + "\n")
    source = ["--set", f"jsonl:{prompts}"] if verb == "eval" else ["--prompts", f"jsonl:{prompts}"]
    line = [
        verb,
        "--target",
        str(thinking_dir),
        "--device",
        "cpu",
        "--draft",
        f"eagle3:{run / 'run' / 'final'}",
    ]
    assert main([*line, *source, "--out", str(tmp_path / "out"), "--thinking", "on"]) == 2
    assert "(thinking off); " in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing decoded
