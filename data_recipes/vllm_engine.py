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
or ./.venv-vllm/bin/python, which `bash scripts/vllm_env.sh` builds). The worker runs in a scratch
folder (a folder of the cwd named like a package shadows it, as this checkout's old `kernels/` did) in its own
process session, so closing it ends vLLM's engine processes too. Its stderr (vLLM's log) goes to a file,
kept and quoted when it fails. This module imports no vLLM and loads no weights: the CLI process keeps
the tokenizer, builds every prompt and writes the output folder itself.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftsmith.runtime.core.errors import BadInputError, DraftsmithError
from draftsmith.runtime.workers.worker_process import start_worker, stop_worker, worker_env

FIELD = "--engine"
PYTHON_ENV = "DRAFTSMITH_VLLM_PYTHON"
BUILD_HINT = (
    "build one with `bash scripts/vllm_env.sh` (makes .venv-vllm, about 4 minutes and 3.4 GB), "
    f"or pass --vllm-python PATH / set {PYTHON_ENV}"
)
WORKER = Path(__file__).resolve().parents[1] / "runtime" / "workers" / "vllm_data_worker.py"
WORKER_ENV = {  # defaults only: the caller's environment wins
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB of KV cache on a CPU (vLLM's default, 4, is a lot on a small box)
    "HF_HUB_OFFLINE": "1",  # the target is a local folder
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
}


def find_python(flag: str | None) -> str:
    """--vllm-python, else $DRAFTSMITH_VLLM_PYTHON, else ./.venv-vllm/bin/python: one that imports vllm."""
    candidate = flag or os.environ.get(PYTHON_ENV) or str(Path.cwd() / ".venv-vllm" / "bin" / "python")
    if importlib.util.find_spec("vllm") is not None and not flag:
        return sys.executable
    resolved = shutil.which(candidate)  # absolute below: the worker runs in a scratch folder
    if resolved is None:
        raise BadInputError(FIELD, "vllm", f"a Python with vLLM (none at {candidate})", BUILD_HINT)
    if not has_vllm(resolved):
        raise BadInputError(FIELD, "vllm", f"a Python with vLLM ({candidate} cannot import vllm)", BUILD_HINT)
    return os.path.abspath(resolved)  # not resolve(): a venv's python is a symlink out of the venv


def has_vllm(python: str) -> bool:
    """Whether `python` finds the vllm package (find_spec: vllm is not imported); asked once per process
    for a path (a file rewritten since, by size or mtime, is asked again): `--engine auto` and the step
    share one probe."""
    st = os.stat(python)
    return _probe(os.path.abspath(python), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _probe(python: str, size: int, mtime_ns: int) -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


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

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

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
                 layers: list[int] | None = None, ready_timeout_s: float = 900.0):  # fmt: skip
        self.scratch = Path(tempfile.mkdtemp(prefix="draftsmith-vllm-data-"))
        self.log_path = self.scratch / "worker.log"
        self.failed, self.proc = False, None
        cmd = [python, str(WORKER), "--model", view.path, "--mode", mode, "--dtype", view.dtype]
        cmd += ["--max-model-len", str(view.max_context), "--max-num-seqs", str(max_num_seqs)]
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
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
