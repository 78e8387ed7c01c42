"""Counting the collectives this process issues (all-reduces, broadcasts, gathers) and their bytes, by phase.

    counter = CollectiveCounter()
    with counter:                                   # counts every c10d collective issued inside
        with counter.phase("verify"):
            target.forward(ids, cache)              # a tensor-parallel target: 2 all-reduces a layer
    counter.report()  # {"verify": {"entries": 1, "all_reduce": {"count": 6, "bytes": 1536}, ...}, ...}
    per_cycle(counter.report())  # {"cycles": 1, "per_cycle": {"verify": {"all_reduce": {...}, ...}}}

A split target issues its collectives from several places: transformers' row-parallel layers call
`torch.distributed.all_reduce`, its expert-parallel layers `all_gather_into_tensor` or functional
collectives, and the leader's calls to its followers (runtime/core/placement.py `Channel`) go through
`broadcast_object_list` (two broadcasts: the pickled message's size, then its bytes). All of them reach
the dispatcher as c10d ops (`c10d::allreduce_`, `_c10d_functional::all_gather_into_tensor`, ...), so one
TorchDispatchMode sees every one, whatever imported it how. The price is a Python call per aten op while
counting (about 10 us each): counted runs are for counts, the bench times runs that do not count
(runtime/bench/run.py counts its warm-up pass).

Bytes are what this rank contributes: the tensor(s) of an all-reduce or broadcast, the input of a gather.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# c10d op name fragments -> the collective's kind (checked in order: "reduce_scatter" before "reduce")
KINDS = (
    ("reduce_scatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
)
GATHER_INPUT_SECOND = ("c10d::allgather", "c10d::_allgather_base")  # (outputs, inputs, ...) argument order
OTHER = "other"  # what runs outside any named phase (the prefill, a cache made)


def collective_kind(op_name: str) -> str | None:
    """`c10d::allreduce_` -> "all_reduce"; None for what is not a collective (wait_tensor, aten ops)."""
    if "c10d" not in op_name:
        return None
    return next((kind for fragment, kind in KINDS if fragment in op_name), None)


def tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


class CollectiveCounter(TorchDispatchMode):
    """Per phase: how many times it was entered, and per kind of collective its count and bytes."""

    def __init__(self):
        super().__init__()
        self.current = OTHER
        self.entries: dict[str, int] = defaultdict(int)
        self.tally: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.name())
        kind = collective_kind(name)
        if kind is not None and args:
            payload = args[1] if name.startswith(GATHER_INPUT_SECOND) and len(args) > 1 else args[0]
            cell = self.tally[self.current][kind]
            cell[0], cell[1] = cell[0] + 1, cell[1] + tensor_bytes(payload)
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def phase(self, name: str):
        """Collectives issued inside count for `name` (phases nest: the innermost counts)."""
        outer, self.current = self.current, name
        self.entries[name] += 1
        try:
            yield
        finally:
            self.current = outer

    def report(self) -> dict[str, dict]:
        """{phase: {"entries": times entered, kind: {"count", "bytes"}}}, phases in first-seen order."""
        phases = list(dict.fromkeys([*self.entries, *self.tally]))
        return {
            p: {
                "entries": self.entries.get(p, 0),
                **{k: {"count": c, "bytes": b} for k, (c, b) in sorted(self.tally.get(p, {}).items())},
            }
            for p in phases
        }


def per_cycle(report: dict[str, dict]) -> dict:
    """A decode's collectives per cycle: {"cycles", "per_cycle": {phase: {kind: {"count", "bytes"}}}}. A
    cycle is an entry of "verify" (speculative decoding: its "draft" phase includes the drafter's rollback)
    or of "step" (plain decoding); "other" (prefill, caches made) is left out."""
    cycles = max((report.get(p, {}).get("entries", 0) for p in ("verify", "step")), default=0)
    n = max(cycles, 1)
    phases = {
        phase: {
            k: {"count": v["count"] / n, "bytes": round(v["bytes"] / n, 1)}
            for k, v in found.items()
            if k != "entries"
        }
        for phase, found in report.items()
        if phase != OTHER
    }
    return {"cycles": cycles, "per_cycle": phases}


def maybe_phase(counter: CollectiveCounter | None, name: str):
    """counter.phase(name), or nothing to count into."""
    return counter.phase(name) if counter is not None else contextlib.nullcontext()
