"""`draftsmith data prepare`: conversations -> chat-templated token ids with assistant-only loss masks.

    draftsmith data prepare --source sharegpt --out data/sg --max-samples 1000 --max-length 1024

Pipeline: read the source (data_recipes.sources; streamed) -> normalize (bad rows skipped and counted
by reason) -> render with the target's chat template and mask the assistant spans (data_recipes.
templating) -> clip rows longer than --max-length (counted as "clipped", and "clipped mid-answer" when
the cut falls inside an answer; --fail-on-clip makes it an error) -> drop rows left with no supervised
token -> stop at --max-samples kept rows -> split train/validation by a hash of (seed, row id), so a
row's split never depends on order or on --max-samples -> write. Nothing kept is an error; so is
clipping that empties more than half of the rows (--max-length is too small for the data);
more than half of the rows read dropped for any reason is a warning (ShareGPT V3 alone loses ~39%
to assistant-first chunks), and the summary lists every reason.

The folder is a `datasets.DatasetDict` ("train", "validation") saved with `save_to_disk`, with columns
`id` (str), `input_ids` (int32 list), `loss_mask` (int8 0/1 list, aligned with input_ids: 1 = the token
is written by the assistant; shift it together with the labels, templating.shift_for_training),
`num_supervised` (int32) and `messages` (JSON of the normalized conversation; `data regenerate` reads
it). It is written into a temporary sibling folder, renamed into place, and `draftsmith_data.json` (the
step record: target/tokenizer/template hashes, source hash, options, counts, the summary) is written
last, so a killed run leaves a folder that is not done and is redone. The same inputs again: a no-op.

Rows from `prompts:FILE` carry an empty assistant placeholder and an all-zero mask: they exist to be
regenerated (`data regenerate`), and the record says `prompts_only: true`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from draftsmith.data_recipes.common import (
    RECORD_FILE,
    StepRecord,
    Summary,
    content_hash,
    fingerprint,
    finish,
    is_done,
    read_record,
)
from draftsmith.data_recipes.sources import Conversation, iter_conversations, source_hash, validate_source
from draftsmith.data_recipes.templating import render_and_mask
from draftsmith.runtime.core.artifacts import pid_alive
from draftsmith.runtime.errors import BadInputError, check_output_dir

log = logging.getLogger("draftsmith")

RECIPE_VERSION = 1  # bump when rendering or masking changes: old folders are then redone
SPLITS = ("train", "validation")
MAX_DROPPED_FRACTION = 0.5
SHARD_BYTES = 500 << 20  # datasets' default max shard size

NO_SUPERVISED_CLIPPED = "no supervised tokens after truncation"
NO_SUPERVISED = "no supervised tokens"
PROMPT_TOO_LONG = "prompt longer than --max-length"
CLIPPED = "clipped"
CLIPPED_MID_ANSWER = "clipped mid-answer"
STRADDLING = "tokens straddling an answer boundary"


def split_of(seed: int, row_id: str, validation_fraction: float) -> str:
    """train or validation, from a hash of (seed, row id) alone."""
    u = int(content_hash([seed, row_id]), 16) / 16**16  # uniform in [0, 1)
    return "validation" if u < validation_fraction else "train"


def encode_rows(
    tokenizer,
    conversations: Iterable[Conversation],
    max_length: int,
    summary: Summary,
    fail_on_clip: bool = False,
    limit: int | None = None,
    thinking: bool | None = None,
) -> list[dict]:
    """Rendered (`thinking`: the template's enable_thinking, None its default), masked, clipped rows;
    dropped rows are counted in `summary`, kept ones too."""
    rows = []
    for conv in conversations:
        enc = render_and_mask(tokenizer, conv.messages, thinking)
        ids, mask = enc.input_ids, enc.loss_mask
        if conv.prompts_only:
            mask = [0] * len(ids)  # the placeholder answer is not supervised: regenerate fills it
        if enc.straddling:
            summary.notes[STRADDLING] += enc.straddling
        if len(ids) > max_length:
            if fail_on_clip:
                raise BadInputError(
                    "--max-length",
                    f"row {conv.id!r} with {len(ids)} tokens",
                    f"rows of at most {max_length} tokens",
                    "raise --max-length, or leave out --fail-on-clip to clip long rows",
                )
            if conv.prompts_only:
                summary.drop(PROMPT_TOO_LONG)
                continue
            summary.notes[CLIPPED] += 1
            if mask[max_length - 1] and mask[max_length]:  # both sides of the cut are in one answer
                summary.notes[CLIPPED_MID_ANSWER] += 1
            ids, mask = ids[:max_length], mask[:max_length]
            if not any(mask):
                summary.drop(NO_SUPERVISED_CLIPPED)
                continue
        elif not conv.prompts_only and not any(mask):
            summary.drop(NO_SUPERVISED)
            continue
        rows.append(
            {
                "id": conv.id,
                "input_ids": np.asarray(ids, dtype=np.int32),
                "loss_mask": np.asarray(mask, dtype=np.int8),
                "messages": json.dumps(conv.messages, ensure_ascii=False),
            }
        )
        summary.kept += 1
        if limit is not None and len(rows) >= limit:
            break
    return rows


def check_kept(summary: Summary, field: str) -> None:
    """Fail when nothing is kept, or when clipping emptied more than half of the rows; warn when more
    than half of the rows read were dropped for any reason (the summary says which)."""
    dropped = sum(summary.dropped.values())
    reasons = ", ".join(f"{r}: {n}" for r, n in summary.dropped.most_common())
    if summary.kept == 0:
        raise BadInputError(
            field, f"{summary.read} rows, none kept ({reasons or 'no rows'})", "at least one usable row"
        )
    emptied = summary.dropped[NO_SUPERVISED_CLIPPED]
    if emptied / (emptied + summary.kept) > MAX_DROPPED_FRACTION:
        raise BadInputError(
            "--max-length",
            f"{emptied} of {emptied + summary.kept} rows left with no supervised token after clipping",
            f"at most {MAX_DROPPED_FRACTION:.0%} of the rows emptied by clipping",
            "raise --max-length",
        )
    if dropped / summary.read > MAX_DROPPED_FRACTION:
        log.warning(
            "%d of %d rows were dropped (%s): check the source's format", dropped, summary.read, reasons
        )


def _dataset(rows: list[dict]):
    import datasets
    import pyarrow as pa

    def lists(key: str, dtype) -> pa.Array:
        lengths = np.array([len(r[key]) for r in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = np.concatenate([r[key] for r in rows]) if rows else np.zeros(0, dtype)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(dtype)))

    table = pa.table(
        {
            "id": pa.array([r["id"] for r in rows], pa.string()),
            "input_ids": lists("input_ids", np.int32),
            "loss_mask": lists("loss_mask", np.int8),
            "num_supervised": pa.array([int(r["loss_mask"].sum()) for r in rows], pa.int32()),
            "messages": pa.array([r["messages"] for r in rows], pa.string()),
        }
    )
    return datasets.Dataset(table)


@contextlib.contextmanager
def _datasets_bars(enabled: bool):
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    if not enabled:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def check_out_folder(out: Path) -> None:
    """`out` must be new, empty, or a folder written by a draftsmith data step (it gets replaced)."""
    check_output_dir("--out", out)  # a file there, or above it
    if out.is_dir() and any(out.iterdir()) and not _is_ours(out):
        raise BadInputError(
            "--out",
            str(out),
            "a new or empty folder, or one written by draftsmith data",
            "refusing to replace it",
        )


def _is_ours(folder: Path) -> bool:
    """A finished step's folder, or a prepared DatasetDict whose record was never written (a kill)."""
    if (folder / RECORD_FILE).is_file():
        return True
    try:
        splits = json.loads((folder / "dataset_dict.json").read_text()).get("splits")
        info = (folder / "train" / "dataset_info.json").read_text()
    except (OSError, ValueError, AttributeError):
        return False
    return sorted(splits or []) == sorted(SPLITS) and '"loss_mask"' in info


def _remove_stale(out: Path) -> None:
    """Temporary folders of killed runs: this process's own, or those of processes that are gone."""
    for kind in ("tmp", "old"):
        for tmp in out.parent.glob(f".{out.name}.{kind}-*"):
            pid = tmp.name.rsplit("-", 1)[-1]
            if not pid.isdigit() or int(pid) == os.getpid() or not pid_alive(int(pid)):
                shutil.rmtree(tmp, ignore_errors=True)


def write_splits(
    splits: dict[str, list[dict]],
    out: str | Path,
    record: StepRecord,
    summary: Summary,
    progress: bool = True,
) -> dict:
    """Save the DatasetDict next to `out`, rename it into place, then write the record (last)."""
    import datasets

    out = Path(out)
    check_out_folder(out)
    field = "--source" if record.step == "prepare" else "--data"
    check_kept(summary, field)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    data = datasets.DatasetDict({name: _dataset(splits.get(name, [])) for name in SPLITS})
    # At least one shard per split: datasets writes no shard for an empty split and cannot load it back.
    shards = {name: max(1, min(len(ds), -(-ds.data.nbytes // SHARD_BYTES))) for name, ds in data.items()}
    with _datasets_bars(progress):
        data.save_to_disk(str(tmp), num_shards=shards)
    if out.exists():  # a finished folder for other inputs, or a killed run's: replace it
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)
    tokens = sum(len(r["input_ids"]) for rows in splits.values() for r in rows)
    supervised = sum(int(r["loss_mask"].sum()) for rows in splits.values() for r in rows)
    prompts_only = record.step == "prepare" and str(record.inputs.get("source")).startswith("prompts:")
    record.outputs = {
        **record.outputs,  # what the step set before (a part's identity)
        "splits": {name: len(splits.get(name, [])) for name in SPLITS},
        "tokens": tokens,
        "supervised_tokens": supervised,
        "columns": list(data["train"].column_names),
        "prompts_only": prompts_only,
    }
    return finish(out, record, summary)


def write_prepared(
    target,
    rows: dict[str, list[tuple[str, list[dict]]]],
    out: str | Path,
    record: StepRecord,
    summary: Summary,
    max_length: int,
    progress: bool = True,
    fail_on_clip: bool = False,
) -> dict:
    """Render, mask, clip and write conversations whose split is already decided (used by regenerate)."""
    splits = {}
    for name, items in rows.items():
        convs = (Conversation(row_id, messages) for row_id, messages in items)
        bar = tqdm(convs, total=len(items), desc=f"tokenize {name}", unit="conv", disable=not progress)
        thinking = getattr(target, "thinking", None)  # the mode of the data regenerated (follow_thinking)
        splits[name] = encode_rows(
            target.tokenizer, bar, max_length, summary, fail_on_clip, thinking=thinking
        )
    return write_splits(splits, out, record, summary, progress)


def _check_options(max_samples, max_length, validation_fraction, seed) -> None:
    def is_int(v) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    if max_samples is not None and (not is_int(max_samples) or max_samples < 1):
        raise BadInputError("--max-samples", max_samples, "an integer >= 1 (or no flag: every row)")
    if not is_int(max_length) or max_length < 2:
        raise BadInputError("--max-length", max_length, "an integer >= 2")
    if not isinstance(validation_fraction, (int, float)) or not 0 <= validation_fraction < 1:
        raise BadInputError("--validation-fraction", validation_fraction, "a number in [0, 1)")
    if not is_int(seed):
        raise BadInputError("--seed", seed, "an integer")


def prepare(
    target,
    source: str,
    out: str | Path,
    max_samples: int | None = None,
    max_length: int = 2048,
    validation_fraction: float = 0.05,
    seed: int = 0,
    fail_on_clip: bool = False,
    progress: bool = True,
) -> dict:
    """Prepare `source` for `target` into `out`; returns the finished record (a no-op when done)."""
    _check_options(max_samples, max_length, validation_fraction, seed)
    validate_source(source)
    out = Path(out)
    record = StepRecord(
        "prepare",
        inputs={
            "fingerprint": fingerprint(target),
            "recipe": RECIPE_VERSION,
            "source": source,
            "source_hash": source_hash(source),
            "max_samples": max_samples,
            "max_length": max_length,
            "validation_fraction": validation_fraction,
            "seed": seed,
        },
    )
    if is_done(out, record):
        log.info("%s is already prepared with these inputs (%s): nothing to do", out, record.inputs_hash)
        return read_record(out)
    check_out_folder(out)
    if max_length > target.max_context:
        log.warning(
            "--max-length %d is longer than the target's context (%d): rows that long cannot be captured",
            max_length,
            target.max_context,
        )
    summary = Summary()
    # kept rows against --max-samples (the ETA; a streamed source's length is unknown), rows read beside
    bar = tqdm(desc="prepare", unit="conv", total=max_samples, disable=not progress)

    def counted(convs):
        for conv in convs:
            yield conv
            bar.update(summary.kept - bar.n)
            bar.set_postfix(read=summary.read, refresh=False)

    try:
        rows = encode_rows(
            target.tokenizer,
            counted(iter_conversations(source, summary)),
            max_length,
            summary,
            fail_on_clip,
            limit=max_samples,
            thinking=getattr(target, "thinking", None),  # --thinking (use_thinking), in the fingerprint too
        )
    finally:
        bar.update(summary.kept - bar.n)
        bar.close()
    splits: dict[str, list[dict]] = {name: [] for name in SPLITS}
    for row in rows:
        splits[split_of(seed, row["id"], validation_fraction)].append(row)
    return write_splits(splits, out, record, summary, progress)


def summary_lines(done: dict) -> list[str]:
    s = done.get("summary") or {}
    summary = Summary(
        s.get("read", 0), s.get("kept", 0), Counter(s.get("dropped", {})), Counter(s.get("notes", {}))
    )
    outputs = done.get("outputs", {})
    lines = summary.lines()
    if outputs:
        splits = ", ".join(f"{k} {v}" for k, v in outputs.get("splits", {}).items())
        lines.append(
            f"  splits: {splits}; {outputs.get('tokens', 0)} tokens, "
            f"{outputs.get('supervised_tokens', 0)} supervised"
            + (
                "; prompts only: run `draftsmith data regenerate` before training"
                if outputs.get("prompts_only")
                else ""
            )
        )
    return lines


def run_from_args(args) -> None:
    from draftsmith.data_recipes.step_summary import StepTimer
    from draftsmith.runtime.core.chat_template import thinking_arg, use_thinking
    from draftsmith.runtime.core.target import Target

    timer = StepTimer()
    _check_options(args.max_samples, args.max_length, args.validation_fraction, args.seed)
    validate_source(args.source)  # fail before the target loads
    check_out_folder(Path(args.out))
    target = Target.load(args.target, device=args.device, dtype=args.dtype)
    use_thinking(target, thinking_arg(args.thinking, "--thinking"))  # exit 2 where the template has none
    done = prepare(
        target,
        args.source,
        args.out,
        max_samples=args.max_samples,
        max_length=args.max_length,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        fail_on_clip=args.fail_on_clip,
    )
    log.info("prepared %s from %s:", args.out, args.source)
    for line in summary_lines(done):
        log.info("%s", line)
    log.info(timer.line(done, args.out))
