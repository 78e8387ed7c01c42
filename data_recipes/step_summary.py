"""The one line every `draftsmith data` step ends with: what it wrote, rows kept and dropped, tokens, bytes
and time, from the step's finished record (the same record a later step reads).

    timer = StepTimer()                  # when the command starts
    record = capture(...)
    log.info(timer.line(record, out))    # = summary_line(record, out, seconds since)
    # capture done: wrote data/sg-hidden (3 shards); rows read 14, kept 13, dropped 1 (no supervised
    # tokens: 1); 170 tokens; 98.4 KB on disk; 2.1 s
"""

from __future__ import annotations

import time
from pathlib import Path

from draftsmith.data_recipes.capture_storage import human_bytes
from draftsmith.data_recipes.parts import part_name


def folder_bytes(folder: str | Path) -> int:
    """Bytes of the regular files under `folder` (what the step left on disk)."""
    folder = Path(folder)
    if folder.is_file():
        return folder.stat().st_size
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _written(record: dict) -> str:
    o, step = record.get("outputs") or {}, record["step"]
    if step == "capture":
        return f"{len(o.get('shards', []))} shards"
    if step == "vocab":
        return f"{o.get('file')}: {o.get('draft_vocab_size')} of {o.get('vocab_size')} ids"
    splits = ", ".join(f"{name} {n}" for name, n in (o.get("splits") or {}).items())
    return f"rows {splits}" if splits else "rows"


def _tokens(record: dict) -> str:
    o = record.get("outputs") or {}
    if record["step"] == "capture":
        return f"{o.get('tokens', 0)} tokens"
    if record["step"] == "vocab":
        return f"{o.get('supervised_tokens', 0)} supervised tokens"
    return f"{o.get('tokens', 0)} tokens ({o.get('supervised_tokens', 0)} supervised)"


def summary_line(record: dict, out: str | Path, wall_s: float) -> str:
    """`STEP done: wrote OUT (WHAT); rows read R, kept K, dropped D (REASON: N, ...); TOKENS; BYTES; TIME`.

    A part of a sharded run names its part folder and counts that folder's bytes."""
    s = record.get("summary") or {}
    dropped = s.get("dropped") or {}
    reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(dropped.items()))
    rows = f"rows read {s.get('read', 0)}, kept {s.get('kept', 0)}, dropped {sum(dropped.values())}"
    where = Path(out)
    shard = (record.get("inputs") or {}).get("shard")
    if shard:
        where = where / part_name(shard["index"], shard["count"])
    return (
        f"{record['step']} done: wrote {where} ({_written(record)}); {rows}"
        + (f" ({reasons})" if reasons else "")
        + f"; {_tokens(record)}; {human_bytes(folder_bytes(where))} on disk; {wall_s:.1f} s"
    )


class StepTimer:
    """Started with the step's command; `line(record, out)` is its summary line with the time since."""

    def __init__(self):
        self.started = time.perf_counter()

    def line(self, record: dict, out: str | Path) -> str:
        return summary_line(record, out, time.perf_counter() - self.started)
