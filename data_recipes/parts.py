"""Sharded data steps: `--num-shards N --shard-index K` writes part K of N; the parts read as one folder.

    draftsmith data capture --data D --out OUT --num-shards 2 --shard-index 0     # on one machine
    draftsmith data capture --data D --out OUT --num-shards 2 --shard-index 1     # on another
    OUT/part-00000-of-00002/, OUT/part-00001-of-00002/    each a finished step folder with its record
    require_whole(OUT, ...), load_prepared(OUT), CaptureFolder(OUT)    the parts as one folder

Part K takes one contiguous range of the step's rows (in the order the step reads them: train, then
validation), so the parts concatenated in index order are the rows in their original order and no
reader needs an index. `shard_range` cuts equal row counts (regenerate: answer lengths are unknown);
`balanced_range` cuts about equal token counts (capture: forward time follows tokens, so the ranks of
one job reach the barrier after it together).

A part's record holds the inputs of the whole step plus `"shard": {"index", "count"}`; the merged
record drops it, so its inputs hash is the one an unsharded run with the same inputs records, and a step
downstream cannot tell the two apart. A folder's own record wins over its parts. A missing or
unfinished part, parts of several counts, or parts made with other inputs are a `BadInputError` naming
the part (and the command that makes it).
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

from draftsmith.data_recipes.common import RECORD_FILE, content_hash, read_record, require_record
from draftsmith.runtime.errors import BadInputError

PART_RE = re.compile(r"part-(\d{5})-of-(\d{5})")


def part_name(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}"


def check_shard_args(num_shards, shard_index) -> None:
    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not is_int(num_shards) or not 1 <= num_shards <= 99999:
        raise BadInputError("--num-shards", num_shards, "an integer in [1, 99999]")
    if not is_int(shard_index) or not 0 <= shard_index < num_shards:
        raise BadInputError(
            "--shard-index", shard_index, f"an integer in [0, {num_shards - 1}] (--num-shards)"
        )


def shard_range(num_rows: int, index: int, count: int) -> tuple[int, int]:
    """Rows [lo, hi) of part `index` of `count`: equal row counts (up to one)."""
    return index * num_rows // count, (index + 1) * num_rows // count


def balanced_range(lengths: list[int], index: int, count: int) -> tuple[int, int]:
    """Rows [lo, hi) of part `index` given each row's tokens: the cut before part k is the row boundary
    nearest to k/count of the tokens, so a part is off its share by at most half a row (rows stay whole)."""
    starts = [0]  # starts[r] = tokens before row r
    for n in lengths:
        starts.append(starts[-1] + n)
    total = starts[-1]

    def cut(k: int) -> int:
        if k <= 0 or k >= count:
            return 0 if k <= 0 else len(lengths)
        return min(range(len(starts)), key=lambda r: (abs(starts[r] * count - k * total), r))

    return cut(index), cut(index + 1)


def base_inputs(record: dict) -> dict:
    """A record's inputs without its part identity: what every part of one run shares."""
    return {k: v for k, v in record["inputs"].items() if k != "shard"}


def base_hash(record: dict) -> str:
    """The inputs hash the whole step (or an unsharded run) records (StepRecord.inputs_hash)."""
    return content_hash({"step": record["step"], "inputs": base_inputs(record)})


def find_parts(folder: Path) -> dict[int, dict[int, Path]]:
    """{count: {index: part folder}} of the part folders directly in `folder`."""
    parts: dict[int, dict[int, Path]] = {}
    if folder.is_dir():
        for path in folder.iterdir():
            match = PART_RE.fullmatch(path.name)
            if match and path.is_dir():
                parts.setdefault(int(match[2]), {})[int(match[1])] = path
    return parts


def require_whole(folder: str | Path, field_name: str, steps: tuple[str, ...]) -> dict:
    """`require_record` for a folder that may hold the parts of a sharded run instead of one record:
    the folder's own record, else its parts' merged record (or an error naming the missing part)."""
    folder = Path(folder)
    if (folder / RECORD_FILE).is_file() or not find_parts(folder):
        return require_record(folder, field_name, steps)
    return merged_record(folder, field_name, steps)


