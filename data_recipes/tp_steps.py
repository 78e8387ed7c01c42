"""`draftsmith data capture|regenerate` over several processes: the target whole on each or tensor parallel.

    torchrun --nproc-per-node 2 -m draftsmith.runtime.cli data capture --target-placement tp \\
        --target T --data D --out OUT                       # one TP group of 2: one capture
    torchrun --nproc-per-node 8 -m draftsmith.runtime.cli data regenerate --target-placement tp \\
        --tp-size 4 --data D --out OUT                      # 2 groups of 4: OUT/part-0000K-of-00002/
    record = run_step(args, "capture", work)                # what run_from_args calls (None off the leaders)

The processes form the (dp, tp) mesh training uses (runtime/core/placement.py): consecutive ranks make a TP
group, each group's rank 0 runs the step (`driving`) while the others replay its target calls (`follow`),
and only that rank writes files. With G = world / tp groups, group g makes part g of G of the step
(data_recipes/parts.py), as `--num-shards G --shard-index g` would, and the parts read as one folder.
Explicit `--num-shards N --shard-index K` (one launch per machine) combine with the groups: the launch
makes parts K*G .. K*G+G-1 of N*G, which read as one with the other launches' parts. With
`--target-placement replicate` (the default) under a launcher every rank is a group of one: the target
whole on each, part RANK of WORLD.

`--process-group-timeout-s` (default 1800, as `train.process_group_timeout_s`) is the process group's
timeout: it bounds how long a follower waits for its leader's next call and the wait for the slowest
group at the end; one that runs out is a `BadInputError` naming the flag (gloo raises it in the waiting
rank; NCCL's watchdog may end the process first). Bad placements are refused before anything loads.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed

from draftsmith.data_recipes.parts import check_shard_args, require_whole
from draftsmith.runtime.core.launch import (
    DEFAULT_TIMEOUT_S,
    Launch,
    check_timeout,
    process_group,
    rank_device,
    waiting,
)
from draftsmith.runtime.core.placement import Layout, check_placement, driving, follow
from draftsmith.runtime.errors import BadInputError, renamed_fields

log = logging.getLogger("draftsmith")
FLAGS = {"target_placement": "--target-placement", "tp_size": "--tp-size", "ep_size": "--ep-size"}


@dataclass(frozen=True)
class StepPlan:
    """This rank's share of the step: its place on the mesh and the part its group makes."""

    layout: Layout
    num_shards: int
    shard_index: int
    device: str

    @property
    def leader(self) -> bool:
        return self.layout.tp_rank == 0


def group_words(layout: Layout) -> str:
    """How a group holds the target, for the log: tensor parallel, expert parallel, or whole."""
    if layout.tp == 1:
        return "the target whole on each"
    if layout.experts:
        return "experts split, attention " + ("split" if layout.dense else "whole on each")
    return "tensor parallel"


def launch_line(step: str, tp: int | str = "N", placement: str = "tp") -> str:
    return (
        f"torchrun --nproc-per-node {tp} -m draftsmith.runtime.cli data {step} "
        f"--target-placement {placement} --{placement}-size {tp} ..."
    )


def plan_step(args, launch: Launch, step: str) -> StepPlan:
    """This rank's plan, or a BadInputError naming the flag, before the target loads: TP without a
    process group, a placement the family has no plan for, a TP size that does not divide the heads or
    the processes, explicit shards out of range."""
    check_shard_args(args.num_shards, args.shard_index)
    placement, tp_size = getattr(args, "target_placement", "replicate"), getattr(args, "tp_size", None)
    ep_size = getattr(args, "ep_size", None)
    size = ep_size if placement == "ep" else tp_size
    check_timeout(getattr(args, "process_group_timeout_s", DEFAULT_TIMEOUT_S))
    if placement in ("tp", "ep") and launch.world == 1 and size != 1:
        raise BadInputError(
            "--target-placement",
            f"{placement} in one process (no process group: WORLD_SIZE unset)",
            f"a launch of a multiple of --{placement}-size processes",
            f"run it as `{launch_line(step, size or 'N', placement)}`, or drop --target-placement",
        )
    config = None
    if placement in ("tp", "ep"):
        from transformers import AutoConfig

        from draftsmith.runtime.core.targets import resolve_target

        config = AutoConfig.from_pretrained(resolve_target(args.target).path)
    with renamed_fields(FLAGS):
        layout = check_placement(
            config, placement, tp_size, launch.world, launch.rank, launch.local_world, ep_size
        )
    shards, index = args.num_shards * layout.dp, args.shard_index * layout.dp + layout.dp_rank
    return StepPlan(layout, shards, index, rank_device(args.device, launch))


def run_step(args, step: str, work: Callable) -> dict | None:
    """Run `work(target, num_shards, shard_index)` (the step on a loaded target; returns its record) on
    this rank's share: the whole step in one process; under a launcher, the group's part on the group's
    rank 0, the others following it. Returns the record on the leaders, None on the followers."""
    launch = Launch.from_env()
    plan = plan_step(args, launch, step)
    if launch.world == 1:
        return work(load_target(args, plan), plan.num_shards, plan.shard_index)
    timeout_s = getattr(args, "process_group_timeout_s", DEFAULT_TIMEOUT_S)
    with process_group(plan.device, timeout_s):
        target = load_target(args, plan)
        if plan.layout.rank == 0:
            log.info(
                "%s: %d process(es) as %d group(s) of %d (%s); group g makes part %d+g of %d",
                step,
                launch.world,
                plan.layout.dp,
                plan.layout.tp,
                group_words(plan.layout),
                args.shard_index * plan.layout.dp,
                plan.num_shards,
            )
        record = None
        if not plan.leader:
            with waiting(plan.layout.rank, timeout_s, "the next call of its group's rank 0"):
                follow(target)
        else:
            with driving(target) if target.tp_size > 1 else contextlib.nullcontext():
                record = work(target, plan.num_shards, plan.shard_index)
        with waiting(plan.layout.rank, timeout_s, "every group's part"):
            torch.distributed.barrier()
        if plan.layout.rank == 0 and plan.num_shards > 1:
            report_whole(args.out, step, plan.num_shards)
    return record


def load_target(args, plan: StepPlan):
    from draftsmith.runtime.core.target import Target

    layout = plan.layout if plan.layout.tp > 1 else None  # tp 1: the whole target (a plain load)
    return Target.load(args.target, device=plan.device, dtype=args.dtype, layout=layout)


def report_whole(out, step: str, count: int) -> None:
    """On rank 0 after every group is done: whether OUT reads as one folder (names a missing part)."""
    try:
        require_whole(out, "--out", (step,))
    except BadInputError as err:  # e.g. a folder the other nodes' ranks do not share
        log.warning("%s: %s does not read as one folder yet: %s", step, out, err)
        return
    log.info("%s: the %d parts in %s read as one folder", step, count, out)
