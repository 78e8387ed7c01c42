"""`draftsmith data capture`: run the target once over prepared rows and store what heads train on.

    draftsmith data capture --data data/sg-regen --out data/sg-hidden --storage-dtype bfloat16

Per token, a shard stores the aux hidden states (the residual stream after the chosen decoder layers,
concatenated in layer order: the EAGLE-3 `fc` input) and the last layer's output *before* the final
norm. The target's next-token distribution is not stored: it is recomputed exactly as
`target.logits(last_hidden)` = lm_head(norm(last_hidden)), which is V/H times smaller on disk (85x for
SmolLM2: 576 values per token instead of 49152), the way speculators and SpecForge's offline mode do it.

Shard format (`OUT/shard-00000.safetensors`, about `--shard-tokens` tokens each, rows never split):

    input_ids    int32 [N]              N = tokens in the shard, rows back to back
    loss_mask    int8  [N]              1 = supervised token (aligned with input_ids, as prepared)
    aux_hidden   dtype [N, A*H]         A = len(aux_layers), in aux-layer order; dtype = --storage-dtype
    last_hidden  dtype [N, H]           pre-norm output of the last decoder layer
    *_scale      float32 [N, A] / [N, 1] with --storage-dtype fp8 only: e4m3fn values times these per-token
                 scales (data_recipes/capture_storage.py; --fp8-bf16-layers keeps named aux layers in
                 bfloat16 as aux_hidden_bf16; the last hidden state stays bfloat16 unless
                 --fp8-last-hidden)
    offsets      int64 [R+1]            row r is tokens offsets[r]:offsets[r+1]
    row_index    int64 [R]              the row's index in the captured split(s) (train first for `all`)
    metadata     format, index, inputs_hash, first_row/end_row (the row range the shard covers, skipped
                 rows included), rows, tokens, aux_layers, storage_dtype (+ last_hidden_dtype for fp8),
                 hidden_size, ids (JSON list)

Aux-layer ids are 0-based decoder-layer outputs (docs/architecture.md, 5.6): id i is the tensor after
decoder layer i, which is `hidden_states[i + 1]` in transformers. SGLang, SpecForge and ModelOpt config
ids mean the same; vLLM, speculators and the EAGLE official code count "input to layer X" and name it i+1.
The record states this and stores the ids in both conventions. Default: (1, L//2 - 1, L - 4).

Sharded (`--num-shards N --shard-index K`, for several processes or machines): part K captures the rows
of about a N-th of the tokens (a contiguous range) into `OUT/part-0000K-of-0000N/`, shards and record as
above, each part resumable alone; `CaptureFolder(OUT)` reads the parts as one capture, rows in their
original order, and names a missing part (draftsmith.data_recipes.parts).

Resumable: shards are written atomically (temp name + fsync + rename), so a shard on disk is complete; a
restart keeps the shards made with the same inputs (their metadata carries the inputs hash) and resumes
at the row after the last one. Rows are processed one per forward in order and shard boundaries depend
only on the data and --shard-tokens, so a resumed capture is bit-identical to an uninterrupted one.

Online training calls `capture_row` / `capture_batch` inside the step: the same code path, the same
tensors (in the target's compute dtype instead of the storage dtype). `CaptureFolder` / `load_capture`
read a finished capture row by row (memory-mapped slices, random access).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.data_recipes.capture_reader import TOKEN_TENSORS, CaptureFolder, load_capture  # noqa: F401 (re-exported)
from draftsmith.data_recipes.capture_shards import CAPTURE_FORMAT, ShardWriter, scan_shards, shard_name
from draftsmith.data_recipes.capture_storage import (  # noqa: F401 (re-exported)
    STORAGE_DTYPES,
    Storage,
    bytes_per_token,
    check_disk,
    check_storage,
    human_bytes,
    kept_positions,
    parse_bf16_layers,
)
from draftsmith.data_recipes.common import (
    RECORD_FILE,
    StepRecord,
    Summary,
    check_same_target,
    fingerprint,
    finish,
    follow_thinking,
    guard_out_dir,
    is_done,
    read_record,
)
from draftsmith.data_recipes.parts import (
    balanced_range,
    check_shard_args,
    load_prepared,
    part_folder,
    require_whole,
    whole_done,
)
from draftsmith.data_recipes.vocab import DATA_STEPS
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.aux_layers import (  # noqa: F401 (re-exported)
    AUX_LAYER_CONVENTION,
    default_aux_layers,
    engine_layer_ids,
    parse_aux_layers,
    resolve_aux_layers,
)

log = logging.getLogger(__name__)

CAPTURE_VERSION = 1
SPLITS = ("train", "validation", "all")
DROP_NO_SUPERVISED = "no supervised tokens"


# ---- the tensors (shared by offline capture and online training) ---------------------------------------
def capture_batch(
    target, input_ids: torch.Tensor, aux_layers: Sequence[int], token_valid: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """One target forward over [B, T] ids -> aux_hidden [B, T, A*H], last_hidden [B, T, H].

    token_valid [B, T] (False = padding, left or right) keeps padding out of attention; positions count
    real tokens only, so a padded row gets the same values as alone (up to matmul rounding). Results
    are ordinary tensors (not inference-mode ones), usable as inputs of a head being trained."""
    input_ids = input_ids.to(target.device)
    batch, length = input_ids.shape
    position_ids = None
    if token_valid is not None:
        token_valid = token_valid.to(device=target.device, dtype=torch.bool)
        position_ids = (token_valid.long().cumsum(dim=1) - 1).clamp(min=0)
    cache = target.new_cache(batch, length)
    out = target.forward(
        input_ids, cache, position_ids=position_ids, token_valid=token_valid, capture_layers=tuple(aux_layers)
    )
    return {
        "aux_hidden": torch.cat([out.aux[i] for i in aux_layers], dim=-1),  # a new, ordinary tensor
        "last_hidden": out.hidden.clone(),
    }


def capture_row(target, input_ids, aux_layers: Sequence[int]) -> dict[str, torch.Tensor]:
    """One row (a list or [T] tensor of ids) -> aux_hidden [T, A*H], last_hidden [T, H] (target dtype).

    Offline capture stores exactly these tensors (cast to the storage dtype)."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    return {name: t[0] for name, t in capture_batch(target, ids, aux_layers).items()}


