"""Run a verb's work on the target split over a tensor- or expert-parallel group: the group's rank 0 drives,
the others follow.

    torchrun --nproc-per-node 4 -m draftsmith.runtime.cli generate --target-placement tp --tp-size 4 \\
        --target meta-llama/Llama-3.3-70B-Instruct --draft eagle3:HEAD --prompt "..."
    result = run_split(Split("tp", tp_size=4), "generate", spec, "auto", "bfloat16", work)  # None off rank 0

`work(target)` runs on rank 0 only, inside `driving(target)` (runtime/core/placement.py): each target
forward, new cache and cache change it makes goes first to the other ranks, which replay it (`follow`), so
every layer's all-reduce has all its ranks and every rank's KV cache (its heads' share) holds the same
slots. Everything else `work` does (drafting at TP = 1, sampling, acceptance, output) happens on rank 0
alone: the drafter's candidates reach the group inside the verify forward's message, one broadcast a
cycle. The target's embedding, final norm and LM head are whole on every rank, so the hidden states a
feature head reads (EAGLE-3's aux layers, MTP's last state) and the logits are whole on rank 0 after the
row-parallel all-reduces that end each layer: no gather.

Plans are checked before anything loads (exit 2): a placement without a launcher (the torchrun line is in
the message), a launch the group cannot form (one group of WORLD ranks: generate and bench run one
engine), a size the heads or experts do not divide, a family without a split plan. A follower that dies
ends rank 0's next wait with an error naming the rank, within `--process-group-timeout-s`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from draftsmith.runtime.core import launch as ranks  # torchrun's word on this process, its group, waits
from draftsmith.runtime.core.placement import Layout, check_placement, driving, follow
from draftsmith.runtime.errors import BadInputError, renamed_fields

T = TypeVar("T")
FLAGS = {"target_placement": "--target-placement", "tp_size": "--tp-size", "ep_size": "--ep-size"}


@dataclass(frozen=True)
class Split:
    """What the flags ask: `replicate` (the whole target in this process), `tp` or `ep` over a group."""

    placement: str = "replicate"
    tp_size: int | None = None
    ep_size: int | None = None
    timeout_s: int = ranks.DEFAULT_TIMEOUT_S

    @property
    def size(self) -> int | None:
        return self.ep_size if self.placement == "ep" else self.tp_size

    @property
    def split(self) -> bool:
        return self.placement in ("tp", "ep")


def launch_line(verb: str, split: Split) -> str:
    n = split.size or "N"
    return (
        f"torchrun --nproc-per-node {n} -m draftsmith.runtime.cli {verb} "
        f"--target-placement {split.placement} --{split.placement}-size {n} ..."
    )


def plan_split(split: Split, verb: str, target_spec: str, launch: ranks.Launch) -> Layout | None:
    """This rank's layout (None: the whole target here), or a BadInputError naming the flag, before the
    target loads."""
    ranks.check_timeout(split.timeout_s)
    if not split.split:
        if launch.world > 1:
            raise BadInputError(
                "--target-placement",
                f"{split.placement} under a launcher of {launch.world} processes",
                "tp or ep (one group of every process)",
                f"{verb} runs one engine: one process, or `{launch_line(verb, Split('tp', launch.world))}`",
            )
        return None
    if launch.world == 1:
        if split.size in (None, 1):
            return None  # a group of one: the whole target
        raise BadInputError(
            "--target-placement",
            f"{split.placement} in one process (no process group: WORLD_SIZE unset)",
            f"a launch of --{split.placement}-size processes",
            f"run it as `{launch_line(verb, split)}`",
        )
    from transformers import AutoConfig

    from draftsmith.runtime.core.targets import resolve_target

    config = AutoConfig.from_pretrained(resolve_target(target_spec).path)
    with renamed_fields(FLAGS):
        layout = check_placement(
            config,
            split.placement,
            split.tp_size,
            launch.world,
            launch.rank,
            launch.local_world,
            split.ep_size,
        )
    if layout.dp != 1:
        raise BadInputError(
            f"--{split.placement}-size",
            split.size,
            f"the number of processes ({launch.world}): {verb} runs one group",
            f"or launch {split.size} processes",
        )
    return layout


def run_split(
    split: Split, verb: str, target_spec: str, device: str, dtype: str, work: Callable[..., T]
) -> T | None:
    """`work(target)` on the whole target (no split), or on rank 0 of the group driving the others;
    returns its result there and None on the followers."""
    from draftsmith.runtime.core.target import Target

    launch = ranks.Launch.from_env()
    layout = plan_split(split, verb, target_spec, launch)
    if layout is None:
        return work(Target.load(target_spec, device=device, dtype=dtype))
    device = ranks.rank_device(device, launch)
    with ranks.process_group(device, split.timeout_s):
        target = Target.load(target_spec, device=device, dtype=dtype, layout=layout)
        if layout.tp_rank != 0:
            with ranks.waiting(launch.rank, split.timeout_s, "the next call of its group's rank 0"):
                follow(target)
            return None
        with ranks.waiting(launch.rank, split.timeout_s, "the group's other ranks"), driving(target):
            return work(target)
