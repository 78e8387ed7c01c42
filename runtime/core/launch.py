"""What a launcher (torchrun) says about this process, its process group, and waits on other ranks.

    launch = Launch.from_env()                      # world 1 without a launcher
    with process_group(device, timeout_s=1800):     # NCCL on GPUs, gloo on CPUs; destroyed on the way out
        with waiting(rank, "--process-group-timeout-s", 1800, "the next call of its group's rank 0"):
            follow(target)                          # a wait that runs out names the flag (exit 2)

Shared by every verb that splits a target over processes: `data capture|regenerate` (data_recipes/
tp_steps.py) and `generate`/`bench` (runtime/split_run.py). The timeout bounds how long a follower waits
for its leader's next call: a rank that dies ends the others' waits with an error instead of a hang (gloo
raises in the waiting rank; NCCL's watchdog may end the process first).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed

from draftsmith.runtime.errors import BadInputError, DraftsmithError

TIMEOUT_FLAG = "--process-group-timeout-s"
DEFAULT_TIMEOUT_S = 1800  # train.process_group_timeout_s's default (NCCL's own is 600 s)


@dataclass(frozen=True)
class Launch:
    """What the launcher (torchrun, accelerate launch) says about this process; world 1 without one."""

    world: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world: int = 1

    @classmethod
    def from_env(cls) -> Launch:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        return cls(world, rank, local_rank, local_world)


def check_timeout(seconds) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise BadInputError(TIMEOUT_FLAG, seconds, "seconds >= 1")
    return seconds


def rank_device(device: str, launch: Launch) -> str:
    """The device of this rank: under a launcher, `auto` or `cuda` means the GPU of its local rank."""
    if launch.world > 1 and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{launch.local_rank}"
    return device


@contextlib.contextmanager
def process_group(device: str, timeout_s: int):
    """The default process group for the launch (NCCL on GPUs, gloo on CPUs) with the timeout; destroyed
    at the end, also on an error (gloo may hang at interpreter exit with a live group)."""
    dist = torch.distributed
    on_gpu = device.startswith("cuda")
    if on_gpu:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if on_gpu else "gloo", timeout=timedelta(seconds=timeout_s))
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def waiting(rank: int, timeout_s: int, what: str):
    """A wait on other ranks; one that times out is a BadInputError naming the timeout flag."""
    try:
        yield
    except RuntimeError as err:  # gloo: "Timed out waiting 3000ms for recv operation to complete"
        if not peer_failure(err):
            raise  # the work's own error, not a wait's
        raise wait_error(rank, timeout_s, what, err) from err


PEER_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout")  # what c10d's wait errors say


def peer_failure(err: Exception) -> bool:
    """A wait on another rank that failed (c10d raises plain RuntimeErrors; their text tells)."""
    return any(word in str(err).lower() for word in PEER_WORDS)


def wait_error(rank: int, timeout_s: int, what: str, err: Exception) -> DraftsmithError:
    text = str(err).strip()
    reason = text.splitlines()[-1] if text else type(err).__name__
    if "timed out" not in text.lower() and "timeout" not in text.lower():
        return DraftsmithError(
            f"rank {rank}: waiting for {what} failed ({reason}); another rank probably failed first "
            "(its error is above)"
        )
    return BadInputError(
        TIMEOUT_FLAG,
        timeout_s,
        f"more seconds than the wait for {what}",
        f"rank {rank} waited {timeout_s} s: {reason}; raise {TIMEOUT_FLAG}",
    )