def merged_record(folder: Path, field_name: str, steps: tuple[str, ...]) -> dict:
    """The record of a complete set of parts, as one step's record (shards listed as part/shard)."""
    counts = find_parts(folder)
    if len(counts) > 1:
        raise BadInputError(
            field_name,
            f"{folder} with the parts of runs with {' and '.join(map(str, sorted(counts)))} shards",
            "the parts of one sharded run",
            "remove the part-* folders of the stale run",
        )
    [(count, paths)] = counts.items()
    records = {k: read_record(paths[k], field_name) for k in sorted(paths)}
    records = {k: r for k, r in records.items() if r is not None}
    missing = [k for k in range(count) if k not in records]
    if missing:
        names = ", ".join(part_name(k, count) for k in missing)
        raise BadInputError(
            field_name,
            f"{folder} without {names} (missing or unfinished)",
            f"all {count} parts of the sharded run",
            _command_hint(records, missing, count),
        )
    first = records[0]
    if first.get("step") not in steps:
        require_record(paths[0], field_name, steps)  # raises, naming the step it holds
    for k, record in records.items():
        shard = record["inputs"].get("shard") or {}
        same_part = shard == {"index": k, "count": count} and record.get("step") == first["step"]
        if not same_part or base_hash(record) != base_hash(first):
            raise BadInputError(
                field_name,
                f"{paths[k]} (made with other inputs than {part_name(0, count)}"
                f"{_differences(record, first)})",
                "parts of one run (same data, target and options)",
                f"make it again: {_command(record, k) or 'the same command with --shard-index ' + str(k)}",
            )
    ordered = [(part_name(k, count), records[k]) for k in range(count)]
    return {
        **{key: value for key, value in first.items() if key not in ("inputs", "outputs", "summary")},
        "inputs": base_inputs(first),
        "inputs_hash": base_hash(first),
        "outputs": MERGE[first["step"]](ordered),
        "summary": _merge_summaries([r.get("summary") for _, r in ordered]),
        "parts": [name for name, _ in ordered],
    }


def _differences(record: dict, first: dict) -> str:
    """': storage_dtype 'fp8' here, 'float32' there; ...' for the inputs two parts disagree on (a target's
    fingerprint by its keys: target, tokenizer_hash, ...), '' when only the part identity differs."""
    here, there = base_inputs(record), base_inputs(first)
    if isinstance(here.get("fingerprint"), dict) and isinstance(there.get("fingerprint"), dict):
        here = {**here, **{f"target {k}": v for k, v in here.pop("fingerprint").items()}}
        there = {**there, **{f"target {k}": v for k, v in there.pop("fingerprint").items()}}
    keys = [key for key in {**there, **here} if here.get(key) != there.get(key)]
    return "".join(
        f"{'; ' if i else ': '}{key} {here.get(key)!r} here, {there.get(key)!r} there"
        for i, key in enumerate(keys)
    )


def whole_done(folder: str | Path, inputs_hash: str, step: str) -> dict | None:
    """The finished whole (own record or complete parts) made with these inputs, else None."""
    folder = Path(folder)
    try:
        done = require_whole(folder, "--out", (step,))
    except BadInputError:  # no record, unfinished parts, or another step: not done
        return None
    return done if done.get("inputs_hash") == inputs_hash else None


def part_folder(folder: Path, record, num_shards: int, shard_index: int, step: str) -> Path:
    """Where this call writes: `folder` itself, or (several shards) its part K, whose record joins the
    part's identity to the whole step's inputs; stale parts of another count or inputs are cleared."""
    if num_shards <= 1:
        return folder
    whole_hash = record.inputs_hash  # before the part's identity joins the inputs
    record.inputs["shard"] = {"index": shard_index, "count": num_shards}
    clear_for_part(folder, num_shards, step, whole_hash)
    return folder / part_name(shard_index, num_shards)


