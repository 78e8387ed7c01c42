"""`--engine auto` (the default of `draftsmith data regenerate|capture`): which engine runs the step, and why.

    choice = resolve_engine("regenerate", args)   # Choice(engine="vllm" | "draftsmith", reason="...")
    choose_engine("regenerate", args)             # the same, logged as one line, args.engine set to it
    decide(Facts(step="capture", one_process=True, device="cuda", cuda=True, vllm=VllmInstall(...)))

`decide` is the rule, a pure function of `Facts` (no CUDA, vLLM or file needed: tests inject them);
`resolve_engine` gathers the facts from the command line and the machine. auto picks vLLM only when

- the step runs as one process (no torchrun, --target-placement replicate, no --tp-size / --ep-size): the
  vLLM path has its own tensor parallelism (--tensor-parallel-size) and takes none of draftsmith's
  placements (several GPUs, several vLLM engines: scripts/vllm_data_parallel.sh);
- the device is a case where vLLM is the engine to use: on a CPU, where it was measured faster (issue 22:
  `MEASURED`; `MEASURED_NOT_FASTER` holds where it was not, and the log line cites the measurement); on
  a CUDA GPU, `GPU_CASES`: vLLM's serving engine (continuous batching, CUDA graphs, tensor parallelism
  beyond draftsmith's KV-head cap) by design. No GPU run has happened yet, and the log line says so.
  vLLM must run on the device draftsmith's engine would (`--device cpu` or `cuda:N` on a CUDA machine
  keeps it: vLLM takes its GPUs from CUDA_VISIBLE_DEVICES);
- a Python with vLLM is found, by the lookup `--engine vllm` uses (vllm_engine.find_python: --vllm-python,
  $DRAFTSMITH_VLLM_PYTHON, ./.venv-vllm-gpu/bin/python with CUDA, ./.venv-vllm/bin/python). One probe per
  interpreter reads its vLLM from the package metadata (vllm itself is never imported);
- that vLLM fits the device: on a GPU, a CUDA build whose release is in vllm_engine.TESTED_VLLM (a CPU
  build, an unreadable version or an untested release keeps draftsmith's engine; `--engine vllm` runs an
  untested GPU release anyway, with a warning); on a CPU, not a GPU build, and not an untested release;
- it serves the family for the step: regeneration serves every family draftsmith does; capture needs the
  target's vLLM class to implement SupportsEagle3 (`HIDDEN_STATES_ARCHITECTURES`) and no MLA (vLLM's
  hidden-states connector refuses it: DeepSeek-V3 captures with draftsmith's engine under torchrun,
  `--target-placement ep`);
- `--out` (or a part of it, or its resume folder) is not a regeneration that draftsmith's engine made or
  started (started_by): the two engines' folders are different inputs (a vLLM record names vLLM), so
  switching would redo a finished folder or drop a killed run's answers, and a sharded run's parts would
  not read as one.

Anything else runs draftsmith's engine, and the log line says why. An explicit --engine draftsmith|vllm is
never second-guessed (vllm without a vLLM Python stays the exit-2 error, so is an MLA capture). The answers
mean the same whichever engine runs: greedy answers agree up to near-ties (BENCHMARKS.md: 235/235 turns
identical), a sampled turn is seeded per (row, turn) with the same number on both engines
(vllm_regenerate.turn_seed), so it depends on neither batch nor resume (each engine draws its own sample
from it). A part made on another machine is not seen until it is on the shared folder: give sharded runs
across machines an explicit --engine (each part's record stores its command with one).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from draftsmith.data_recipes.common import RECORD_FILE
from draftsmith.data_recipes.vllm_engine import (
    BUILD_HINT,
    GPU_BUILD_HINT,
    VllmInstall,
    in_tested_range,
    tested_vllm_range,
)
from draftsmith.runtime.errors import BadInputError, DraftsmithError

log = logging.getLogger("draftsmith")

# (step, device type) -> why vLLM is the faster engine there. Add a case only with a measurement behind it.
MEASURED = {
    ("regenerate", "cpu"): (
        "1.03-2.6x faster on the CPUs measured here (41.7 vs 40.6 tokens/s on an Intel Xeon with "
        "draftsmith's length-sorted batches, 61-65 vs 23.4 on an AMD EPYC before them; BENCHMARKS.md, "
        '"Regeneration: draftsmith\'s engine vs vLLM-CPU")'
    ),
}

# (step, device type) -> the measurement where vLLM was not faster: auto keeps draftsmith's engine, says why.
MEASURED_NOT_FASTER = {
    ("capture", "cpu"): (
        "0.92x draftsmith's engine on an Intel Xeon (median 980 vs 1070 tokens/s, --max-num-seqs 32; "
        'BENCHMARKS.md, "Capture: draftsmith\'s engine vs vLLM-CPU")'
    ),
}

# (step, device type) -> why vLLM runs the step on a GPU: by design, not measured (issue 47 item 5). When a
# GPU measurement exists, move the case to MEASURED or MEASURED_NOT_FASTER with its numbers.
GPU_CASES = {
    ("regenerate", "cuda"): (
        "on a GPU vLLM batches turns continuously with CUDA graphs, and --tensor-parallel-size splits a "
        "target over GPUs; chosen by design, not yet measured on a GPU"
    ),
    ("capture", "cuda"): (
        "on a GPU vLLM prefills rows in continuous batches with CUDA graphs (extract_hidden_states, chunked "
        "prefill off), and --tensor-parallel-size splits a target past draftsmith's KV-head cap; chosen by "
        "design, not yet measured on a GPU"
    ),
}

# config.json `architectures` whose vLLM class implements SupportsEagle3 (the aux hidden states that
# `extract_hidden_states` caches), among draftsmith's families: vLLM's llama.py (Mistral is vLLM's Llama
# class), qwen2.py, qwen3.py, qwen3_moe.py. Mixtral, Gemma 2 and Gemma 3 do not declare it; DeepSeek-V3
# is MLA.
HIDDEN_STATES_ARCHITECTURES = frozenset(
    ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
)
KEEP = ": draftsmith's engine"


@dataclass(frozen=True)
class Choice:
    engine: str  # "draftsmith" or "vllm"
    reason: str  # one line for the log


@dataclass(frozen=True)
class TargetFacts:
    """What the rule reads of a target's config.json."""

    model_type: str | None
    architecture: str | None  # architectures[0]: the class vLLM loads
    mla: bool  # multi-head latent attention (kv_lora_rank): vLLM's hidden-states connector refuses it


