"""The memory preflight's report: the table a run prints at its start, what would fit, the refusal.

    draftsmith train --preflight --config configs/eagle3-smollm2-135m.yaml \\
        target=meta-llama/Llama-3.3-70B-Instruct data.max_length=4096 --world-size 8

`--preflight` prints one column per strategy (DDP, ZeRO-2, ZeRO-3, FSDP2 over the ranks) and exits 0,
reading nothing but the target's config.json (offline, also its tokenizer if here, to look for the
capture; a missing capture adds its phase: train/preflight/capture.py). A training run estimates its own
strategy before the target loads (`check_before_load`) and refuses with exit code 2 when the estimate
exceeds the device's memory (a GPU's free memory, `train.preflight_device_gb`, or on a CPU the RAM per
local process), naming the largest terms, what would fit, and `train.preflight=warn` to try anyway.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, replace

import torch

from draftsmith.runtime.errors import BadInputError, DraftsmithError, renamed_fields
from draftsmith.train.objectives.registry import objective
from draftsmith.train.preflight.estimate import Estimate, Knobs, Setup, count, estimate
from draftsmith.train.preflight.shapes import TargetShapes, head_parameters
from draftsmith.train.preflight.units import CUDA_CONTEXT

log = logging.getLogger("draftsmith")
GB = 1e9
DEFAULT_DEVICE_GB = 80.0  # an H100 / A100-80GB: the modelled device when no GPU is here
STRATEGY_NAMES = {
    "single": "1 process",
    "ddp": "DDP",
    "fsdp": "FSDP2",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
}
LAUNCH_CONFIGS = {  # what to launch with for a strategy (configs/accelerate/)
    "ddp": "configs/accelerate/ddp-gpu.yaml",
    "fsdp": "configs/accelerate/fsdp-gpu.yaml",
    "zero2": "configs/accelerate/deepspeed-zero2.yaml",
    "zero3": "configs/accelerate/deepspeed-zero3.yaml",
}


class DoesNotFit(BadInputError):
    """The preflight's refusal (exit code 2): the estimate per rank exceeds the device's memory."""

    def __init__(self, message: str):
        self.field, self.got, self.expected, self.hint = "train.preflight", "check", "a run that fits", None
        Exception.__init__(self, message)


@dataclass(frozen=True)
class Budget:
    bytes: float  # per rank
    where: str  # where the number comes from, for the table


def fmt(n: float) -> str:
    """Bytes as GB, MB or kB (1e9, 1e6, 1e3), one decimal."""
    if n >= 0.05 * GB:
        return f"{n / GB:.1f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 0.05e6 else f"{n / 1e3:.1f} kB"


def device_budget(cfg, device: torch.device | None, local_ranks: int = 1) -> Budget:
    """The memory one rank may use: train.preflight_device_gb, else a GPU's free memory, else (a CPU
    run) the RAM shared by the local processes, else (`--preflight` without a GPU) 80 GB."""
    gb = cfg.train.preflight_device_gb
    if gb is not None:
        return Budget(gb * GB, f"{gb:g} GB (train.preflight_device_gb)")
    if device is not None and device.type == "cuda":  # this process's context is taken already, and
        free, total = torch.cuda.mem_get_info(device)  # counted in the estimate: add it back
        where = f"{fmt(free)} free of {fmt(total)} on {device}, + {fmt(CUDA_CONTEXT)}: its own CUDA context"
        return Budget(free + CUDA_CONTEXT, where)
    if device is not None and device.type == "cpu":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        shared = f" / {local_ranks} processes" if local_ranks > 1 else ""
        return Budget(ram / local_ranks, f"{fmt(ram)} of RAM{shared}")
    where = f"{DEFAULT_DEVICE_GB:g} GB (no GPU here: modelled; train.preflight_device_gb sets it)"
    return Budget(DEFAULT_DEVICE_GB * GB, where)


# ---- the table ---------------------------------------------------------------------------------------------
PHASES = (
    ("resident", "resident (the whole run)"),
    ("batch", "batch building (one after another: the largest counts)"),
    ("step", "the step (all at once)"),
)


def header(est: Estimate, budget: Budget) -> list[str]:
    s, k, setup = est.shapes, est.knobs, est.setup
    kind = objective(k.head)
    head, steps = kind.label, kind.steps_label.format(k.steps)
    extra = f", {k.attention} attention" if k.ttt else ""
    if k.checkpointing:
        extra += ", activation checkpointing"
    if k.cotrain:
        extra += f", co-training ({k.cotrain})"
    precision = {"no": "fp32", "bf16": "bf16 mixed precision", "fp16": "fp16 mixed precision"}[
        setup.precision
    ]
    ranks = f"{setup.world_size} rank{'s' if setup.world_size > 1 else ''}"
    return [
        f"memory preflight (an estimate, bytes per rank; GB = 1e9 B): {s.name}, {count(s.params)} "
        f"parameters in {s.dtype_bytes} B, head {count(est.head_params)}",
        f"  {head} {k.mode}, B={k.batch} x T={k.length} x {steps}{extra}; {precision} on {setup.device}; "
        f"{ranks} x {budget.where}",
    ]


def group_name(setup: Setup) -> str:
    """TP=4, EP=8 (experts only: attention whole), or nothing for a replicated target."""
    if setup.tp == 1:
        return ""
    return f" TP={setup.tp}" if setup.dense else f" EP={setup.tp}"


def table(estimates: list[Estimate], budget: Budget, capture=None) -> str:
    """Terms as rows, one column per estimate (strategy); the formulas when there is one column. With a
    `capture` phase (train/preflight/capture.py CapturePhase), its rows first and the peak their max."""
    names = list(dict.fromkeys(t.name for e in estimates for t in e.terms))
    cols = [STRATEGY_NAMES[e.setup.strategy] + group_name(e.setup) for e in estimates]
    width = max(len(n) for n in names) + 2
    if capture is not None:
        width = max([width, 36] + [len(t.name) + 2 for t in capture.estimate.terms])
    lines = header(estimates[0], budget)
    lines.append(" " * width + "".join(f"{c:>13}" for c in cols))
    if capture is not None:
        lines += capture.rows(len(estimates), width) + ["training phase:"]
    for phase, title in PHASES:
        rows = [n for n in names if any(t.name == n and t.phase == phase for e in estimates for t in e.terms)]
        if not rows:
            continue
        lines.append(f"{title}:")
        for name in rows:
            cells, how = [], ""
            for e in estimates:
                term = next((t for t in e.terms if t.name == name), None)
                cells.append(fmt(term.bytes) if term else "-")
                how = how or (term.how if term else "")
            note = f"  {how}" if len(estimates) == 1 else ""
            lines.append(f"  {name:<{width - 2}}" + "".join(f"{c:>13}" for c in cells) + note)
    label = "peak = resident + max(batch, step)" if capture is None else "training peak"
    lines.append(f"{label:<{width}}" + "".join(f"{fmt(e.peak):>13}" for e in estimates))
    peaks = [e.peak if capture is None else max(e.peak, capture.estimate.peak) for e in estimates]
    if capture is not None:
        lines.append(f"{'peak = max(capture, training)':<{width}}" + "".join(f"{fmt(p):>13}" for p in peaks))
    verdict = ["fits" if p <= budget.bytes else "NO" for p in peaks]
    lines.append(f"{f'fits in {fmt(budget.bytes)}?':<{width}}" + "".join(f"{v:>13}" for v in verdict))
    return "\n".join(lines)


# ---- what would fit ------------------------------------------------------------------------------------
_HEAD_PARAMS: dict[tuple, int] = {}


def estimate_cached(shapes: TargetShapes, knobs: Knobs, setup: Setup) -> Estimate:
    """`estimate`, with the head's parameter count (a meta-device build) kept per head shape."""
    k = knobs
    key = (shapes.name, shapes.params, k.head, k.steps, k.draft_vocab, k.aux_layers, k.cotrain)
    key += (repr(k.options),)
    if key not in _HEAD_PARAMS:
        _HEAD_PARAMS[key] = head_parameters(shapes, knobs)
    return estimate(shapes, knobs, setup, _HEAD_PARAMS[key])