# ---- the step -------------------------------------------------------------------------------------------
def _check_options(
    storage_dtype: str,
    split: str,
    shard_tokens: int,
    fp8_last_hidden: bool = False,
    bf16_layers=(),
    layers=None,
) -> None:
    check_storage(storage_dtype, fp8_last_hidden, bf16_layers, layers)
    if split not in SPLITS:
        raise BadInputError("--split", split, f"one of {list(SPLITS)}")
    if not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise BadInputError("--shard-tokens", shard_tokens, "a positive integer")


def _row_lengths(dataset) -> list[int]:
    import pyarrow.compute as pc

    lengths: list[int] = []
    for table in dataset.select_columns(["input_ids"]).with_format("arrow").iter(4096):
        lengths += pc.list_value_length(table.column("input_ids")).to_pylist()
    return lengths


def capture_done(
    target,
    data_dir,
    out,
    aux_layers=None,
    storage_dtype="bfloat16",
    split="train",
    shard_tokens=65536,
    fp8_last_hidden=False,
    fp8_bf16_layers=(),
) -> dict | None:
    """The finished capture in `out` (one run's, or all its parts') that `capture` with these arguments
    would leave, else None. Multi-process training asks every rank before any of them writes."""
    data_record = require_whole(data_dir, "--data", DATA_STEPS)
    layers = resolve_aux_layers(aux_layers, target.num_layers)
    fp8 = (fp8_last_hidden, tuple(fp8_bf16_layers))
    record = _record(target, data_record, layers, storage_dtype, split, shard_tokens, fp8)
    return _whole_done(Path(out), record)


def _whole_done(out: Path, record: StepRecord) -> dict | None:
    whole = whole_done(out, record.inputs_hash, "capture")
    if whole is not None and all((out / s).is_file() for s in whole["outputs"].get("shards", [])):
        return whole
    return None


