"""llama.cpp baselines for `draftsmith bench`: `llamacpp[:GGUF]` (plain decoding) and
`llamacpp-lookup[:GGUF]` (llama-cpp-python's own prompt-lookup drafting), run by llama.cpp in a worker.

What a user who wants a small model fast on a CPU runs today. llama-cpp-python is not in draftsmith's venv:
runtime/workers/llamacpp_worker.py runs under a Python that has it (`find_llamacpp_python`: this one,
$DRAFTSMITH_LLAMACPP_PYTHON, or ./.venv-llamacpp/bin/python, which `bash scripts/setup_llamacpp.sh`
builds) and answers JSON lines on a pipe (runtime/bench/worker_method.py handles the process).

    method = LlamaCppMethod("llamacpp", target)                 # the GGUF the target was converted from
    method = LlamaCppMethod("llamacpp-lookup:model.Q8_0.gguf", target)
    out = method.run([[1, 2, 3]], SamplingParams(), max_new_tokens=64, seed=0)  # -> BatchOutput

Without `:GGUF` the row runs the GGUF file the target folder was converted from (draftsmith records it
in the folder's draftsmith-conversion.json; the embedded SmolLM2 target is its Q4_1 GGUF). Rows carry the
file's precision (`weights`: F32, Q8_0, Q4_1, ...) and llama.cpp's version: its weights are not the
draftsmith target's fp32 ones unless the GGUF is F32, so its greedy text may part from plain decoding's
where the two models' logits nearly tie (the row's near-tie verdicts say so). One sequence at a time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from draftsmith.runtime.bench.types import BatchOutput
from draftsmith.runtime.bench.worker_method import FIELD, WorkerMethod, find_python
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.workers.worker_process import worker_env

PLAIN, LOOKUP = "llamacpp", "llamacpp-lookup"
LOOKUP_TOKENS = 10  # llama-cpp-python's documented example value for LlamaPromptLookupDecoding
INSTALL_HINT = "bash scripts/setup_llamacpp.sh builds .venv-llamacpp, or set DRAFTSMITH_LLAMACPP_PYTHON"
WORKER = Path(__file__).resolve().parents[1] / "workers" / "llamacpp_worker.py"
CONVERSION_RECORD = "draftsmith-conversion.json"  # runtime/core/targets.py writes it beside a converted GGUF
WORKER_ENV = {"PYTHONSAFEPATH": "1"}  # the repository's own folders never shadow the worker's imports


def is_llamacpp_method(spec: str) -> bool:
    return spec.partition(":")[0] in (PLAIN, LOOKUP)


def parse_llamacpp_method(spec: str) -> tuple[bool, str | None]:
    """`llamacpp[:GGUF]` / `llamacpp-lookup[:GGUF]` -> (prompt lookup on, GGUF path or None)."""
    kind, colon, gguf = spec.partition(":")
    if kind not in (PLAIN, LOOKUP) or (colon and not gguf.strip()):
        raise BadInputError(FIELD, spec, f"{PLAIN}[:FILE.gguf] or {LOOKUP}[:FILE.gguf]")
    return kind == LOOKUP, gguf or None


def find_llamacpp_python() -> str | None:
    """A Python that can import llama_cpp: this one, $DRAFTSMITH_LLAMACPP_PYTHON, or ./.venv-llamacpp."""
    return find_python("llama_cpp", "DRAFTSMITH_LLAMACPP_PYTHON", ".venv-llamacpp")


def target_gguf(spec: str, target) -> Path:
    """The GGUF file a target folder was converted from (its conversion record), or bad input."""
    record = Path(getattr(target, "path", None) or ".") / CONVERSION_RECORD
    source = None
    if record.is_file():
        try:
            source = json.loads(record.read_text()).get("source")
        except ValueError:
            source = None
    if not source or not Path(source).is_file():
        raise BadInputError(
            FIELD, spec, f"{spec}:FILE.gguf", "the target was not converted from a GGUF file found here"
        )
    return Path(source)


def check_gguf_file(spec: str, path: Path) -> Path:
    if not path.is_file():
        raise BadInputError(FIELD, spec, "an existing .gguf file", f"no such file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise BadInputError(FIELD, spec, "a GGUF file", f"{path} starts with {magic!r}, not b'GGUF'")
    return path


def batch_output(reply: dict) -> BatchOutput:
    """A worker reply -> BatchOutput; target forwards are the worker's counted evals (prefill included)."""
    token_ids = [[int(t) for t in ids] for ids in reply["token_ids"]]
    ttft = [None if t is None else float(t) for t in reply["ttft_s"]]
    forwards = sum(int(f) for f in reply["forwards"])
    return BatchOutput(token_ids, float(reply["wall_s"]), ttft, target_forwards=forwards)


class LlamaCppMethod(WorkerMethod):
    """llama.cpp on a GGUF file (plain, or with its prompt-lookup draft) in a worker process."""

    engine = "llama.cpp"
    max_batch = 1  # llama-cpp-python's Llama decodes one sequence

    def __init__(self, spec: str, target, python: str | None = None, threads: int | None = None,
                 max_model_len: int = 2048, ready_timeout_s: float = 300.0):  # fmt: skip
        lookup, gguf = parse_llamacpp_method(spec)
        path = check_gguf_file(spec, Path(gguf).expanduser()) if gguf else target_gguf(spec, target)
        self.python = python or find_llamacpp_python()
        if self.python is None or not shutil.which(self.python):
            raise BadInputError(
                FIELD, spec, f"a Python with llama-cpp-python (found {self.python})", INSTALL_HINT
            )
        self.eos = list(getattr(target, "eos_token_ids", None) or [])
        threads = threads or torch.get_num_threads()  # the same threads as draftsmith's own rows
        cmd = [self.python, str(WORKER), "--model", str(path.absolute()), "--threads", str(threads)]
        cmd += ["--n-ctx", str(max_model_len), "--lookup", str(LOOKUP_TOKENS if lookup else 0)]
        self._setup(spec)
        try:
            self.ready = self._launch(cmd, worker_env(self.python, WORKER_ENV), ready_timeout_s)
        except BaseException:
            self.failed = True
            self.close(timeout_s=2.0)
            raise
        self.facts = {
            "engine": f"llama.cpp (llama-cpp-python {self.ready.get('llama_cpp_version')})",
            "weights": self.ready.get("file_type"),
            "gguf": path.name,
        }

    def unsupported(self, batch: int, params: SamplingParams) -> str | None:
        if batch > 1:
            return f"{self.name}: llama-cpp-python's Llama decodes one sequence at a time"
        return None

    def run(
        self, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> BatchOutput:
        request = {"prompts": [[int(t) for t in p] for p in prompts], "max_new_tokens": max_new_tokens}
        request.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, seed=seed)
        request["eos_token_ids"] = self.eos
        return batch_output(self._request(request))