@dataclass(frozen=True)
class Facts:
    """Everything `decide` reads; `gather_facts` fills it from the command line and the machine."""

    step: str  # "regenerate" or "capture"
    one_process: bool  # no launcher world (WORLD_SIZE > 1) and no TP/EP placement asked for
    device: str | None  # the device type draftsmith's engine would run on; None: a --device it refuses
    cuda: bool  # whether this machine has CUDA
    vllm: VllmInstall | None = None  # the vLLM the lookup found; None: none (why: no_vllm)
    no_vllm: str = ""  # "(none at P)" or "(P cannot import vllm)"
    target: TargetFacts | None = None  # capture: the target's class and attention; None: not read
    started_by: str | None = None  # the engine that made or started --out (regenerate), or None
    device_flag: str = "auto"  # --device as typed, for the log line
    out: str | None = None
    max_num_seqs: int = 32


def decide(f: Facts) -> Choice:
    """The engine for `f`, by the rules of this module's docstring, in that order (the first that keeps
    draftsmith's engine names itself in the reason)."""
    early = _before_lookup(f)
    if early is not None:
        return early
    if f.vllm is None:
        hint = GPU_BUILD_HINT if f.device == "cuda" else BUILD_HINT
        return Choice("draftsmith", f"no Python with vLLM found {f.no_vllm}{KEEP}; {hint}")
    unfit = _unfit_install(f.vllm, f.device) or _unserved_family(f.step, f.target)
    if unfit:
        return Choice("draftsmith", f"{unfit}{KEEP}")
    if f.started_by == "draftsmith":  # reruns stay no-ops, resumes resume
        why = f"{f.out} holds a regeneration by draftsmith's engine (done, started or a part of it)"
        return Choice("draftsmith", f"{why}{KEEP}, which finishes or keeps it (--engine vllm redoes it)")
    what = f" ({f.vllm.describe()})" if f.vllm.version else ""
    why = MEASURED.get((f.step, f.device)) or GPU_CASES[(f.step, f.device)]
    return Choice("vllm", f"vLLM at {f.vllm.python}{what}: {why}; its batch: --max-num-seqs {f.max_num_seqs}")