def _record(
    target, data_record: dict, layers, storage_dtype: str, split: str, shard_tokens: int, fp8=(False, ())
) -> StepRecord:
    """The capture's step record before any work: its inputs decide the hash (a part adds "shard").
    fp8 = (fp8_last_hidden, fp8_bf16_layers)."""
    record = StepRecord(
        "capture",
        inputs={
            "fingerprint": fingerprint(target),
            "data_hash": data_record["inputs_hash"],
            "aux_layers": list(layers),
            "aux_layer_convention": AUX_LAYER_CONVENTION,
            "storage_dtype": storage_dtype,
            "compute_dtype": str(target.dtype).removeprefix("torch."),
            "num_layers": target.num_layers,
            "hidden_size": target.hidden_size,
            "split": split,
            "shard_tokens": shard_tokens,
        },
    )
    if storage_dtype == "fp8":  # only then: the hashes of other captures stay as they were
        record.inputs["last_hidden_dtype"] = Storage.of("fp8", 0, 0, fp8[0]).last
    if fp8[1]:  # in aux-layer order: [14, 1] and [1, 14] are one capture
        record.inputs["fp8_bf16_layers"] = [layers[i] for i in kept_positions(layers, fp8[1])]
    return record


def capture(
    target,
    data_dir: str | Path,
    out: str | Path,
    aux_layers=None,
    storage_dtype: str = "bfloat16",
    split: str = "train",
    shard_tokens: int = 65536,
    progress: bool = True,
    num_shards: int = 1,
    shard_index: int = 0,
    fp8_last_hidden: bool = False,
    row_tensors=None,
    fp8_bf16_layers=(),
) -> dict:
    """The `data capture` step; returns the finished step record (a no-op when already done).

    With num_shards > 1 it captures part `shard_index` (rows of about a num_shards-th of the tokens,
    `parts.balanced_range`) into OUT/part-K-of-N/; the parts read as one capture (CaptureFolder).
    fp8_bf16_layers: aux layer ids kept in bfloat16 under storage_dtype fp8 (capture_storage).
    row_tensors(rows) -> f(ids) -> tensors: another engine's rows (data_recipes/vllm_capture.py)."""
    data_dir, out = Path(data_dir), Path(out)
    check_shard_args(num_shards, shard_index)
    data_record = require_whole(data_dir, "--data", DATA_STEPS)
    follow_thinking(target, data_record)  # recorded again: the mode the rows were rendered with
    check_same_target(data_record, target, "--target")
    layers = resolve_aux_layers(aux_layers, target.num_layers)
    _check_options(storage_dtype, split, shard_tokens, fp8_last_hidden, fp8_bf16_layers, layers)
    guard_out_dir(out, data_dir, "capture")
    fp8 = (fp8_last_hidden, tuple(fp8_bf16_layers))
    record = _record(target, data_record, layers, storage_dtype, split, shard_tokens, fp8)
    whole = _whole_done(out, record)  # made before, in one run or in parts
    if whole is not None:
        log.info("capture: %s is up to date (same inputs); nothing to do", out)
        return whole
    part_out = part_folder(out, record, num_shards, shard_index, "capture")
    done = read_record(part_out)
    if is_done(part_out, record) and all((part_out / s).is_file() for s in done["outputs"].get("shards", [])):
        log.info("capture: %s is up to date (same inputs); nothing to do", part_out)
        return done

    data = load_prepared(data_dir)
    names = ["train", "validation"] if split == "all" else [split]
    missing = [name for name in names if name not in data]
    if missing:
        raise BadInputError("--split", split, f"a split of {data_dir} (it has {sorted(data)})")
    parts = [(name, data[name]) for name in names]
    bounds, total_rows = {}, 0
    for name, part in parts:
        bounds[name] = [total_rows, total_rows + len(part)]
        total_rows += len(part)
    lengths = [n for _, part in parts for n in _row_lengths(part)]
    lo, hi = balanced_range(lengths, shard_index, num_shards) if num_shards > 1 else (0, total_rows)

    part_out.mkdir(parents=True, exist_ok=True)
    if done is not None:  # a finished capture with other inputs: it is being replaced
        (part_out / RECORD_FILE).unlink()
    kept = scan_shards(part_out, record.inputs_hash, first_row=lo)
    start_row = int(kept[-1]["end_row"]) if kept else lo
    bf16_aux = kept_positions(layers, fp8_bf16_layers)
    storage = Storage.of(storage_dtype, len(layers), target.hidden_size, fp8_last_hidden, bf16_aux)
    check_disk(part_out, lengths[start_row:hi], start_row, len(kept), storage)

    static_meta = {
        "format": CAPTURE_FORMAT,
        "version": str(CAPTURE_VERSION),
        "inputs_hash": record.inputs_hash,
        "aux_layers": json.dumps(list(layers)),
        "aux_layer_convention": AUX_LAYER_CONVENTION,
        "storage_dtype": storage_dtype,
        **({"last_hidden_dtype": storage.last} if storage_dtype == "fp8" else {}),
        **({"fp8_bf16_aux": json.dumps(list(bf16_aux))} if bf16_aux else {}),
        "hidden_size": str(target.hidden_size),
    }
    writer = ShardWriter(part_out, len(kept), start_row, static_meta, storage)
    started = time.perf_counter()
    # tokens, not rows: forward time follows tokens, so throughput and ETA do too
    todo, done_tokens = sum(lengths[lo:hi]), sum(lengths[lo:start_row])
    bar = tqdm(
        total=todo, initial=done_tokens, desc="capture", unit="tok", unit_scale=True, disable=not progress
    )
    try:
        kept += _capture_rows(target, parts, (start_row, hi), layers, writer, shard_tokens, bar, row_tensors)
    finally:
        bar.close()
    elapsed = time.perf_counter() - started

    rows_kept = sum(int(m["rows"]) for m in kept)
    if rows_kept == 0 and num_shards == 1:  # a part may hold none; the whole must hold some
        raise BadInputError(
            "--data", f"no row with supervised tokens in the {split} split", "loss_mask 1 somewhere"
        )
    shards = [shard_name(int(m["index"])) for m in kept]
    tokens = sum(int(m["tokens"]) for m in kept)
    size = sum((part_out / s).stat().st_size for s in shards)
    summary = Summary(read=hi - lo, kept=rows_kept)
    if hi - lo - rows_kept:
        summary.dropped[DROP_NO_SUPERVISED] = hi - lo - rows_kept
    record.outputs = {
        "shards": shards,
        "rows": rows_kept,
        "tokens": tokens,
        "bytes": size,
        "bytes_per_token": size / max(1, tokens),
        "splits": bounds,
        "aux_layer_ids": engine_layer_ids(layers),
        "tensors": {
            "input_ids": "int32 [N]",
            "loss_mask": "int8 [N]",
            **storage.record_tensors(),
            "offsets": "int64 [rows+1]",
            "row_index": "int64 [rows]",
        },
        "device": str(target.device),
        "last_run": {"rows": hi - start_row, "wall_s": round(elapsed, 3)},
    }
    if num_shards > 1:
        record.outputs["part"] = {
            "rows": [lo, hi],
            "command": _part_command(
                target, data_dir, out, layers, storage_dtype, split, shard_tokens, num_shards, fp8
            ),
        }
    return finish(part_out, record, summary)


