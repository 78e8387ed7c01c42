"""Bad files and paths as a user gives them (issue 20, item 7): exit code 2 with the field named, never a
traceback, never data loss, and outputs checked before any work.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_bad_inputs_io.py -q

Every case builds its inputs in tmp_path from tiny models (tests/tiny_models.py): a copy of the random
target folder, a run folder with an EAGLE-3 head, an MTP head, a prompt file.
"""

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, save_head
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.heads.mtp import save_head as save_mtp

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "eagle3-smollm2-135m.yaml"
NOT_UTF8 = "caf\xe9 au lait".encode("latin-1")  # 0xe9 starts a UTF-8 sequence that never continues


@dataclass
class Inputs:
    tmp: Path
    target: Path  # a copy of the tiny target folder (cases damage it)
    run: Path  # a run folder: final/ (an EAGLE-3 head), config.yaml, metrics.jsonl, checkpoints/
    mtp: Path  # an MTP head folder for the same target
    prompts: Path  # one plain prompt

    @property
    def head(self) -> Path:
        return self.run / "final"

    @property
    def on_target(self) -> list:
        return ["--target", self.target, "--device", "cpu"]


@pytest.fixture
def inputs(tiny_dir, tiny_target, tmp_path) -> Inputs:
    run = tmp_path / "runs" / "r1"
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(tiny_target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64))
    head.set_draft_vocab(torch.arange(0, 128, 2))
    save_head(head, run / "final")
    (run / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": 3}}))
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 3}) + "\n")
    (run / "checkpoints" / "step-000003").mkdir(parents=True)
    (run / "checkpoints" / "step-000003" / "state.json").write_text("{}")
    save_mtp(MtpHead(MtpConfig.for_target(tiny_target, num_modules=1)), tmp_path / "mtp")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2\n")
    target = shutil.copytree(tiny_dir, tmp_path / "target")
    return Inputs(tmp_path, target, run, tmp_path / "mtp", prompts)


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` -> sha256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ---- 1. data loss: --out overlapping what export reads -----------------------------------------------

OVERLAPS = {  # case -> (CHECKPOINT, --out, more flags)
    "out is the run": lambda i: (i.run, i.run, ["--format", "eagle3"]),
    "out is the head": lambda i: (i.head, i.head, ["--format", "eagle3"]),
    "out contains the run": lambda i: (i.run, i.run.parent, ["--format", "eagle3"]),
    "out inside the head": lambda i: (i.head, i.head / "export", []),
    "out is the run of the head": lambda i: (i.head, i.run, ["--format", "speculators"]),
    "out is --target": lambda i: (i.mtp, i.target, ["--format", "mtp", "--target", i.target]),
    "out contains --bench": lambda i: (i.run, i.tmp / "bench", ["--bench", i.tmp / "bench" / "results.json"]),
}


@pytest.mark.parametrize("case", OVERLAPS)
def test_export_never_writes_over_what_it_reads(inputs, capsys, case):
    checkpoint, out, flags = OVERLAPS[case](inputs)
    bench = inputs.tmp / "bench" / "results.json"
    bench.parent.mkdir()
    rows = [{"method": "plain"}, {"method": f"eagle3:{inputs.head}@chain:2", "tokens_per_s": 1.0}]
    bench.write_text(json.dumps(rows))
    before = snapshot(inputs.tmp)
    code, _, err = run(["export", checkpoint, *flags, "--out", out, "--overwrite"], capsys)
    assert code == 2, err
    assert "--out" in err and "export reads" in err, err
    assert snapshot(inputs.tmp) == before  # nothing deleted, replaced or added


def test_export_next_to_its_inputs_still_works(inputs, capsys):
    """The check refuses overlaps only: a sibling of the run, replaced with --overwrite, is fine."""
    out = inputs.run.parent / "r1-eagle3"
    for _ in range(2):
        code, _, err = run(["export", inputs.run, "--format", "eagle3", "--out", out, "--overwrite"], capsys)
        assert code == 0, err
    assert (out / "config.json").is_file() and (inputs.head / "model.safetensors").is_file()


# ---- 2. tracebacks instead of exit 2 -----------------------------------------------------------------

NON_UTF8 = {  # case -> (argv, field); rows.jsonl and convs.json hold one byte that is not UTF-8
    "generate --prompts": lambda i: (
        ["generate", *i.on_target, "--prompts", i.tmp / "rows.jsonl"],
        "--prompts",
    ),
    "prepare .jsonl": lambda i: (
        ["data", "prepare", *i.on_target, "--source", i.tmp / "rows.jsonl", "--out", i.tmp / "d"],
        "--source",
    ),
    "prepare .json": lambda i: (
        ["data", "prepare", *i.on_target, "--source", i.tmp / "convs.json", "--out", i.tmp / "d"],
        "--source",
    ),
    "bench mtbench:": lambda i: (
        ["bench", *i.on_target, "--prompts", f"mtbench:{i.tmp / 'rows.jsonl'}", "--out", i.tmp / "b"],
        "--prompts",
    ),
}


@pytest.mark.parametrize("case", NON_UTF8)
def test_non_utf8_text_files_exit_2(inputs, capsys, case):
    ok = b'{"prompt": "w1", "question_id": 1, "turns": ["w1"]}\n'
    (inputs.tmp / "rows.jsonl").write_bytes(ok + b'{"prompt": "' + NOT_UTF8 + b'"}\n')
    convs = b'[{"conversations": [{"from": "human", "value": "' + NOT_UTF8 + b'"}]}]'
    (inputs.tmp / "convs.json").write_bytes(convs)
    argv, field = NON_UTF8[case](inputs)
    code, out, err = run(argv, capsys)
    assert code == 2, err
    assert field in err and "UTF-8" in err and "0xe9" in err and out == "", err


DAMAGED_WEIGHTS = {  # case -> (the folder whose model.safetensors is cut short, argv, field)
    "generate eagle3": lambda i: (
        i.head,
        ["generate", *i.on_target, "--prompt", "w1", "--draft", f"eagle3:{i.head}"],
        "eagle3 head",
    ),
    "generate mtp": lambda i: (
        i.mtp,
        ["generate", *i.on_target, "--prompt", "w1", "--draft", f"mtp:{i.mtp}", "--tree", "chain:1"],
        "mtp head",
    ),
    "bench eagle3": lambda i: (
        i.head,
        ["bench", *i.on_target, "--prompts", f"jsonl:{i.prompts}", "--draft", f"eagle3:{i.head}"]
        + ["--baselines", "plain", "--no-roofline", "--out", i.tmp / "b"],
        "eagle3 head",
    ),
    "export eagle3": lambda i: (
        i.head,
        ["export", i.run, "--format", "eagle3", "--out", i.tmp / "e"],
        "eagle3 head",
    ),
    "export draftsmith": lambda i: (i.head, ["export", i.run, "--out", i.tmp / "e"], "CHECKPOINT"),
    "generate --target": lambda i: (i.target, ["generate", *i.on_target, "--prompt", "w1"], "--target"),
    "export --target": lambda i: (
        i.target,
        ["export", i.mtp, "--format", "mtp", "--target", i.target, "--out", i.tmp / "e"],
        "--target",
    ),
}


@pytest.mark.parametrize("case", DAMAGED_WEIGHTS)
def test_damaged_safetensors_exit_2(inputs, capsys, case):
    folder, argv, field = DAMAGED_WEIGHTS[case](inputs)
    weights = folder / "model.safetensors"
    for keep in (300, 8):  # the tensors cut off; the header itself cut off
        weights.write_bytes(weights.read_bytes()[:keep])
        code, out, err = run(argv, capsys)
        assert code == 2, err
        assert field in err and str(weights) in err and "truncated or corrupted" in err, err
    assert not (inputs.tmp / "e").exists()


def test_a_gguf_that_is_not_gguf_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / "model.gguf"
    fake.write_text("<html>404 Not Found</html>\n")  # what a failed download often leaves
    code, out, err = run(["generate", "--target", fake, "--device", "cpu", "--prompt", "w1"], capsys)
    assert code == 2, err
    assert "--target" in err and "a GGUF file" in err and "b'<htm'" in err and out == "", err
    assert not (tmp_path / "cache").exists()  # refused before hashing or converting


def test_a_cut_off_gguf_exits_2(tmp_path, capsys, monkeypatch):
    from draftsmith.runtime.core.targets import ALIASES, embedded_gguf_path

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    cut = tmp_path / "cut.gguf"
    with open(embedded_gguf_path(ALIASES["smollm2-135m"]), "rb") as f:
        cut.write_bytes(f.read(2 << 20))  # the header and the first tensors of a 98 MB file
    code, out, err = run(["generate", "--target", cut, "--device", "cpu", "--prompt", "w1"], capsys)
    assert code == 2, err
    assert "--target" in err and "a GGUF file transformers can read" in err and out == "", err
    assert not list((tmp_path / "cache").rglob("*.safetensors"))


BROKEN_JSON = {  # case -> (files written broken, argv, field)
    "generate eagle3": lambda i: (
        [i.head / "config.json"],
        ["generate", *i.on_target, "--prompt", "w1", "--draft", f"eagle3:{i.head}"],
        "eagle3 head",
    ),
    "generate mtp": lambda i: (
        [i.mtp / "config.json"],
        ["generate", *i.on_target, "--prompt", "w1", "--draft", f"mtp:{i.mtp}", "--tree", "chain:1"],
        "mtp head",
    ),
    "export head": lambda i: (
        [i.head / "config.json"],
        ["export", i.run, "--out", i.tmp / "e"],
        "CHECKPOINT",
    ),
    "export --bench": lambda i: (
        [i.tmp / "broken.json"],
        ["export", i.run, "--out", i.tmp / "e", "--bench", i.tmp / "broken.json"],
        "--bench",
    ),
    "export --vllm-check": lambda i: (
        [i.tmp / "broken.json"],
        ["export", i.run, "--out", i.tmp / "e", "--vllm-check", i.tmp / "broken.json"],
        "--vllm-check",
    ),
    "data folder record": lambda i: (
        [i.tmp / "data" / "draftsmith_data.json"],
        ["data", "vocab", "--data", i.tmp / "data", "--draft-vocab-size", "8", "--out", i.tmp / "e"],
        "--data",
    ),
    "--target config": lambda i: (
        [i.target / "config.json"],
        ["generate", *i.on_target, "--prompt", "w1"],
        "--target",
    ),
}


@pytest.mark.parametrize("case", BROKEN_JSON)
def test_malformed_json_exits_2(inputs, capsys, case):
    files, argv, field = BROKEN_JSON[case](inputs)
    for text, why in ((b'{"head_type": "eagle3",', "JSON"), (b'{"a": "' + NOT_UTF8 + b'"}', "UTF-8")):
        for file in files:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(text)
        code, out, err = run(argv, capsys)
        assert code == 2, err
        assert field in err and str(files[0]) in err and why in err and out == "", err
    assert not (inputs.tmp / "e").exists()


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_train_output_dir_naming_a_file_exits_2(tiny_dir, tmp_path, capsys, where):
    file = tmp_path / "notes.txt"
    file.write_text("keep me\n")
    output_dir = file if where == "a file" else file / "run"
    argv = ["train", "--config", CONFIG, f"output_dir={output_dir}", f"target={tiny_dir}"]
    code, out, err = run(argv, capsys)
    assert code == 2, err
    assert "output_dir" in err and "a folder" in err and out == "", err
    assert file.read_text() == "keep me\n"


# ---- 3. work lost late: outputs are checked before the work ------------------------------------------


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_bench_out_naming_a_file_is_refused_before_any_run(tiny_dir, tmp_path, capsys, monkeypatch, where):
    from draftsmith.runtime.bench import run as bench_run
    from draftsmith.runtime.core import target

    def no_work(*args, **kwargs):
        raise AssertionError("bench started working before checking --out")

    monkeypatch.setattr(target.Target, "load", no_work)
    monkeypatch.setattr(bench_run, "run_block", no_work)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2\n")
    file = tmp_path / "results"
    file.write_text("an old report\n")
    out_dir = file if where == "a file" else file / "sub"
    argv = ["bench", "--target", tiny_dir, "--prompts", f"jsonl:{prompts}", "--baselines", "plain"]
    code, out, err = run([*argv, "--out", out_dir], capsys)
    assert code == 2, err
    assert "--out" in err and "a folder" in err and out == "", err
    assert file.read_text() == "an old report\n"


def no_target(monkeypatch):
    """Target.load raises: a test passes only if the command is refused before the target loads."""
    from draftsmith.runtime.core import target

    def no_work(*args, **kwargs):
        raise AssertionError("the target loaded before the outputs were checked")

    monkeypatch.setattr(target.Target, "load", no_work)


OUTPUTS = {  # issue 45 items 1-2: case -> (argv with OUT for the output path, the field)
    "generate --ssd-trace": lambda i: (
        ["generate", *i.on_target, "--prompt", "w1", "--draft", "ngram", "--ssd", "--ssd-trace", "OUT"],
        "--ssd-trace",
    ),
    "data prepare": lambda i: (
        ["data", "prepare", *i.on_target, "--source", f"prompts:{i.prompts}", "--out", "OUT"],
        "--out",
    ),
    "data regenerate": lambda i: (
        ["data", "regenerate", *i.on_target, "--data", i.tmp, "--out", "OUT"],
        "--out",
    ),
    "data capture": lambda i: (["data", "capture", *i.on_target, "--data", i.tmp, "--out", "OUT"], "--out"),
    "data vocab": lambda i: (
        ["data", "vocab", "--data", i.tmp, "--draft-vocab-size", "8", "--out", "OUT"],
        "--out",
    ),
    "export": lambda i: (["export", i.run, "--out", "OUT"], "--out"),
    "demo": lambda i: (["demo", "out_dir=OUT"], "out_dir"),
    "train": lambda i: (["train", "--config", CONFIG, f"target={i.target}", "output_dir=OUT"], "output_dir"),
}


@pytest.mark.parametrize(
    "case, where",
    [
        (c, w)
        for c in OUTPUTS
        for w in ("a file", "under a file")
        if (c, w) != ("generate --ssd-trace", "a file")
    ],
)  # a trace file that exists is replaced; one that is a folder: the next test
def test_every_output_path_is_checked_before_the_target_loads(inputs, capsys, monkeypatch, case, where):
    no_target(monkeypatch)
    file = inputs.tmp / "notes.txt"
    file.write_text("keep me\n")
    out_path = file if where == "a file" else file / "sub"
    argv, field = OUTPUTS[case](inputs)
    code, out, err = run([str(a).replace("OUT", str(out_path)) for a in argv], capsys)
    assert code == 2, err
    assert f"{field}: got '{out_path}'" in err and "Traceback" not in err and out == "", err
    assert file.read_text() == "keep me\n"


def test_an_ssd_trace_path_that_is_a_folder_is_refused_first(inputs, capsys, monkeypatch):
    no_target(monkeypatch)
    argv = ["generate", *inputs.on_target, "--prompt", "w1", "--draft", "ngram", "--ssd"]
    code, out, err = run([*argv, "--ssd-trace", inputs.tmp], capsys)
    assert code == 2, err
    assert "--ssd-trace" in err and "a file path" in err and out == "", err


def test_an_ssd_trace_in_a_new_folder_is_written(inputs, capsys):
    trace = inputs.tmp / "new" / "deeper" / "trace.jsonl"
    argv = ["generate", *inputs.on_target, "--prompt", "w1 w2 w1 w2", "--max-new-tokens", "6", "--json"]
    code, out, err = run(
        [*argv, "--draft", "ngram", "--tree", "chain:2", "--ssd", "--ssd-trace", trace], capsys
    )
    assert code == 0, err
    assert json.loads(out)["cycles"] == len(trace.read_text().splitlines())


def test_generate_prints_its_rows_before_writing_the_trace(inputs, capsys, monkeypatch):
    """A side file that fails late (a disk filled meanwhile) loses no generated text."""
    from draftsmith.runtime.core import config

    def full_disk(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(config, "atomic_write_text", full_disk)
    argv = ["generate", *inputs.on_target, "--prompt", "w1 w2 w1 w2", "--max-new-tokens", "6", "--json"]
    trace = inputs.tmp / "trace.jsonl"
    with pytest.raises(OSError):
        main(
            [str(a) for a in [*argv, "--draft", "ngram", "--tree", "chain:2", "--ssd", "--ssd-trace", trace]]
        )
    assert json.loads(capsys.readouterr().out)["new_tokens"] == 6
