"""The calibration of a draft's survival estimates (a DSpark confidence head's) in `draftsmith bench`: the
row fields and report.md's table; the reliability plot is training's (train/loop/metrics.py
`reliability_plot`, which the trainer draws for a confidence head too), drawn by runtime/bench/report.py.

    row.update(calibration_fields(outputs))          # every batch (and turn) of a row
    calibration_table(rows)                          # report.md's section (None when no row has one)

Row fields (runtime/verify/calibration.py defines the event: node n counts when its parent was accepted,
its outcome is whether it was accepted): `calibration_error` (ECE over 10 equal-width bins),
`calibration_slots` (nodes counted), `reliability` (per bin: range, count, mean prediction, observed
frequency), `predicted_accept_per_position` / `observed_accept_per_position` (the mean survival and the
accepted share at draft position k among the nodes that reached it: conditional, unlike
`accept_rate_per_position`, which divides by every cycle that drafted position k),
`calibration_slots_per_position`, and `predicted_mean_accepted_length` / `observed_mean_accepted_length`
(drafted tokens per verified draft, as the survivals predict and as verification accepted).
Tests: tests/runtime/test_calibration.py.
"""

from __future__ import annotations

from draftsmith.runtime.bench.types import BatchOutput


def calibration_fields(outs: list[BatchOutput]) -> dict:
    """The pooled calibration of a row's batches ({} when its drafts carry no survival)."""
    sums = [o.calibration for o in outs if o.calibration is not None]
    if not sums:
        return {}
    pooled = sums[0]
    for s in sums[1:]:
        pooled = pooled + s
    return pooled.summary()


def calibration_table(rows: list[dict]) -> str | None:
    """report.md's section: one line per row with survival estimates."""
    mine = [r for r in rows if r.get("calibration_slots")]
    if not mine:
        return None
    lines = [
        "| method | T | batch | ECE | nodes | predicted / observed length | predicted per position "
        "| observed per position |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in mine:
        pred, seen = r.get("predicted_mean_accepted_length"), r.get("observed_mean_accepted_length")
        lines.append(
            f"| {r['method']} | {r['temperature']:g} | {r['batch_size']} | {r['calibration_error']:.3f} "
            f"| {r['calibration_slots']} | {_num(pred)} / {_num(seen)} "
            f"| {_list(r['predicted_accept_per_position'])} | {_list(r['observed_accept_per_position'])} |"
        )
    return "\n".join(lines)


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _list(xs) -> str:
    return "[" + ", ".join("-" if x is None else f"{x:.2f}" for x in xs) + "]"