def _before_lookup(f: Facts) -> Choice | None:
    """The rules that need neither vLLM nor the target: the process layout and the device."""
    if not f.one_process:
        why = "a torchrun run or --target-placement tp|ep (the vLLM path takes neither; its TP: --engine vllm"
        return Choice("draftsmith", f"{why} --tensor-parallel-size N){KEEP}")
    if f.device == "cpu" and f.cuda:
        return Choice("draftsmith", f"--device cpu on a machine with CUDA (vLLM picks its own device){KEEP}")
    if f.device == "cuda" and f.device_flag not in ("auto", "cuda"):
        why = f"--device {f.device_flag} (vLLM takes its GPUs from CUDA_VISIBLE_DEVICES, not --device)"
        return Choice("draftsmith", f"{why}{KEEP}")
    if (f.step, f.device) in MEASURED or (f.step, f.device) in GPU_CASES:
        return None
    where = f.device or f"--device {f.device_flag}"
    slower = MEASURED_NOT_FASTER.get((f.step, f.device))
    if slower is not None:
        return Choice("draftsmith", f"vLLM is measured no faster for {f.step} on {where}: {slower}{KEEP}")
    return Choice("draftsmith", f"vLLM is not measured faster for {f.step} on {where}{KEEP}")


def _unfit_install(vllm: VllmInstall, device: str) -> str | None:
    """Why the found vLLM does not fit the device, or None."""
    at = f"the vLLM at {vllm.python}" + (f" ({vllm.describe()})" if vllm.version else "")
    if device == "cuda" and vllm.build == "cpu":
        return f"{at} is a CPU build: it would not use the GPU (`bash scripts/vllm_env_gpu.sh` builds one)"
    if device == "cuda" and vllm.build is None:
        return f"{at} has no readable package metadata: its build and release are unknown"
    if device == "cpu" and vllm.build == "gpu":
        return f"{at} is a GPU build on a machine without CUDA (`bash scripts/vllm_env.sh` builds vllm-cpu)"
    if in_tested_range(vllm.version) is False:
        return f"{at} is outside the tested range {tested_vllm_range()} (--engine vllm runs it anyway)"
    return None


def _unserved_family(step: str, target: TargetFacts | None) -> str | None:
    """Why vLLM cannot run `step` for the target, or None (regeneration: every family; an unread target:
    the step itself says what is wrong with it)."""
    if step != "capture" or target is None:
        return None
    if target.mla:
        return (
            f"vLLM's hidden-states connector refuses MLA (model_type {target.model_type}; capture it under "
            "torchrun with --target-placement ep --ep-size N)"
        )
    if target.architecture not in HIDDEN_STATES_ARCHITECTURES:
        return (
            f"vLLM's {target.architecture} does not declare SupportsEagle3, which extract_hidden_states "
            "needs (--engine vllm tries it anyway)"
        )
    return None


def resolve_engine(step: str, args) -> Choice:
    """The engine `args` asks for; --engine auto resolved by `decide` on this machine's facts."""
    engine = getattr(args, "engine", "draftsmith")
    if engine != "auto":
        return Choice(engine, f"--engine {engine}")
    return decide(gather_facts(step, args))