def clear_for_part(folder: Path, count: int, step: str, whole_hash: str) -> None:
    """Before part of a `count`-way run starts in `folder`: a finished unsharded step there with other
    inputs than `whole_hash` (it would win over the parts) and the parts of runs with another count are
    removed (every rank of one job may do this at once: removing what is gone is not an error)."""
    try:
        done = read_record(folder, "--out")
    except FileNotFoundError:  # another rank removed it between the check and the read
        done = None
    if done is not None and done.get("step") == step and done.get("inputs_hash") != whole_hash:
        for name in done.get("outputs", {}).get("shards", []):
            (folder / name).unlink(missing_ok=True)
        (folder / RECORD_FILE).unlink(missing_ok=True)
    for other, paths in find_parts(folder).items():
        if other != count:
            for path in paths.values():
                shutil.rmtree(path, ignore_errors=True)


def load_prepared(folder: str | Path):
    """A prepared (or regenerated) folder as a DatasetDict; a folder of parts, each split concatenated in
    part order (the original row order). Call `require_whole` first: it checks that the parts are whole."""
    import datasets

    folder = Path(folder)
    parts = find_parts(folder)
    if (folder / RECORD_FILE).is_file() or not parts:
        return datasets.load_from_disk(str(folder))
    [(count, paths)] = parts.items()
    loaded = [datasets.load_from_disk(str(paths[k])) for k in range(count)]
    return datasets.DatasetDict(
        {split: datasets.concatenate_datasets([d[split] for d in loaded]) for split in loaded[0]}
    )


# ---- merging the parts' records -------------------------------------------------------------------------
def _merge_capture(parts: list[tuple[str, dict]]) -> dict:
    outs = [record["outputs"] for _, record in parts]
    merged = {k: v for k, v in outs[0].items() if k != "part"}
    merged["shards"] = [f"{name}/{shard}" for name, record in parts for shard in record["outputs"]["shards"]]
    for key in ("rows", "tokens", "bytes"):
        merged[key] = sum(o[key] for o in outs)
    merged["bytes_per_token"] = merged["bytes"] / max(1, merged["tokens"])
    runs = [o.get("last_run") or {"rows": 0, "wall_s": 0} for o in outs]
    merged["last_run"] = {"rows": sum(r["rows"] for r in runs), "wall_s": max(r["wall_s"] for r in runs)}
    return merged


def _merge_prepared(parts: list[tuple[str, dict]]) -> dict:
    outs = [record["outputs"] for _, record in parts]
    merged = {k: v for k, v in outs[0].items() if k != "part"}
    merged["splits"] = {name: sum(o["splits"].get(name, 0) for o in outs) for name in outs[0]["splits"]}
    for key in ("tokens", "supervised_tokens"):
        merged[key] = sum(o[key] for o in outs)
    return merged


MERGE = {"capture": _merge_capture, "regenerate": _merge_prepared}


def _merge_summaries(summaries: list[dict | None]) -> dict | None:
    if not any(summaries):
        return None
    merged = {"read": 0, "kept": 0, "dropped": Counter(), "notes": Counter()}
    for s in filter(None, summaries):
        merged["read"] += s["read"]
        merged["kept"] += s["kept"]
        merged["dropped"].update(s.get("dropped") or {})
        merged["notes"].update(s.get("notes") or {})
    return {**merged, "dropped": dict(merged["dropped"]), "notes": dict(merged["notes"])}


def _command(record: dict, index: int) -> str | None:
    """The command that makes part `index`, from a finished part's record (it stores its own)."""
    command = (record.get("outputs", {}).get("part") or {}).get("command")
    return f"{command} --shard-index {index}" if command else None


def _command_hint(records: dict[int, dict], missing: list[int], count: int) -> str:
    known = next((r for r in records.values() if _command(r, 0)), None)
    if known is None:
        return f"run the step with --num-shards {count} --shard-index K for each missing K"
    return "run " + "; ".join(f"`{_command(known, k)}`" for k in missing)
