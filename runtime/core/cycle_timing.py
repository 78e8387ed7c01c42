"""Per-cycle phase timing of the speculative loop: how long each cycle drafted and how long it verified.

    clock = PhaseClock(target.device, sync=False, collectives=None)
    with clock.phase("draft"):
        drafts = drafter.propose(contexts)
    clock.lap()                                     # {"draft": seconds of this cycle's phase, ...}

runtime/core/speculative.py times every cycle with one clock: draft = the drafter's `propose` plus its
`commit`/`skip` (its rollback to the accepted path), verify = `verify()` (the target's tree forward, the
acceptance rule, the cache compaction). Both land per cycle in GenerationResult.cycle_draft_s /
cycle_verify_s; `draftsmith bench` pools them into its rows (runtime/bench/cycle_fields.py).

Cost: two `time.perf_counter()` calls per phase (well under a microsecond), no device work, no change to
any token. On a CPU that is exact: every op has finished when its Python call returns. With a
`collectives` counter (runtime/core/collectives.py: a split target's all-reduces and broadcasts), each phase
also counts the collectives issued inside it under its `tally` name.

On CUDA, kernels are asynchronous, so a host clock measures launches plus whatever waits for the device
inside the phase. Both phases end in a host read (draft tokens become Python lists, verdicts too), which
drains the stream, so each phase's work is mostly inside its own interval; what is not is the tail of
asynchronous work queued after the last read (the cache compaction at the end of `verify`, the drafter's
cache crop in `commit`), which then shows up in the next phase that waits. `sync=True`
(`draftsmith bench --sync-timing`) calls torch.cuda.synchronize at each phase boundary so every kernel is
charged to the phase that launched it; it costs a stall per phase (the overlap of host bookkeeping with
device work is lost), so it is off by default and leaves CPU runs untouched.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch

from draftsmith.runtime.core.collectives import maybe_phase


class PhaseClock:
    def __init__(self, device: torch.device, sync: bool = False, collectives=None):
        self.device = torch.device(device)
        self.sync = bool(sync) and self.device.type == "cuda"  # nothing to drain elsewhere
        self.collectives = collectives  # a CollectiveCounter, or None: nothing counted
        self.spent: dict[str, float] = defaultdict(float)

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str, tally: str | None = None):
        """Time the body as `name` (added up until the next lap); its collectives count as `tally`."""
        start = self.now()
        with maybe_phase(self.collectives, tally or name):
            yield
        self.spent[name] += self.now() - start

    def lap(self) -> dict[str, float]:
        """Seconds per phase since the last lap (one cycle), then start again."""
        spent, self.spent = dict(self.spent), defaultdict(float)
        return spent
