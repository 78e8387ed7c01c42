"""The memory preflight's capture phase: an offline run whose capture is not made yet loads the WHOLE target
to make it (train/loop/trainer.py `data_steps`), so that phase is estimated too, and the captures that would
fit are planned as commands to run first.

    draftsmith train --preflight target=meta-llama/Llama-3.3-70B-Instruct data.mode=offline --world-size 8

    phase = capture_phase(cfg, shapes, knobs, setup)    # None unless offline with no finished capture
    phase.estimate.peak                                  # bytes per rank while the run captures
    plan = first_fitting(phase.job, budget)              # the mildest capture command that fits, or None
    check_capture(cfg, acc, target, aux)                 # the trainer, before it loads the whole target

"Missing" is decided as train/loop/data_steps.py `ensure_data` decides it: the capture folder of this config
(data_root, capture_dir, storage_label) without a finished capture of these inputs (capture_done). The
`--preflight` finds the target's tokenizer in local files only (no download, no weights): without it no
capture of it can be checked, and the capture counts as missing.

The in-job capture runs under the run's own placement (target_placement, tp_size): the whole target (its
per-rank share from runtime/core/placement.py `placement_shard_fraction`), the parts the trainer already
holds, and one row's no_grad forward at data.max_length (data_recipes/capture.py: one row per forward).
The plans are the placements a capture can run under, each candidate function in CANDIDATES yielding
(what, bytes per rank, command); a new placement is one more function there. Sizes are estimates.
Tests: tests/train/test_preflight_capture.py.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.train.preflight.estimate import Estimate, Knobs, Setup, count
from draftsmith.train.preflight.report import (
    NODE,
    STRATEGY_NAMES,
    Budget,
    DoesNotFit,
    device_budget,
    ep_sizes,
    fmt,
    load_shapes,
    setup_of,
    tp_sizes,
)
from draftsmith.train.preflight.shapes import HUB_ID, TargetShapes
from draftsmith.train.preflight.target_memory import target_forward_bytes
from draftsmith.train.preflight.units import Term, gpu_overheads

log = logging.getLogger("draftsmith")
VLLM_SHARE = 0.9  # vLLM's gpu_memory_utilization default (runtime/workers/vllm_data_worker.py leaves it)
TORCHRUN = ["torchrun", "--nproc-per-node", "{n}", "-m", "draftsmith.runtime.cli"]  # data_recipes/tp_steps.py


# ---- is the capture there? --------------------------------------------------------------------------------
def capture_state(cfg, target, aux_layers) -> tuple[bool, Path]:
    """(whether this config's finished capture is there, its folder): ensure_data's test, with the same
    folder and the same capture_done arguments; no prepared data yet means no capture."""
    from draftsmith.data_recipes.capture import capture_done
    from draftsmith.data_recipes.common import read_record
    from draftsmith.train.loop.data_steps import capture_dir, data_root, storage_label

    d, root = cfg.data, data_root(cfg, target)
    prepared, captured = root / "prepared", capture_dir(root, aux_layers, storage_label(d))
    if read_record(prepared) is None:
        return False, captured
    try:
        done = capture_done(
            target, prepared, captured, aux_layers, d.storage_dtype, "all",
            fp8_last_hidden=d.fp8_last_hidden, fp8_bf16_layers=d.fp8_bf16_layers,
        )  # fmt: skip
    except BadInputError:  # a prepared folder missing a part: the run stops on it with its own message
        return False, captured
    return done is not None, captured


def local_target(spec: str, dtype: torch.dtype):
    """What the data steps read of a target (data_recipes/vllm_engine.py TargetView: name, tokenizer,
    shape facts), from files already here; None when they are not (a Hub id not downloaded, a folder or
    file holding only a config.json)."""
    from draftsmith.data_recipes.vllm_engine import TargetView
    from draftsmith.runtime.core.targets import ALIASES, HUB_PATTERNS

    name = str(dtype).removeprefix("torch.")
    path = Path(spec).expanduser()
    try:
        if path.exists() or spec in ALIASES:
            return TargetView.load(spec, dtype=name)
        if re.fullmatch(HUB_ID, spec):
            from huggingface_hub import snapshot_download

            folder = snapshot_download(spec, allow_patterns=HUB_PATTERNS, local_files_only=True)
            return replace(TargetView.load(folder, dtype=name), name=spec)  # named as the run names it
    except Exception:  # not here (or not loadable): the capture cannot be checked
        return None
    return None


# ---- the capture's bytes per rank ----------------------------------------------------------------------
def row_bytes(s: TargetShapes, length: int, aux: int, tp: int, caches: int = 1, dense: bool = True) -> float:
    """One row's no_grad forward (data_recipes/capture.py capture_batch): `caches` KV caches of `length`
    tokens, one layer's working set, and the states it keeps (each aux layer's output, their
    concatenation, the last hidden state and its copy), split as tensor parallelism over `tp` splits them
    (`dense` False: ep, only the experts split)."""
    b = s.dtype_bytes
    kv = s.arch.kv_cache_bytes(b, tp, dense) if not s.arch.dense else s.layers * 2 * s.kv_width * b / tp
    work = target_forward_bytes(s, "fp32" if b == 4 else "half", tp, dense)
    during = work + b * (aux + 1) * s.hidden  # the layers run: the aux outputs so far, the hidden state
    after = 2 * b * (aux + 1) * s.hidden  # torch.cat of the aux outputs; the last hidden state cloned
    return length * (caches * kv + max(during, after))


def phase_estimate(s: TargetShapes, k: Knobs, setup: Setup, terms: list[Term]) -> Estimate:
    """The capture's terms as an Estimate (resident + its forward), with the fixed overheads on a GPU."""
    est = Estimate(s, k, setup, terms, head_params=0)
    if setup.device == "cuda":
        est.terms.append(gpu_overheads(est.peak, setup.world_size, setup.tp))
    return est