def gather_facts(step: str, args) -> Facts:
    """The facts of `decide` for this command line on this machine. Only what a rule still needs is read:
    no vLLM lookup where the process layout or the device already decides, the target only for a capture."""
    from draftsmith.data_recipes.vllm_engine import find_python, vllm_install

    device, cuda = _devices(getattr(args, "device", "auto"))
    facts = Facts(step, _one_process(args), device, cuda, device_flag=getattr(args, "device", "auto"),
                  out=getattr(args, "out", None), max_num_seqs=getattr(args, "max_num_seqs", 32))  # fmt: skip
    if _before_lookup(facts) is not None:
        return facts
    try:
        python = find_python(getattr(args, "vllm_python", None), cuda=cuda)
    except BadInputError as e:  # e.expected: "a Python with vLLM (none at P)" or "(P cannot import vllm)"
        return replace(facts, no_vllm=e.expected.removeprefix("a Python with vLLM "))
    target = _target_facts(getattr(args, "target", None)) if step == "capture" else None
    started = started_by(step, getattr(args, "out", None))
    return replace(facts, vllm=vllm_install(python), target=target, started_by=started)


def choose_engine(step: str, args) -> str:
    """resolve_engine, logged as one line when it was --engine auto; sets args.engine to the engine."""
    choice = resolve_engine(step, args)
    if args.engine == "auto":
        log.info("engine auto -> %s: %s", choice.engine, choice.reason)
    args.engine = choice.engine
    return choice.engine


def started_by(step: str, out) -> str | None:
    """The engine that made or started `out` (or any part of it): "draftsmith", "vllm" or None. Only a
    regeneration's inputs name the engine (vLLM's add "engine": "vllm"; a capture's shards are the same)."""
    if step != "regenerate" or not out:
        return None
    out = Path(out)
    stamps = [out / RECORD_FILE, Path(f"{out}.partial") / "inputs.json"]
    for part in sorted(out.glob("part-*-of-*")):  # the parts and their partial folders (part-K-of-N.partial)
        stamps.append(part / ("inputs.json" if part.suffix == ".partial" else RECORD_FILE))
    for stamp in stamps:
        try:
            data = json.loads(stamp.read_text())
        except (OSError, ValueError):
            continue  # none there, or unreadable: the step itself says what is wrong with it
        if stamp.name == RECORD_FILE:  # a record: {"step", "inputs", ...}; a partial's stamp: the inputs
            data = data.get("inputs") if isinstance(data, dict) and data.get("step") == step else None
        if isinstance(data, dict):
            return data.get("engine", "draftsmith")
    return None


def _one_process(args) -> bool:
    """No launcher started several processes (torchrun and accelerate set WORLD_SIZE) and no TP/EP placement
    was asked for: the case the vLLM path runs (data_recipes/tp_steps.py runs the others)."""
    try:
        launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        launched = False  # tp_steps refuses a malformed WORLD_SIZE with its own message
    placed = getattr(args, "target_placement", "replicate") != "replicate" or any(
        getattr(args, key, None) for key in ("tp_size", "ep_size")
    )
    return not launched and not placed


def _devices(device: str) -> tuple[str | None, bool]:
    """(the device type draftsmith's engine would run on, as runtime/core/target.pick_device picks it, or
    None for a string it would refuse; whether CUDA is available)."""
    import torch

    cuda = torch.cuda.is_available()
    if device == "auto":
        return ("cuda" if cuda else "cpu"), cuda
    try:
        return torch.device(device).type, cuda
    except (RuntimeError, ValueError):
        return None, cuda  # the draftsmith path refuses it (exit 2) with pick_device's message


def _target_facts(spec: str | None) -> TargetFacts | None:
    """The target's model_type, architecture and MLA from its config.json; None where it cannot be read
    (the step then refuses the target with its own message)."""
    from draftsmith.data_recipes.vllm_capture import is_mla
    from draftsmith.runtime.core.targets import resolve_target

    try:
        config = json.loads((resolve_target(spec or "smollm2-135m").path / "config.json").read_text())
    except (DraftsmithError, OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    architecture = (config.get("architectures") or [None])[0]
    return TargetFacts(config.get("model_type"), architecture, is_mla(config))
