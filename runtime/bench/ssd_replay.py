"""Replay simulator for SSD: recorded cycles + a hardware pair's costs -> tokens/s of the synchronous loop
and of SSD (drafter on its own device, pre-drafting the next cycle while the target verifies).

    python -m draftsmith.runtime.bench.ssd_replay TRACE.jsonl --fanout 4 8 16 [--draft-s 0.01 ...]

TRACE.jsonl is `draftsmith generate --ssd --ssd-trace TRACE.jsonl` output: one object per cycle with
`accepted` (a), `depth` (K), `rank` (the candidate rank of the token the target added after the accepted
prefix, -1 if not ranked), and measured `draft_s` (a normal draft; null on hits), `verify_s` and
`spec_s` (the pre-speculation of that cycle) with `spec_branches` (how many branches it drafted).

The timeline (all times per cycle, from one draft's delivery to the next; `latency_s` one way):
    synchronous   draft_s + verify_s
    SSD           max(verify_s + 2 * latency_s, speculate_s(n)) + (miss ? draft_s : 0)
where the target receives draft i after one latency, verifies it, sends the outcome back (one latency),
while the drafter pre-drafts B branches (speculate_s(B) = spec_base_s + B * spec_branch_s; a GPU drafter
batching its branches has spec_branch_s near 0, this CPU drafts them one after another; n = B, or with
`interrupt` the branches that fit before the verdict arrives, the one in progress finished). On a hit the
cached draft leaves at once; on a miss the drafter drafts it then. The first draft is never cached, and the
last cycle needs no next draft. Whether cycle i's outcome hits is replayed with the runtime's own planner
(runtime/verify/ssd_fanout.py): hit iff (a, rank) is among the first n branches of the plan's order, the
running acceptance estimate updated exactly as the run updated it. Prefill is left out of both.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.runtime.verify.ssd_fanout import (
    DEFAULT_EXPONENT,
    AcceptanceEstimate,
    branch_order,
    geometric_fanout,
)


@dataclass(frozen=True)
class Cycle:
    accepted: int
    depth: int
    rank: int  # -1: the outcome's token was not among the ranked candidates
    draft_s: float | None = None
    verify_s: float | None = None
    spec_s: float | None = None
    spec_branches: int | None = None
    window_s: float | None = (
        None  # a drafter process's view: draft sent -> verdict back (verify + 2 latencies)
    )


@dataclass(frozen=True)
class CostModel:
    draft_s: float  # one normal draft of a chain (all K levels)
    verify_s: float  # one verification forward of the chain
    spec_branch_s: float  # each pre-drafted branch
    spec_base_s: float = 0.0  # a speculation's fixed part (a batched GPU drafter: most of it)
    latency_s: float = 0.0  # one message, one way

    def speculate_s(self, branches: int) -> float:
        return self.spec_base_s + branches * self.spec_branch_s


@dataclass(frozen=True)
class Prediction:
    budget: int
    tokens: int
    sync_s: float
    ssd_s: float
    hit_rate: float
    hit_rate_per_position: list[float | None]
    target_idle_s: float  # SSD: time the target waits for drafts
    draft_hidden_s: float  # SSD: normal-draft time the hits saved

    @property
    def sync_tokens_per_s(self) -> float:
        return self.tokens / self.sync_s

    @property
    def ssd_tokens_per_s(self) -> float:
        return self.tokens / self.ssd_s

    @property
    def speedup(self) -> float:
        return self.sync_s / self.ssd_s


def replay_hits(
    cycles: list[Cycle], budget: int, exponent: float = DEFAULT_EXPONENT, drafted: int | None = None
) -> list[bool]:
    """hit[i]: was the draft after cycle i cached? (the runtime's planner, its estimate updated after each
    cycle, exactly as in runtime/drafters/ssd.py: the plan for cycle i is made before its verification).
    `drafted`: only the first `drafted` branches of the plan's order were drafted (the verdict stopped
    the drafter); None = all."""
    estimate, hits = AcceptanceEstimate(), []
    for c in cycles:
        fan = geometric_fanout(budget, c.depth, estimate.alpha, exponent)
        order = branch_order(fan, estimate.alpha)[:drafted]
        hits.append(c.rank >= 0 and (c.accepted, c.rank) in order)
        estimate.observe(c.accepted, c.depth)
    return hits


def simulate(
    cycles: list[Cycle],
    budget: int,
    cost: CostModel,
    exponent: float = DEFAULT_EXPONENT,
    interrupt: bool = False,
) -> Prediction:
    """`interrupt`: the drafter stops pre-drafting when the verdict arrives (the drafter process does,
    between branches): it drafts the branches that fit the window, the one in progress finishes."""
    if not cycles:
        raise ValueError("no cycles to replay")
    window = cost.verify_s + 2 * cost.latency_s  # from a draft's send to its verdict at the drafter
    drafted = budget
    if interrupt and cost.speculate_s(budget) > window:
        drafted = min(budget, max(0, math.ceil((window - cost.spec_base_s) / cost.spec_branch_s)))
    hits = replay_hits(cycles, budget, exponent, drafted)
    tokens = sum(c.accepted + 1 for c in cycles)
    sync = len(cycles) * (cost.draft_s + cost.verify_s)
    spec = cost.speculate_s(drafted)
    ssd = cost.draft_s + cost.latency_s  # the first draft, and its trip to the target
    idle = cost.draft_s + cost.latency_s
    for i in range(len(cycles)):
        if i == len(cycles) - 1:  # the last verification: nothing to draft after it
            ssd += cost.verify_s
            break
        step = max(window, spec) + (0.0 if hits[i] else cost.draft_s)
        ssd += step
        idle += step - cost.verify_s
    depth = max(c.depth for c in cycles)
    per_pos: list[float | None] = []
    for a in range(depth + 1):
        at = [h for c, h in zip(cycles[:-1], hits[:-1], strict=True) if c.accepted == a]
        per_pos.append(sum(at) / len(at) if at else None)
    counted = hits[:-1] or hits
    return Prediction(
        budget,
        tokens,
        sync,
        ssd,
        sum(counted) / len(counted),
        per_pos,
        idle,
        sum(counted) * cost.draft_s,
    )


def fit_cost(cycles: list[Cycle], latency_s: float = 0.0) -> CostModel:
    """Means of the measured times: normal drafts, verifications, and speculation time per branch. A
    drafter process's trace has `window_s` (verification and the round trip together): it is taken as the
    verification with no latency."""
    drafts = [c.draft_s for c in cycles if c.draft_s is not None]
    windows = [c.window_s for c in cycles if c.window_s is not None]
    verifies = windows or [c.verify_s for c in cycles if c.verify_s is not None]
    latency_s = 0.0 if windows else latency_s
    per_branch = [c.spec_s / c.spec_branches for c in cycles if c.spec_s and c.spec_branches]
    if not drafts or not verifies:
        raise ValueError("the trace has no measured draft or verify times")
    branch = statistics.fmean(per_branch) if per_branch else 0.0
    return CostModel(statistics.fmean(drafts), statistics.fmean(verifies), branch, 0.0, latency_s)


def read_trace(path: str | Path) -> list[Cycle]:
    from draftsmith.runtime.errors import BadInputError

    cycles = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            cycles.append(Cycle(**{k: row.get(k) for k in Cycle.__dataclass_fields__}))
        except (json.JSONDecodeError, TypeError) as err:
            raise BadInputError("trace", f"{path}:{n}", "one JSON cycle object per line", str(err)) from err
    return cycles


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--fanout", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--draft-s", type=float, help="override: one normal draft")
    p.add_argument("--verify-s", type=float, help="override: one verification")
    p.add_argument("--spec-branch-s", type=float, help="override: one pre-drafted branch")
    p.add_argument("--spec-base-s", type=float, default=0.0)
    p.add_argument("--latency-s", type=float, default=0.0)
    p.add_argument("--interrupt", action="store_true", help="the drafter stops pre-drafting at the verdict")
    args = p.parse_args(argv)
    cycles = read_trace(args.trace)
    fit = fit_cost(cycles, args.latency_s)
    cost = CostModel(
        args.draft_s if args.draft_s is not None else fit.draft_s,
        args.verify_s if args.verify_s is not None else fit.verify_s,
        args.spec_branch_s if args.spec_branch_s is not None else fit.spec_branch_s,
        args.spec_base_s,
        args.latency_s,
    )
    print(json.dumps({"cost": asdict(cost)}))
    for budget in args.fanout:
        pred = simulate(cycles, budget, cost, interrupt=args.interrupt)
        row = asdict(pred) | {
            "sync_tokens_per_s": round(pred.sync_tokens_per_s, 3),
            "ssd_tokens_per_s": round(pred.ssd_tokens_per_s, 3),
            "speedup": round(pred.speedup, 4),
        }
        print(json.dumps(row))


if __name__ == "__main__":
    main()
