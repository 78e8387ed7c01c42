"""SSD's fan-out planner and the replay simulator on synthetic traces with closed-form answers.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/runtime/test_ssd_replay.py -q
"""

import json
import math

import pytest

from draftsmith.runtime.bench.ssd_replay import CostModel, Cycle, fit_cost, read_trace, replay_hits, simulate
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.ssd_fanout import (
    AcceptanceEstimate,
    HitStats,
    branch_order,
    check_budget,
    geometric_fanout,
    length_law,
)

COST = CostModel(draft_s=0.5, verify_s=1.0, spec_branch_s=0.1, latency_s=0.1)


def full_accepts(n, rank, depth=2):
    return [Cycle(depth, depth, rank) for _ in range(n)]


def test_all_hits_closed_form():
    pred = simulate(full_accepts(10, 0), 4, COST)
    assert pred.tokens == 30
    assert pred.sync_s == pytest.approx(10 * 1.5)
    # first draft + its trip, 9 overlapped cycles of max(verify + 2 latency, 4 branches), last verify
    assert pred.ssd_s == pytest.approx(0.6 + 9 * max(1.2, 0.4) + 1.0)
    assert pred.hit_rate == 1.0
    assert pred.hit_rate_per_position == [None, None, 1.0]
    assert pred.draft_hidden_s == pytest.approx(9 * 0.5)
    assert pred.target_idle_s == pytest.approx(0.6 + 9 * 0.2)
    assert pred.speedup == pytest.approx(15 / 12.4)


def test_all_misses_closed_form():
    pred = simulate(full_accepts(10, -1), 4, COST)
    assert pred.ssd_s == pytest.approx(0.6 + 9 * (1.2 + 0.5) + 1.0)
    assert pred.hit_rate == 0.0
    assert pred.speedup < 1  # misses pay the round trip on top of the draft


def test_speculation_longer_than_verification_bounds_the_cycle():
    slow = CostModel(draft_s=0.5, verify_s=1.0, spec_branch_s=1.0, latency_s=0.0)
    pred = simulate(full_accepts(5, 0), 4, slow)
    assert pred.ssd_s == pytest.approx(0.5 + 4 * 4.0 + 1.0)


def test_rank_hits_only_within_the_fanout():
    # depth 2, budget 3: one candidate per length, so rank 1 always misses; a large budget catches it
    cycles = full_accepts(20, 1)
    assert not any(replay_hits(cycles, 3))
    assert all(replay_hits(cycles, 16))


def test_geometric_fanout_closed_form():
    # P = [0.4, 0.24, 0.144, 0.216]; sqrt weights share a spare of 4 as [1.29, 1.00, 0.77, 0.95]
    assert geometric_fanout(8, 3, 0.6) == [2, 2, 2, 2]
    assert geometric_fanout(4, 3, 0.6) == [1, 1, 1, 1]
    fan = geometric_fanout(16, 3, 0.9)  # most mass at full acceptance
    assert sum(fan) == 16 and fan[3] == max(fan) and min(fan) >= 1
    low = geometric_fanout(16, 3, 0.1)  # most mass at a = 0, then geometric decay
    assert low[0] == max(low) and low[1] >= low[2]
    assert math.isclose(sum(length_law(0.7, 4)), 1.0)


def test_acceptance_estimate_and_hit_stats():
    est = AcceptanceEstimate()
    assert est.alpha == 0.5
    est.observe(3, 3)  # full accept: 3 of 3
    est.observe(0, 3)  # 0 of 1
    assert est.alpha == pytest.approx((3 + 1) / (4 + 2))
    stats = HitStats(2)
    for a, rank, hit in [(0, 0, True), (0, 3, False), (2, 0, True), (2, -1, False), (2, 1, True)]:
        stats.record(a, rank, hit)
    assert stats.hit_rate_per_position == [0.5, None, pytest.approx(2 / 3)]
    assert stats.hit_rate == pytest.approx(3 / 5)


def test_budget_below_chain_is_bad_input():
    with pytest.raises(BadInputError, match="--ssd-fanout"):
        check_budget(3, 3)
    with pytest.raises(BadInputError):
        geometric_fanout(2, 2, 0.5)


def test_trace_round_trip_and_fit(tmp_path):
    rows = [
        {
            "accepted": 1,
            "depth": 2,
            "rank": 0,
            "draft_s": 0.2,
            "verify_s": 0.4,
            "spec_s": 0.3,
            "spec_branches": 3,
        },
        {
            "accepted": 2,
            "depth": 2,
            "rank": 5,
            "draft_s": None,
            "verify_s": 0.6,
            "spec_s": 0.9,
            "spec_branches": 3,
        },
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cycles = read_trace(path)
    cost = fit_cost(cycles, latency_s=0.01)
    assert cost.draft_s == pytest.approx(0.2) and cost.verify_s == pytest.approx(0.5)
    assert cost.spec_branch_s == pytest.approx(0.2)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(BadInputError, match="trace"):
        read_trace(tmp_path / "bad.jsonl")


def test_interrupted_speculation_closed_form():
    # verify 1.0 + 2 x 0.1 latency = a 1.2 s window; 0.5 s branches: 3 fit (the third finishes at 1.5 s)
    slow = CostModel(draft_s=0.5, verify_s=1.0, spec_branch_s=0.5, latency_s=0.1)
    cycles = full_accepts(5, 0)
    pred = simulate(cycles, 8, slow, interrupt=True)
    # at the prior alpha 0.5 the first 3 branches are (0,0), (0,1), (1,0): the full accept misses once;
    # from alpha 0.75 on, (2, 0) comes first
    assert replay_hits(cycles, 8, drafted=3) == [False, True, True, True, True]
    assert pred.ssd_s == pytest.approx(0.6 + (1.5 + 0.5) + 3 * 1.5 + 1.0)
    assert pred.hit_rate == 0.75
    full = simulate(cycles, 8, slow)
    assert full.ssd_s == pytest.approx(0.6 + 4 * 4.0 + 1.0)
    # only the first 3 branches of the order exist: a rank the plan puts later misses
    order = branch_order(geometric_fanout(8, 2, 0.5), 0.5)
    late = order[5]
    assert not replay_hits([Cycle(late[0], 2, late[1])], 8, drafted=3)[0]
    assert replay_hits([Cycle(late[0], 2, late[1])], 8)[0]


def test_branch_order_is_likeliest_first():
    order = branch_order([3, 2, 3], 0.8)  # P = [0.2, 0.16, 0.64]
    assert order[:4] == [(2, 0), (2, 1), (2, 2), (0, 0)]  # 0.64, 0.32, 0.21, 0.2
    assert sorted(order) == [(a, r) for a, n in enumerate([3, 2, 3]) for r in range(n)]


def test_saguaro_law_closed_form():
    import torch

    from draftsmith.runtime.verify.ssd_fanout import saguaro_law

    q = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    got = saguaro_law(q, 2, 0.5)  # top-2 scaled: [0.25, 0.15, 0.15, 0.05] / 0.6
    want = torch.tensor([0.25, 0.15, 0.15, 0.05], dtype=torch.float64) / 0.6
    assert torch.allclose(got, want, rtol=0, atol=1e-15)
    assert saguaro_law(q, 2, 1.0) is q