def group_sizes(config, placement: str, world: int, local: int | None = None) -> list[tuple[int, bool]]:
    """The group sizes > 1 that `placement` (tp or ep) takes for this target over `world` ranks with `local`
    a node (default: one node), each with whether its attention splits too: what
    runtime/core/placement.py's check_placement accepts (the family's plans, heads, widths and experts
    divisible, the world and the node)."""
    from draftsmith.runtime.core.placement import check_placement

    sizes = []
    for n in (n for n in range(2, world + 1) if world % n == 0):
        tp, ep = (n, None) if placement == "tp" else (None, n)
        try:
            layout = check_placement(config, placement, tp, world, 0, local or world, ep)
        except BadInputError:
            continue
        sizes.append((layout.tp, layout.dense))
    return sizes


def tp_sizes(shapes: TargetShapes, world: int) -> list[int]:
    """The sizes > 1 `target_placement=tp` takes for this target over `world` ranks on one node."""
    return [n for n, _ in group_sizes(shapes.config, "tp", world)]


def ep_sizes(shapes: TargetShapes, world: int) -> list[tuple[int, bool]]:
    """The sizes > 1 `target_placement=ep` takes over `world` ranks on one node, with whether attention
    splits too; [] for a dense target."""
    return group_sizes(shapes.config, "ep", world)