def draftsmith_weights(s: TargetShapes, tp: int, placement: str = "tp") -> float:
    from draftsmith.runtime.core.placement import placement_shard_fraction

    return s.param_bytes * placement_shard_fraction(s.config, tp, placement) + s.buffer_bytes


def draftsmith_capture(
    s: TargetShapes, k: Knobs, setup: Setup, aux: int, parts: bool, placement: str = "tp"
) -> Estimate:
    """draftsmith's engine under `placement` over groups of `setup.tp` ranks (1: the whole target on every
    rank); `parts`: the trainer's embedding, final norm and LM head stay loaded beside it (in-job)."""
    from draftsmith.runtime.core.placement import MIRRORED_CACHES

    tp, b = setup.tp, s.dtype_bytes
    where = f"/ {tp} ranks ({placement}: placement_shard_fraction)" if tp > 1 else "whole on every rank"
    how = f"{count(s.params)} x {b} B, {where}"
    terms = [Term("target weights (the capture)", draftsmith_weights(s, tp, placement), how, "resident")]
    if parts:
        how = "the run's embedding, final norm and LM head, kept through the capture"
        terms.append(Term("target parts (training's)", s.part_bytes, how, "resident"))
    caches = MIRRORED_CACHES if tp > 1 else 1  # a TP follower keeps the driver's last two caches
    how = f"T={k.length}: {caches} KV cache(s), a layer's work, {aux} aux + last states"
    forward = row_bytes(s, k.length, aux, tp, caches, setup.dense)
    terms.append(Term("capture forward (one row)", forward, how, "batch"))
    return phase_estimate(s, k, setup, terms)


def vllm_capture(s: TargetShapes, k: Knobs, setup: Setup, aux: int) -> Estimate:
    """vLLM's tensor parallelism over `setup.tp` ranks (an estimate): the layers split as
    train/preflight/families.py splits them (k/v replicated past num_key_value_heads), the embedding and
    LM head split by vocabulary (VocabParallelEmbedding, ParallelLMHead); one row's forward."""
    n = setup.tp
    weights = s.arch.weights_per_rank(s.param_bytes, n) - s.part_bytes * (1 - 1 / n) + s.buffer_bytes
    how = f"{count(s.params)} x {s.dtype_bytes} B / {n} ranks (vLLM: vocabulary and heads split)"
    terms = [Term("target weights (the capture)", weights, how, "resident")]
    how = f"T={k.length}, a layer's work, {aux} aux + last states (vLLM's KV cache: the rest of its share)"
    terms.append(Term("capture forward (one row)", row_bytes(s, k.length, aux, n, 0), how, "batch"))
    return phase_estimate(s, k, setup, terms)


