"""Bad inputs to `generate` and `bench`'s plots (issue 20 item 7): a default tree that fits the drafter, the
field an error names, integer draft positions and short legend labels.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_bad_inputs_cli.py -q
"""

import json

import pytest
import torch

from draftsmith.runtime.bench import report as bench_report
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, save_head


@pytest.fixture(scope="module")
def one_module_head(tiny_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp1") / "head"
    torch.manual_seed(1)
    save_head(MtpHead(MtpConfig.for_target(tiny_target, num_modules=1)), folder)
    return folder


def generate(tiny_dir, capsys, *extra):
    argv = ["generate", "--target", str(tiny_dir), "--prompt", "w1 w2 w3", "--max-new-tokens", "8", "--json"]
    code = main([*argv, *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_default_tree_fits_a_one_module_mtp_head(tiny_dir, one_module_head, capsys):
    code, plain, err = generate(tiny_dir, capsys)
    assert code == 0, err
    code, out, err = generate(tiny_dir, capsys, "--draft", f"mtp:{one_module_head}")
    assert code == 0, err
    row, plain = json.loads(out), json.loads(plain)
    assert row["token_ids"] == plain["token_ids"] and row["draft_forwards"] > 0
    assert len(row["accept_rate_per_position"]) == 1  # chain:1, the depth the head has
    # an explicit tree deeper than the head is still refused, naming --tree
    code, _, err = generate(tiny_dir, capsys, "--draft", f"mtp:{one_module_head}", "--tree", "chain:2")
    assert code == 2 and "--tree: got 'depth 2', expected depth <= 1" in err
    # with #recursive the last module reuses itself deeper, so the default stays chain:2
    code, out, err = generate(tiny_dir, capsys, "--draft", f"mtp:{one_module_head}#recursive")
    assert code == 0, err
    assert len(json.loads(out)["accept_rate_per_position"]) == 2


def test_benchs_default_trees_fit_a_one_module_mtp_head(one_module_head):
    from draftsmith.runtime.bench.run import BenchRequest

    head = f"mtp:{one_module_head}"
    specs = BenchRequest(drafts=[head, f"{head}#recursive", "ngram"], baselines=[]).method_specs()
    assert specs == [
        "plain",
        *(f"{head}@chain:1", f"{head}@auto:1"),  # the depth the head has
        *(f"{head}#recursive@chain:2", f"{head}#recursive@auto:2"),
        *("ngram@chain:2", "ngram@auto:2"),
    ]
    # given trees apply to every draft as they are (a too-deep one is refused when the method is built)
    assert BenchRequest(drafts=[head], trees=["chain:3"], baselines=[]).method_specs()[1] == f"{head}@chain:3"


def test_a_missing_draft_model_names_draft(tiny_dir, tmp_path, capsys):
    missing = tmp_path / "MISSING"
    code, _, err = generate(tiny_dir, capsys, "--draft", f"model:{missing}")
    assert code == 2
    assert f"generate: error: --draft: got 'model:{missing}', expected an existing model folder" in err
    assert "--target" not in err


def bench_rows() -> list[dict]:
    methods = [
        "plain",
        "eagle3:/home/me/runs/head-a/final@chain:3",
        "eagle3:/home/me/runs/head-b/final@chain:3",
        "eagle3:/home/me/runs/head-a/final@auto:3",
        "mtp:runs/mtp/final#recursive@chain:3",
        "self:layers=2@chain:2",
    ]
    rows = []
    for batch in (1, 4):
        for i, method in enumerate(methods):
            drafted = method != "plain"
            rows.append(
                {
                    "method": method,
                    "temperature": 0.0,
                    "batch_size": batch,
                    "speedup_vs_plain": 1.0 + 0.1 * i,
                    "accept_rate_per_position": [0.8, 0.6, 0.4][: 2 if "chain:2" in method else 3]
                    if drafted
                    else [],
                    "accepted_length_counts": [3, 2, 4, 1] if drafted else [],
                }
            )
    return rows


@pytest.fixture
def figures(tmp_path, monkeypatch):
    """make_plots' figures by file name, kept for inspection (they are still saved)."""
    pytest.importorskip("matplotlib")
    kept, save = {}, bench_report._save

    def keep(plt, fig, path):
        kept[path.name] = fig
        fig.canvas.draw()
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        kept[path.name + ":ticks"] = (list(fig.axes[0].get_xticks()), fig.axes[0].get_xlim(), labels)
        kept[path.name + ":legend"] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        return save(plt, fig, path)

    monkeypatch.setattr(bench_report, "_save", keep)
    bench_report.make_plots(tmp_path, bench_rows())
    return kept


@pytest.mark.parametrize("name", ["acceptance_per_position.png", "accepted_lengths.png"])
def test_draft_position_plots_tick_whole_numbers(figures, name):
    ticks, (lo, hi), labels = figures[name + ":ticks"]
    shown = [t for t in ticks if lo <= t <= hi]
    assert shown and all(float(t).is_integer() for t in shown), ticks
    assert all(label.lstrip("-").isdigit() for label in labels if label), labels


@pytest.mark.parametrize(
    "name", ["speedup_vs_batch.png", "acceptance_per_position.png", "accepted_lengths.png"]
)
def test_legends_name_methods_without_paths(figures, name):
    legend = figures[name + ":legend"]
    assert legend and not any("/" in label for label in legend), legend
    assert len(set(legend)) == len(legend)  # two heads at the same tree still read apart


def test_the_report_maps_short_labels_to_whole_methods(tmp_path):
    pytest.importorskip("matplotlib")
    meta = {
        "request": {"prompts": "p", "num_prompts": 1, "max_new_tokens": 4, "repeats": 1, "seed": 0},
        "command": "draftsmith bench",
        "date": "today",
        "target": "tiny",
        "prompt_tokens_mean": 3.0,
        "machine": {},
        "versions": {},
    }
    rows = [
        {**r, "tokens_per_s": 1.0, "ttft_ms": {"median": 1.0}, "tpot_ms": {"median": 1.0}}
        for r in bench_rows()
    ]
    bench_report.write_report(tmp_path, rows, meta)
    report = (tmp_path / "report.md").read_text()
    labels = report.split("Plot labels:")[1].splitlines()[0]
    assert "eagle3:/home/me/runs/head-a/final" in labels and "eagle3:/home/me/runs/head-b/final" in labels
    assert "mtp:runs/mtp/final#recursive" in labels


# ---- issue 45 item 3: an option that has no effect in the chosen mode is refused, naming what it needs ----

UNUSED = {  # case -> (argv after the verb's inputs, the option, what it needs)
    "--group-size without --quantize": (
        ["generate", "--group-size", "64"],
        "--group-size",
        "--quantize int4",
    ),
    "--group-size with int8": (
        ["generate", "--quantize", "int8", "--group-size", "64"],
        "--group-size",
        "--quantize int4",
    ),
    "--draft-group-size": (
        ["generate", "--draft-group-size", "64"],
        "--draft-group-size",
        "--quantize-draft int4",
    ),
    "--ssd-fanout": (["generate", "--draft", "ngram", "--ssd-fanout", "4"], "--ssd-fanout", "--ssd"),
    "--ssd-saguaro": (["generate", "--draft", "ngram", "--ssd-saguaro", "0.5"], "--ssd-saguaro", "--ssd"),
    "--ssd-trace": (["generate", "--draft", "ngram", "--ssd-trace", "t.jsonl"], "--ssd-trace", "--ssd"),
    "--draft-device": (
        ["generate", "--draft", "ngram", "--draft-device", "cpu"],
        "--draft-device",
        "--draft-process",
    ),
    "--draft-fallback": (
        ["generate", "--draft", "ngram", "--draft-fallback"],
        "--draft-fallback",
        "--draft-process",
    ),
    "--tree without a draft": (["generate", "--tree", "chain:3"], "--tree", "--draft"),
    "bench --group-size": (["bench", "--group-size", "64"], "--group-size", "--quantize int4"),
    "bench --tree without a draft": (["bench", "--tree", "chain:3"], "--tree", "--draft"),
    "capture --fp8-last-hidden": (
        ["data", "capture", "--data", "d", "--out", "o", "--fp8-last-hidden"],
        "--fp8-last-hidden",
        "--storage-dtype fp8",
    ),
    "capture --fp8-bf16-layers": (
        ["data", "capture", "--data", "d", "--out", "o", "--fp8-bf16-layers", "1"],
        "--fp8-bf16-layers",
        "--storage-dtype fp8",
    ),
    "export --private": (["export", "CKPT", "--out", "o", "--private"], "--private", "--push-to-hub"),
    "export --revision": (
        ["export", "CKPT", "--out", "o", "--revision", "dev"],
        "--revision",
        "--push-to-hub",
    ),
    "train --world-size": (["train", "--config", "C", "--world-size", "8"], "--world-size", "--preflight"),
}


@pytest.mark.parametrize("case", UNUSED)
def test_an_option_without_its_mode_exits_2_naming_what_it_needs(tiny_dir, capsys, monkeypatch, case):
    from draftsmith.runtime.core import target

    def no_work(*args, **kwargs):
        raise AssertionError("the target loaded before the options were checked")

    monkeypatch.setattr(target.Target, "load", no_work)
    argv, option, needs = UNUSED[case]
    on_target = {
        "generate": ["--target", str(tiny_dir), "--prompt", "w1"],
        "bench": ["--target", str(tiny_dir)],
    }
    code = main([*argv, *on_target.get(argv[0], [])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"error: {option}: got " in err and f"expected {needs} as well" in err, err


def test_a_storage_dtype_in_online_training_is_refused(tmp_path):
    from draftsmith.runtime.errors import BadInputError
    from draftsmith.train.config import load_train_config

    base = [f"output_dir={tmp_path / 'run'}", "data.mode=online"]
    with pytest.raises(
        BadInputError, match=r"data.storage_dtype: got 'fp8', expected data.mode=offline as well"
    ):
        load_train_config(None, [*base, "data.storage_dtype=fp8"])
    load_train_config(None, [f"output_dir={tmp_path / 'run'}", "data.mode=offline", "data.storage_dtype=fp8"])


# ---- issue 45 item 4: errors name the field the user typed ----------------------------------------------


@pytest.fixture(scope="module")
def eagle3_head(tiny_target, tmp_path_factory):
    from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
    from draftsmith.runtime.heads.eagle3 import save_head as save_eagle3

    folder = tmp_path_factory.mktemp("e3") / "head"
    torch.manual_seed(0)
    save_eagle3(Eagle3Head(Eagle3Config.for_target(tiny_target, aux_layer_ids=[0, 1, 2])), folder)
    return folder


def test_a_bad_draft_group_size_names_draft_group_size(tiny_dir, capsys):
    extra = ["--draft", "model:x", "--quantize-draft", "int4", "--draft-group-size", "7"]
    code, out, err = generate(tiny_dir, capsys, *extra)
    assert code == 2, err
    assert "error: --draft-group-size: got 7, expected one of" in err, err


def test_an_eagle3_folder_as_mtp_names_head_type(tiny_dir, eagle3_head, capsys):
    for tree in ([], ["--tree", "chain:1"]):  # the default tree reads the head's depth first
        code, out, err = generate(tiny_dir, capsys, "--draft", f"mtp:{eagle3_head}", *tree)
        assert code == 2, err
        assert "error: head_type: got 'eagle3', expected mtp" in err, err


def test_a_missing_assistant_model_names_baselines(tiny_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n')
    missing = tmp_path / "MISSING"
    argv = ["bench", "--target", str(tiny_dir), "--prompts", f"jsonl:{prompts}", "--num-prompts", "1"]
    argv += ["--baselines", f"plain,hf-assisted:{missing}", "--no-roofline", "--out", str(tmp_path / "b")]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"error: --baselines: got 'hf-assisted:{missing}', expected an existing model folder" in err, err
    assert "--draft" not in err


@pytest.mark.parametrize(
    "override, field",
    [
        ("prompt_set=nope", "prompt_set"),
        ("target=/nowhere", "target"),
        ("device=tpu", "device"),
        ("temperature=-1", "temperature"),
    ],
)
def test_demo_errors_name_the_demo_key(override, field, capsys):
    """The demo runs bench and export inside: their errors are renamed to the config key the user set."""
    code = main(["demo", override])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"draftsmith demo: error: {field}: got " in err, err