def _capture_rows(
    target, parts, rows_range, layers, writer: ShardWriter, shard_tokens: int, bar, row_tensors=None
) -> list:
    """Capture rows [start, end) of the splits `parts` (numbered across them, in order) one forward each;
    the metadata of every shard flushed, the last one included."""
    start_row, end_row = rows_range
    flushed, row_number = [], 0
    for _name, part in parts:
        first = row_number
        row_number += len(part)
        begin, end = max(0, start_row - first), min(len(part), end_row - first)
        if begin >= end:
            continue
        rows = part.select_columns(["id", "input_ids", "loss_mask"]).select(range(begin, end))
        tensors_of = row_tensors(rows) if row_tensors else lambda ids: capture_row(target, ids, layers)
        for offset, row in enumerate(rows):
            index = first + begin + offset
            ids, mask = row["input_ids"], row["loss_mask"]
            _check_row(index, row["id"], ids, mask, target.vocab_size, target.max_context)
            if sum(mask) > 0:
                writer.add(index, row["id"], ids, mask, tensors_of(ids))  # refuses non-finite
            bar.update(len(ids))
            if writer.tokens >= shard_tokens:
                flushed.append(writer.flush(end_row=index + 1))
    if writer.lengths:
        flushed.append(writer.flush(end_row=end_row))
    return flushed


