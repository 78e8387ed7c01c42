"""The process group's timeout, and the waits of a multi-process run around its data steps.

    handler = process_group_kwargs(cfg, backend="gloo")   # Accelerator(kwargs_handlers=[handler])
    with rank0_first(acc, cfg, "prepare and vocab", commands):
        prepare(...)                                       # rank 0 first; the others wait, then reuse it
    wait_for_ranks(acc, cfg, "every rank's part of the capture", commands)

`train.process_group_timeout_s` is the timeout of the process group, on GPU (NCCL) as on CPU (gloo), so
it bounds every collective, the barriers where ranks wait for the data steps included (NCCL's own default
is 10 minutes, which an offline capture outlasts). A wait that runs out ends the run with a
`BadInputError` naming the key and the `draftsmith data` commands that make the data beforehand (gloo
raises the timeout in the waiting rank; NCCL's watchdog may end the process first, with its own message).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from draftsmith.runtime.errors import BadInputError, DraftsmithError

TIMEOUT_KEY = "train.process_group_timeout_s"


def process_group_kwargs(cfg, backend: str | None = None):
    """Accelerate's InitProcessGroupKwargs with the configured timeout (and the backend, when forced)."""
    from accelerate.utils import InitProcessGroupKwargs

    timeout = timedelta(seconds=cfg.train.process_group_timeout_s)
    if backend is None:  # Accelerate picks it (NCCL on GPUs)
        return InitProcessGroupKwargs(timeout=timeout)
    return InitProcessGroupKwargs(backend=backend, timeout=timeout)


def wait_for_ranks(acc, cfg, waiting_for: str, commands: list[str]) -> None:
    """A barrier over every rank; one that times out is a refusal naming the timeout and the commands
    that make the data beforehand (a no-op with one process)."""
    if acc is None or acc.num_processes == 1:
        return
    try:
        acc.wait_for_everyone()
    except RuntimeError as err:  # gloo: "Timed out waiting 3000ms for recv operation to complete"
        raise wait_error(acc.process_index, cfg, waiting_for, commands, err) from err


@contextlib.contextmanager
def rank0_first(acc, cfg, what: str, commands: list[str]):
    """Rank 0 runs the body first while the others wait; then the others run it (a no-op once rank 0
    has written the data) and rank 0 waits for them (Accelerate's main_process_first, with our timeout)."""
    first = acc is None or acc.is_main_process
    if not first:
        wait_for_ranks(acc, cfg, f"{what} on rank 0", commands)
    yield
    if first:
        wait_for_ranks(acc, cfg, f"the other ranks to reuse {what}", commands)


def wait_error(rank: int, cfg, waiting_for: str, commands: list[str], err: Exception) -> DraftsmithError:
    reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    seconds = cfg.train.process_group_timeout_s
    if "timed out" not in str(err).lower() and "timeout" not in str(err).lower():
        return DraftsmithError(
            f"rank {rank}: waiting for {waiting_for} failed ({reason}); another rank probably failed first "
            "(its error is above)"
        )
    run_first = "; ".join(f"`{c}`" for c in commands)
    return BadInputError(
        TIMEOUT_KEY,
        seconds,
        f"more seconds than the wait for {waiting_for}",
        f"rank {rank} waited {seconds} s: {reason}; raise {TIMEOUT_KEY}, or make the data first, "
        f"once, and start the run again: {run_first}",
    )