# ---- the plans: placements a capture can run under ---------------------------------------------------------
@dataclass(frozen=True)
class CaptureJob:
    """What the candidates read: the target, the run's knobs and setup (its ranks), the aux layer count,
    and the capture's `draftsmith data capture ...` words for one process (train/loop/data_steps.py)."""

    shapes: TargetShapes
    knobs: Knobs
    setup: Setup
    aux: int
    words: tuple[str, ...]


@dataclass(frozen=True)
class CapturePlan:
    what: str  # the engine and placement, in words
    per_rank: float  # the capture's peak bytes per rank
    command: str
    share: float = 1.0  # the part of a device the engine may use (vLLM: gpu_memory_utilization)

    def fits(self, budget: float) -> bool:
        return self.per_rank <= self.share * budget


def launched(job: CaptureJob, extra: list[str]) -> str:
    """The capture under torchrun over the run's ranks (data_recipes/tp_steps.py), or alone on one."""
    n = job.setup.world_size
    torchrun = [w.format(n=n) for w in TORCHRUN]
    if n > NODE and n % NODE == 0:  # several nodes: run the same line on each (--node-rank, --rdzv-*)
        torchrun[1:3] = ["--nnodes", str(n // NODE), "--nproc-per-node", str(NODE)]
    words = torchrun + list(job.words[1:]) if n > 1 else list(job.words)
    return shlex.join(words + extra)


def placement_flags(placement: str, size: int) -> list[str]:
    """`data capture`'s own flags for a placement over groups of `size` ranks (data_recipes/tp_steps.py)."""
    from draftsmith.data_recipes.tp_steps import FLAGS
    from draftsmith.runtime.core.placement import SIZE_KEY

    if placement == "replicate":
        return []
    return [FLAGS["target_placement"], placement, FLAGS[SIZE_KEY[placement]], str(size)]


def draftsmith_replicate(job: CaptureJob) -> Iterator[CapturePlan]:
    setup = replace(job.setup, tp=1)
    est = draftsmith_capture(job.shapes, job.knobs, setup, job.aux, parts=False)
    n = setup.world_size
    yield CapturePlan(
        f"draftsmith's engine, the target whole on each of {n} rank(s)", est.peak, launched(job, [])
    )


def draftsmith_tp(job: CaptureJob) -> Iterator[CapturePlan]:
    for tp in tp_sizes(job.shapes, job.setup.world_size):  # runtime/core/placement.py check_placement's
        est = draftsmith_capture(job.shapes, job.knobs, replace(job.setup, tp=tp), job.aux, parts=False)
        flags = placement_flags("tp", tp)
        yield CapturePlan(
            f"draftsmith's engine, tensor parallel over {tp} ranks", est.peak, launched(job, flags)
        )


def vllm_tp(job: CaptureJob) -> Iterator[CapturePlan]:
    """vLLM's TP where it goes past draftsmith's (TP <= the KV heads, or none for the family): GPUs only."""
    from draftsmith.data_recipes.vllm_engine import check_tensor_parallel

    s, world = job.shapes, job.setup.world_size
    if job.setup.device != "cuda":
        return
    ours = max(tp_sizes(s, world), default=1)
    for n in range(ours + 1, world + 1):
        try:
            check_tensor_parallel(s.config, n)
        except BadInputError:
            continue
        if world % n:
            continue
        setup = replace(job.setup, tp=n, world_size=1)  # one process; its TP group's one communicator
        est = vllm_capture(s, job.knobs, setup, job.aux)
        command = shlex.join([*job.words, "--engine", "vllm", "--tensor-parallel-size", str(n)])
        what = f"vLLM, tensor parallel over {n} GPUs, one process; it needs a Python with vLLM: --vllm-python"
        yield CapturePlan(what, est.peak, command, VLLM_SHARE)


def draftsmith_ep(job: CaptureJob) -> Iterator[CapturePlan]:
    """Expert parallelism for a MoE target (runtime/core/placement.py): the experts E/n a rank, attention
    split where the heads allow; it goes past TP's KV-head cap (Qwen3-235B-A22B: 4) and takes MLA."""
    for n, dense in ep_sizes(job.shapes, job.setup.world_size):
        setup = replace(job.setup, tp=n, dense=dense)
        est = draftsmith_capture(job.shapes, job.knobs, setup, job.aux, parts=False, placement="ep")
        attention = "attention split too" if dense else "attention whole"
        what = f"draftsmith's engine, experts over {n} ranks ({attention})"
        yield CapturePlan(what, est.peak, launched(job, placement_flags("ep", n)))


# Each yields the placements it can run, mildest first.
CANDIDATES = [draftsmith_replicate, draftsmith_tp, draftsmith_ep, vllm_tp]


def plans(job: CaptureJob) -> Iterator[CapturePlan]:
    for candidate in CANDIDATES:
        yield from candidate(job)


def first_fitting(job: CaptureJob, budget: float) -> CapturePlan | None:
    return next((p for p in plans(job) if p.fits(budget)), None)


# ---- the phase, for `--preflight` and for a run ---------------------------------------------------------
@dataclass
class CapturePhase:
    estimate: Estimate  # the in-job capture, under the run's placement
    folder: Path  # where the capture goes (under a placeholder DIR when the run's cannot be known here)
    job: CaptureJob
    prepare: str | None  # the prepare step to run before a capture of its own, when it is not done
    note: str  # why the capture counts as missing
    placement: str = "replicate"  # the run's target_placement

    def where(self) -> str:
        """Which capture, under which placement."""
        tp = self.estimate.setup.tp
        placement = f"target_placement={self.placement}" + (f" over {tp} ranks" if tp > 1 else "")
        return f"{self.note}; the run loads the whole target to make it, {placement}"

    def rows(self, columns: int, width: int) -> list[str]:
        """The phase as table rows: the same value under each of `columns` strategies."""
        est = self.estimate
        lines = [f"capture phase ({self.where()}):"]
        for t in est.terms:
            note = f"  {t.how}" if columns == 1 else ""
            lines.append(f"  {t.name:<{width - 2}}" + f"{fmt(t.bytes):>13}" * columns + note)
        return lines + [f"{'capture peak':<{width}}" + f"{fmt(est.peak):>13}" * columns]

    def own_command(self) -> str:
        """The run's in-job capture as a command of its own (the same placement, ranks and folder)."""
        return launched(self.job, placement_flags(self.placement, self.estimate.setup.tp))

    def advice(self, budget: Budget) -> list[str]:
        """What would fit the capture: the mildest plan, as a command to run before the training run."""
        plan = first_fitting(self.job, budget.bytes)
        if plan is None:
            best = min(plans(self.job), key=lambda p: p.per_rank / p.share)
            return [f"no capture placement listed fits: {best.what} needs {fmt(best.per_rank)} per rank"]
        share = (
            f" (vLLM takes {VLLM_SHARE:g} of a device: {fmt(plan.share * budget.bytes)})"
            if plan.share < 1
            else ""
        )
        lines = [f"the capture first, as its own job ({plan.what}): {fmt(plan.per_rank)} per rank{share}"]
        lines += [f"  {self.prepare}"] if self.prepare else []
        lines.append(f"  {plan.command}")
        then = "then this run reads the capture and only the target's parts"
        if self.folder.parts[0] == "DIR":  # capture_phase's placeholder: the run must name the same folder
            then += " (with data.dir=DIR: a folder every rank sees)"
        return lines + [f"  {then}"]


def capture_job(
    cfg, shapes: TargetShapes, knobs: Knobs, setup: Setup, target, aux
) -> tuple[CaptureJob, str | None]:
    """The job, and the prepare line when the prepared data is not there yet (the capture reads it)."""
    from draftsmith.data_recipes.common import read_record
    from draftsmith.train.loop.data_steps import data_commands, data_root

    steps = [shlex.split(c) for c in data_commands(cfg, target, aux, 1)]
    prepare = None if read_record(data_root(cfg, target) / "prepared") else shlex.join(steps[0])
    return CaptureJob(shapes, knobs, setup, len(aux), tuple(steps[-1])), prepare


def capture_phase(cfg, shapes: TargetShapes, knobs: Knobs, setup: Setup) -> CapturePhase | None:
    """`--preflight`: the in-job capture of an offline run without its finished capture, else None."""
    from draftsmith.runtime.core.target import pick_dtype
    from draftsmith.runtime.heads.aux_layers import resolve_aux_layers

    if knobs.mode != "offline" or knobs.cotrain is not None:
        return None
    aux = resolve_aux_layers(cfg.head.aux_layers, shapes.layers)
    target = local_target(cfg.target, pick_dtype(cfg.dtype, torch.device(setup.device)))  # as the run loads
    note = "no finished capture in {}"
    if target is None and not cfg.data.dir:  # the default folder is keyed by the tokenizer: name one
        cfg = copy.deepcopy(cfg)
        cfg.data.dir = "DIR"
        note = "no tokenizer of the target here to look for its capture, so it counts as missing"
    elif target is None:
        note = "no tokenizer of the target here to check {}, so it counts as missing"
    else:
        found, _ = capture_state(cfg, target, aux)
        if found:
            return None
    job, prepare = capture_job(cfg, shapes, knobs, setup, target, aux)
    folder = Path(job.words[job.words.index("--out") + 1])
    est = draftsmith_capture(shapes, knobs, setup, len(aux), True, cfg.target_placement)
    return CapturePhase(est, folder, job, prepare, note.format(folder), cfg.target_placement)


def offline_advice(cfg, shapes: TargetShapes, knobs: Knobs, setup: Setup, budget: Budget) -> list[str]:
    """For the advice `data.mode=offline` of an online run: the capture it needs first, as a plan."""
    cfg = copy.deepcopy(cfg)
    cfg.data.mode = "offline"
    phase = capture_phase(cfg, shapes, replace(knobs, mode="offline"), setup)
    return [] if phase is None else ["  " + line for line in phase.advice(budget)]


def check_capture(cfg, acc, target, aux_layers) -> Estimate | None:
    """A run's capture phase (offline, its capture missing: ensure_data raised PartsOnlyError on every
    rank), before the whole target loads: the table, then (train.preflight=check) a refusal naming the
    capture command that fits when the estimate exceeds the device's memory on any rank."""
    from draftsmith.runtime.core.placement import configured_tp

    setup = replace(setup_of(acc, cfg.train.mixed_precision), tp=configured_tp(cfg, acc.num_processes))
    phase = None
    try:
        shapes = load_shapes(cfg, setup.device, resolve=True)
        knobs = Knobs.from_config(cfg, shapes)
        est = draftsmith_capture(shapes, knobs, setup, len(aux_layers), True, cfg.target_placement)
        job, _ = capture_job(cfg, shapes, knobs, setup, target, aux_layers)
        _, folder = capture_state(cfg, target, aux_layers)
        note = f"no finished capture in {folder}"
        phase = CapturePhase(est, folder, job, None, note, cfg.target_placement)
    except DraftsmithError:
        raise
    except Exception as err:  # the estimate's own failure never stops a run (as check_before_load)
        log.warning("memory preflight of the capture skipped: %s: %s", type(err).__name__, err)
    budget = device_budget(cfg, acc.device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    fits = phase is None or phase.estimate.peak <= budget.bytes
    flag = torch.tensor([float(fits)], device=acc.device)
    if acc.num_processes > 1:  # one verdict for all: a rank that loads alone would wait for the others
        fits = bool(acc.gather(flag).min() > 0)
    if phase is None:
        return None
    log.info("%s", phase_table(phase, budget))
    if not fits:
        message = capture_refusal(phase, budget)
        if cfg.train.preflight == "check":
            raise DoesNotFit(message)
        log.warning("train.preflight=warn: %s", message)
    return phase.estimate


def phase_table(phase: CapturePhase, budget: Budget) -> str:
    est = phase.estimate
    width = max(len(t.name) for t in est.terms) + 2
    where = f"{est.setup.world_size} rank(s), {STRATEGY_NAMES.get(est.setup.strategy, est.setup.strategy)}"
    lines = [f"memory preflight of the capture (an estimate, bytes per rank): {est.shapes.name}, {where}"]
    lines += phase.rows(1, max(width, 36))
    verdict = "fits" if est.peak <= budget.bytes else "NO"
    lines.append(f"{f'fits in {fmt(budget.bytes)}?':<{max(width, 36)}}{verdict:>13}")
    return "\n".join(lines)


def capture_refusal(phase: CapturePhase, budget: Budget) -> str:
    est = phase.estimate
    terms = ", ".join(f"{t.name} {fmt(t.bytes)}" for t in est.largest(3))
    fits = "\n  ".join(phase.advice(budget))
    return (
        f"memory per rank: the capture phase {fmt(est.peak)} exceeds {budget.where} ({phase.where()}); "
        f"the largest terms: {terms}\n"
        f"what would fit:\n  {fits}\n"
        f"to try anyway: train.preflight=warn (or train.preflight_device_gb=N for another budget)"
    )
