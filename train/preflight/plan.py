"""`draftsmith train --preflight`: the memory table for every strategy over the ranks, what would fit under
the best one, the capture an offline run still needs, and the fewest nodes on which the run fits as
configured. Reads the target's config.json only (a meta-device model), never weights.

    draftsmith train --preflight --config C target=Qwen/Qwen3-235B-A22B data.max_length=4096 --world-size 8
    text = preflight_report(cfg, world_size=8)      # the same, from code (tests/train/test_preflight.py)

The table and its terms are train/preflight/report.py's; the capture phase is train/preflight/capture.py's.
"""

from __future__ import annotations

import os

import torch

from draftsmith.train.preflight.capture import capture_phase, offline_advice
from draftsmith.train.preflight.estimate import Estimate, Knobs, Setup
from draftsmith.train.preflight.report import (
    NODE,
    STRATEGY_NAMES,
    device_budget,
    estimate_cached,
    fmt,
    group_sizes,
    load_shapes,
    table,
    trial,
    would_fit,
)


def preflight_report(cfg, world_size: int | None = None) -> str:
    """`draftsmith train --preflight`: the table for every strategy over the ranks, and what would fit
    under the best one; reads the target's config.json only."""
    from draftsmith.runtime.core.placement import check_placement

    cuda = torch.cuda.is_available()
    device = "cpu" if cfg.device == "cpu" else "cuda"  # without a GPU the table models one
    world = world_size or int(os.environ.get("WORLD_SIZE", "0")) or (torch.cuda.device_count() if cuda else 8)
    precision = cfg.train.mixed_precision  # "auto" as trainer.requested_precision reads it
    if precision == "auto":
        precision = "bf16" if device == "cuda" else "no"
    shapes = load_shapes(cfg, device, resolve=False)
    layout = check_placement(shapes.config, cfg.target_placement, cfg.tp_size, world, 0, world, cfg.ep_size)
    knobs = Knobs.from_config(cfg, shapes)
    strategies = ["single"] if world == 1 else ["ddp", "zero2"] + ([] if knobs.cotrain else ["zero3", "fsdp"])
    setups = [Setup(s, world, device, precision, layout.tp, layout.dense) for s in strategies]
    estimates = [estimate_cached(shapes, knobs, setup) for setup in setups]
    here = torch.device("cpu") if device == "cpu" else torch.device("cuda", 0) if cuda else None
    budget = device_budget(cfg, here)
    best = min(estimates, key=lambda e: e.peak)
    capture = capture_phase(cfg, shapes, knobs, estimates[0].setup)  # offline, no finished capture yet
    lines = [table(estimates, budget, capture)]
    if capture is not None and capture.estimate.peak > budget.bytes:
        what = "; ".join(f"{t.name} {fmt(t.bytes)}" for t in capture.estimate.largest(3))
        lines.append(f"the capture phase does not fit ({capture.where()}); the largest terms: {what}")
        lines.append("what would fit the capture:\n  " + "\n  ".join(capture.advice(budget)))
    elif capture is not None:  # the same capture as its own job, for a run that should not make it
        steps = [capture.prepare] if capture.prepare else []
        steps.append(capture.own_command())
        lines.append("the capture fits in the job; to make it beforehand instead:\n  " + "\n  ".join(steps))
    if best.peak > budget.bytes:
        what = "; ".join(f"{t.name} {fmt(t.bytes)}" for t in best.largest(3))
        lines.append(
            f"does not fit under any strategy; the largest terms "
            f"({STRATEGY_NAMES[best.setup.strategy]}): {what}"
        )
        fits = would_fit(best, budget.bytes)
        if any(line.startswith("data.mode=offline") for line in fits):  # and its capture, planned
            at = next(i for i, line in enumerate(fits) if line.startswith("data.mode=offline")) + 1
            fits[at:at] = offline_advice(cfg, shapes, knobs, best.setup, budget)
        lines.append("what would fit:\n  " + "\n  ".join(fits))
        more = smallest_setup(best, budget.bytes, best.setup.world_size)
        if more:
            lines.append(more)
    return "\n".join(lines)


def placements_over(config, world: int, frozen: bool) -> list[tuple[str, int, bool]]:
    """(words, group size, attention split) for the target whole, and, for a frozen target, every tp size
    inside a node and every ep size (whole nodes allowed) that check_placement takes over `world` ranks."""
    from draftsmith.runtime.core.placement import SIZE_KEY

    options = [("", 1, True)]
    for placement in ("tp", "ep") if frozen else ():
        for n, dense in group_sizes(config, placement, world, NODE):
            options.append((f" with target_placement={placement} {SIZE_KEY[placement]}={n}", n, dense))
    return options


def smallest_setup(est: Estimate, budget: float, beyond: int = 0, most_nodes: int = 8) -> str | None:
    """The fewest nodes of this device past `beyond` ranks (the ones "what would fit" already tried) on
    which the run as configured fits: its strategy, the target replicated, tensor parallel inside a node,
    or expert parallel over whole nodes. None when it fits within `beyond` ranks."""
    for nodes in range(1, most_nodes + 1):
        world = nodes * NODE
        for words, n, dense in placements_over(est.shapes.config, world, est.knobs.cotrain is None):
            peak = trial(est, {}, {"world_size": world, "tp": n, "dense": dense}).peak
            if peak <= budget:
                if world <= beyond:
                    return None
                where = f"{world} ranks ({nodes} node(s) x {NODE} of this device){words}"
                return f"the smallest setup that fits as configured: {where}: {fmt(peak)}"
    return f"no setup of up to {most_nodes} nodes x {NODE} of this device fits as configured"