def change_groups(est: Estimate) -> list[list[tuple[str, dict, dict]]]:
    """Kinds of change that lower the peak, each a list of (what to set, knob changes, setup changes),
    mildest first."""
    s, k, setup = est.shapes, est.knobs, est.setup
    groups = []
    if setup.world_size > 1:  # co-training needs every weight whole on a rank: ZeRO-3 and FSDP refuse it
        allowed = ("zero2",) if k.cotrain else ("zero2", "zero3", "fsdp")
        other = [x for x in allowed if x != setup.strategy]
        other.sort(key=lambda x: -estimate_cached(s, k, replace(setup, strategy=x)).peak)
        groups.append([(f"--config_file {LAUNCH_CONFIGS[x]}", {}, {"strategy": x}) for x in other])
    if k.cotrain is None:  # a frozen target can be split; a co-trained one trains whole
        tps = tp_sizes(s, setup.world_size)
        groups.append([(f"target_placement=tp tp_size={t}", {}, {"tp": t}) for t in tps if t > setup.tp])
        eps = [(n, d) for n, d in ep_sizes(s, setup.world_size) if n > setup.tp or not (setup.dense or d)]
        groups.append([(f"target_placement=ep ep_size={n}", {}, {"tp": n, "dense": d}) for n, d in eps])
    if k.mode == "online" and k.cotrain is None:
        groups.append(
            [("data.mode=offline (a capture first: draftsmith data capture)", {"mode": "offline"}, {})]
        )
    if k.ttt and k.attention == "dense":
        groups.append([("train.ttt_attention=decomposed", {"attention": "decomposed"}, {})])
    if k.ttt and k.attention != "flex" and setup.device == "cuda":  # O(T) a query, not yet run on a GPU
        groups.append([("train.ttt_attention=flex (GPU-only, unmeasured)", {"attention": "flex"}, {})])
    if k.ttt and not k.checkpointing:  # it needs the decomposed attention
        label = "train.activation_checkpointing=true" + (
            " train.ttt_attention=decomposed" * (k.attention == "dense")
        )
        groups.append([(label, {"checkpointing": True, "attention": "decomposed"}, {})])
    accum = "(train.grad_accum x{:g} keeps the batch)"
    groups.append(
        [
            (f"train.batch_size={b} {accum.format(k.batch / b)}", {"batch": b}, {})
            for b in range(k.batch - 1, 0, -1)
        ]
    )
    lengths = [k.length // 2**i for i in range(1, 8) if k.length // 2**i >= 256]
    groups.append([(f"data.max_length={t}", {"length": t}, {}) for t in lengths])
    if k.ttt:
        groups.append([(f"train.ttt_steps={n}", {"steps": n}, {}) for n in range(k.steps - 1, 0, -1)])
    return [g for g in groups if g]


def trial(est: Estimate, knobs: dict, setup: dict) -> Estimate:
    return estimate_cached(est.shapes, replace(est.knobs, **knobs), replace(est.setup, **setup))


def would_fit(est: Estimate, budget: float, most: int = 3) -> list[str]:
    """What brings the peak under `budget`: the mildest change of each kind that does on its own; when
    none does, the fewest kinds that do together (up to `most` such sets), each at its mildest option."""
    groups = change_groups(est)
    lines = []
    for options in groups:
        for label, knobs, setup in options:
            peak = trial(est, knobs, setup).peak
            if peak <= budget:
                lines.append(f"{label}: {fmt(peak)}")
                break
    if lines:
        return lines

    def together(chosen) -> Estimate:
        knobs, setup = {}, {}
        for _, k2, s2 in chosen:
            knobs, setup = knobs | k2, setup | s2
        return trial(est, knobs, setup)

    for size in range(2, len(groups) + 1):
        for combo in itertools.combinations(range(len(groups)), size):
            chosen = {i: groups[i][-1] for i in combo}  # each kind at its strongest
            if together(chosen.values()).peak > budget:
                continue
            for i in combo:  # then each as mild as still fits
                chosen[i] = next(o for o in groups[i] if together({**chosen, i: o}.values()).peak <= budget)
            peak = together(chosen.values()).peak
            lines.append(f"together: {'; '.join(label for label, _, _ in chosen.values())}: {fmt(peak)}")
            if len(lines) == most:
                return lines
        if lines:
            return lines
    best = together([options[-1] for options in groups])
    weights = next(t for t in best.terms if t.name == "target weights")
    return [f"nothing listed fits: {fmt(best.peak)} with all of them (target weights {fmt(weights.bytes)})"]


def refusal(est: Estimate, budget: Budget) -> str:
    terms = ", ".join(f"{t.name} {fmt(t.bytes)}" for t in est.largest(4))
    fits = "\n  ".join(would_fit(est, budget.bytes))
    return (
        f"memory per rank: the estimate {fmt(est.peak)} exceeds {budget.where} "
        f"({STRATEGY_NAMES[est.setup.strategy]}, {est.setup.world_size} rank(s)); "
        f"the largest terms: {terms}\n"
        f"what would fit:\n  {fits}\n"
        f"to try anyway: train.preflight=warn (or train.preflight_device_gb=N for another budget)"
    )


# ---- a run, and `draftsmith train --preflight` -----------------------------------------------------------
def setup_of(acc, precision: str) -> Setup:
    """The strategy Accelerate runs (DeepSpeed's stage, FSDP, DDP or one process) on its device."""
    from accelerate.utils import DistributedType

    plugin = getattr(acc.state, "deepspeed_plugin", None)
    if plugin is not None:
        strategy = f"zero{plugin.zero_stage}" if plugin.zero_stage in (1, 2, 3) else "ddp"
    elif acc.distributed_type == DistributedType.FSDP:
        strategy = "fsdp"
    else:
        strategy = "ddp" if acc.num_processes > 1 else "single"
    return Setup(strategy, acc.num_processes, acc.device.type, precision)


def load_shapes(cfg, device_type: str, resolve: bool) -> TargetShapes:
    from draftsmith.runtime.core.target import pick_dtype

    with renamed_fields({"--target": "target", "--dtype": "dtype"}):
        return TargetShapes.load(cfg.target, pick_dtype(cfg.dtype, torch.device(device_type)), resolve)


def check_before_load(cfg, acc) -> Estimate | None:
    """Estimate this run before its target loads; print the table; refuse (train.preflight=check) or
    warn when it exceeds the device's memory."""
    from draftsmith.runtime.core.placement import configured_tp, splits_dense

    setup = replace(setup_of(acc, cfg.train.mixed_precision), tp=configured_tp(cfg, acc.num_processes))
    shapes = load_shapes(cfg, setup.device, resolve=True)
    if setup.tp > 1:
        setup = replace(setup, dense=splits_dense(shapes.config, cfg.target_placement, setup.tp))
    knobs = Knobs.from_config(cfg, shapes)
    try:
        est = estimate_cached(shapes, knobs, setup)
    except DraftsmithError:
        raise
    except Exception as err:  # the estimate's own failure (a config it cannot build) never stops a run
        log.warning("memory preflight skipped: %s: %s", type(err).__name__, err)
        return None
    budget = device_budget(cfg, acc.device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    log.info("%s", table([est], budget))
    if est.peak > budget.bytes:
        message = refusal(est, budget)
        if cfg.train.preflight == "check":
            raise DoesNotFit(message)
        log.warning("train.preflight=warn: %s", message)
    return est


NODE = 8  # GPUs per node the smallest-setup line assumes (an 8 x H100 / H200 node)