def _part_command(
    target, data_dir, out, layers, storage_dtype, split, shard_tokens, num_shards, fp8=(False, ())
) -> str:
    """The `draftsmith data capture` line that makes a part of this run (its --shard-index appended)."""
    words = ["draftsmith", "data", "capture", "--target", getattr(target, "path", None) or target.name]
    words += ["--dtype", str(target.dtype).removeprefix("torch."), "--data", str(data_dir), "--out", str(out)]
    words += ["--aux-layers", ",".join(map(str, layers)), "--storage-dtype", storage_dtype, "--split", split]
    words += ["--shard-tokens", str(shard_tokens), "--num-shards", str(num_shards)]
    words += ["--fp8-last-hidden"] if fp8[0] else []
    words += ["--fp8-bf16-layers", ",".join(map(str, fp8[1]))] if fp8[1] else []
    return shlex.join(words)


def _check_row(index: int, row_id: str, ids, mask, vocab_size: int, max_context: int) -> None:
    where = f"row {index} ({row_id})"
    if len(ids) != len(mask):
        raise BadInputError(
            "--data", f"{where}: {len(ids)} input_ids and {len(mask)} loss_mask entries", "the same length"
        )
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        raise BadInputError(
            "--data",
            f"{where}: token id {min(ids) if min(ids) < 0 else max(ids)}",
            f"ids in [0, {vocab_size})",
        )
    if any(m not in (0, 1) for m in mask):
        raise BadInputError("--data", f"{where}: loss_mask values {sorted(set(mask) - {0, 1})}", "0 or 1")
    if len(ids) > max_context:
        raise BadInputError(
            "--data", f"{where}: {len(ids)} tokens", f"at most {max_context} (the target's context)"
        )


def summary_lines(record: dict) -> list[str]:
    o, i = record["outputs"], record["inputs"]
    lines = [
        f"capture: {o['rows']} rows, {o['tokens']} tokens in {len(o['shards'])} shard(s), "
        f"{human_bytes(o['bytes'])} ({o['bytes_per_token']:.0f} bytes/token, {i['storage_dtype']}"
        + (f", last hidden {i['last_hidden_dtype']}" if "last_hidden_dtype" in i else "")
        + (f", aux layers {i['fp8_bf16_layers']} bfloat16)" if "fp8_bf16_layers" in i else ")"),
        f"capture: aux layers {i['aux_layers']} (0-based layer outputs; vLLM/speculators ids "
        f"{[x + 1 for x in i['aux_layers']]})",
    ]
    shard = i.get("shard")
    if shard:
        lo, hi = o["part"]["rows"]
        lines.append(
            f"capture: part {shard['index']} of {shard['count']} (rows {lo}:{hi}); the folder reads as one "
            "capture once every part is done"
        )
    last = o.get("last_run") or {}
    if last.get("wall_s"):
        lines.append(f"capture: {last['rows'] / last['wall_s']:.1f} rows/s in this run")
    summary = record.get("summary") or {}
    for reason, n in (summary.get("dropped") or {}).items():
        lines.append(f"capture: skipped {n} row(s): {reason}")
    return lines


def run_from_args(args: argparse.Namespace) -> None:
    from draftsmith.data_recipes.step_summary import StepTimer

    timer = StepTimer()
    # Cheap checks before loading the target (seconds to minutes).
    check_shard_args(args.num_shards, args.shard_index)
    require_whole(args.data, "--data", DATA_STEPS)
    layers = parse_aux_layers(args.aux_layers)
    fp8_last = getattr(args, "fp8_last_hidden", False)
    bf16_layers = parse_bf16_layers(getattr(args, "fp8_bf16_layers", None))
    _check_options(args.storage_dtype, args.split, args.shard_tokens, fp8_last, bf16_layers, layers)

    from draftsmith.data_recipes.tp_steps import run_step

    def work(target, num_shards: int, shard_index: int) -> dict:
        return capture(
            target,
            args.data,
            args.out,
            aux_layers=layers,
            storage_dtype=args.storage_dtype,
            split=args.split,
            shard_tokens=args.shard_tokens,
            num_shards=num_shards,
            shard_index=shard_index,
            fp8_last_hidden=fp8_last,
            fp8_bf16_layers=bf16_layers,
        )

    # one process, or this rank's share under torchrun (--target-placement tp: its group's part)
    record = run_step(args, "capture", work)
    for line in summary_lines(record) if record is not None else []:  # None: a TP follower
        log.info(line)
    if record is not None:
        log.info(timer.line(record, args.out))
