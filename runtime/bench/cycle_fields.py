"""Where a speculative bench row's time goes: draft and verify time per cycle, the share of wall time spent
drafting, and for `+ssd` methods the speculation cache's hit rates, the draft latency it hid and the time
the target sat idle.

    out = BatchOutput(..., **batch_timing(results))     # one batch of draftsmith's engine
    row.update(cycle_fields(outputs))                   # every batch (and turn) of a row

Definitions (runtime/core/cycle_timing.py measures the phases):
  - a cycle here is one verify forward of the whole batch (at batch 1 the row's `cycles`; at batch b up to
    b requests share it, so `timed_cycles` <= `cycles`, which counts per request);
  - draft_ms_per_cycle / verify_ms_per_cycle: the MEAN over the row's batch cycles (total / timed_cycles,
    so mean x cycles is the time spent, which a median would not give); depth-0 cycles of `auto:K` count,
    with their near-zero draft time;
  - draft_share_of_wall: summed draft time / summed wall time of the same runs (prefill included).
    With --repeats the phases and this share come from the first repeat, whose outputs the row keeps,
    while the row's wall_s is the median over repeats.
SSD fields (runtime/drafters/ssd.py, in process): hits and lookups are summed over batches, so
`hit_rate_per_position[a]` = hits / outcomes over every cycle that accepted a drafted tokens; in process
nothing overlaps, so `target_idle_s` is the drafting plus the speculation the target waited for, and
`draft_latency_hidden_s` is the ordinary drafts the cache hits saved (hits x the mean miss-draft time).

Tests: tests/runtime/test_bench_cycle_times.py
(nice -n 19 env OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q tests/runtime/test_bench_cycle_times.py).
"""

from __future__ import annotations

from draftsmith.runtime.bench.types import BatchOutput

SSD_SUMS = ("hits", "lookups", "branches", "speculation_s", "draft_latency_hidden_s", "target_idle_s")


def batch_timing(results) -> dict:
    """One batch's GenerationResults -> BatchOutput's timing fields. Every row took part in cycles 1..c
    of its batch (rows only leave), so the row with the most cycles holds every cycle's times."""
    longest = max(results, key=lambda r: len(r.cycle_draft_s))
    return {
        "timed_cycles": len(longest.cycle_draft_s),
        "draft_s": sum(longest.cycle_draft_s),
        "verify_s": sum(longest.cycle_verify_s),
    }


def cycle_fields(outs: list[BatchOutput]) -> dict:
    """Row fields of the outputs that were timed ({} for methods that are not draftsmith's speculation)."""
    timed = [o for o in outs if o.timed_cycles is not None]
    if not timed:
        return {}
    cycles = sum(o.timed_cycles for o in timed)
    draft, verify = sum(o.draft_s for o in timed), sum(o.verify_s for o in timed)
    fields = {
        "timed_cycles": cycles,
        "draft_ms_per_cycle": None if not cycles else round(1000 * draft / cycles, 4),
        "verify_ms_per_cycle": None if not cycles else round(1000 * verify / cycles, 4),
        "draft_share_of_wall": round(draft / sum(o.wall_s for o in timed), 4),
    }
    ssd = [o.ssd for o in outs if o.ssd is not None]
    if ssd:
        fields["ssd"] = pool_ssd(ssd)
    return fields


def pool_ssd(batches: list[dict]) -> dict:
    """SsdDrafter.batch_metrics() entries -> one row's SSD metrics."""
    width = max(len(b["outcomes_per_position"]) for b in batches)
    hits, outcomes = [0] * width, [0] * width
    for b in batches:
        for a, (h, n) in enumerate(zip(b["hits_per_position"], b["outcomes_per_position"], strict=True)):
            hits[a] += h
            outcomes[a] += n
    pooled = {key: round(sum(b[key] for b in batches), 4) for key in SSD_SUMS}
    pooled.update(
        fanout_budget=batches[0]["fanout_budget"],
        hit_rate=round(pooled["hits"] / max(pooled["lookups"], 1), 4),
        hit_rate_per_position=[None if not n else round(h / n, 4) for h, n in zip(hits, outcomes)],
        hits_per_position=hits,
        outcomes_per_position=outcomes,
    )
    return pooled


def ssd_table(rows: list[dict]) -> str | None:
    """report.md's SSD section: one line per `+ssd` row (None when there is none)."""
    ssd = [r for r in rows if r.get("ssd")]
    if not ssd:
        return None
    lines = [
        "| method | T | batch | fan-out | hit rate | hit rate per accepted length | draft latency hidden s "
        "| target idle s |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in ssd:
        s = r["ssd"]
        lines.append(
            f"| {r['method']} | {r['temperature']:g} | {r['batch_size']} | {s['fanout_budget']} "
            f"| {s['hit_rate']:.2f} | {s['hit_rate_per_position']} | {s['draft_latency_hidden_s']:.3f} "
            f"| {s['target_idle_s']:.3f} |"
        )
    return "\n".join(lines)
