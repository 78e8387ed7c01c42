"""`draftsmith data vocab`: the draft-vocabulary map of a reduced-vocabulary head (EAGLE-3).

    draftsmith data vocab --data data/sg-regen --draft-vocab-size 8192 --out data/sg-vocab

A head whose LM head has `draft_vocab_size` rows predicts only those target tokens. Which ones: the
`draft_vocab_size` most frequent *supervised* tokens (loss_mask == 1) of the train split, ties broken by
the lower id, then sorted by id (EAGLE-3, SpecForge and speculators all build it this way). Two tensors
describe the map, in the convention SGLang and vLLM load (docs/architecture.md, section 5.7):

    d2t  int64 [draft_vocab_size]  offsets:  target_id = draft_id + d2t[draft_id]
    t2d  bool  [vocab_size]        True where the target token is in the draft vocab

If the corpus has fewer distinct supervised tokens than `draft_vocab_size`, the map is padded with the
lowest unused token ids (count 0), so the result is a deterministic function of the counts (the padded
count is recorded and logged). `validate_draft_vocab` checks every invariant engines rely on and names
the broken field; `load_draft_vocab` reads and validates a written map.

Output folder: `draft_vocab.safetensors` (d2t, t2d; metadata: sizes and the convention) and the step
record `draftsmith_data.json` (inputs: the data's fingerprint and hash, draft_vocab_size; outputs:
coverage = share of supervised tokens the draft vocab holds, distinct tokens, padded count).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from draftsmith.data_recipes.common import (
    RECORD_FILE,
    StepRecord,
    Summary,
    atomic_save_file,
    finish,
    guard_out_dir,
    is_done,
    read_record,
)
from draftsmith.data_recipes.parts import load_prepared, require_whole
from draftsmith.runtime.core.artifacts import check_draft_vocab_size, validate_draft_vocab  # noqa: F401
from draftsmith.runtime.errors import BadInputError

log = logging.getLogger(__name__)

VOCAB_FILE = "draft_vocab.safetensors"
D2T_CONVENTION = "target_id = draft_id + d2t[draft_id] (offsets, EAGLE-3/SGLang/vLLM)"
DATA_STEPS = ("prepare", "regenerate")


# ---- counting ------------------------------------------------------------------------------------------
def count_supervised(
    dataset,
    vocab_size: int,
    split: str = "train",
    batch_rows: int = 4096,
    summary: Summary | None = None,
    progress: bool = False,
) -> np.ndarray:
    """Counts [vocab_size] int64 of the tokens under loss_mask == 1 in `split` (a DatasetDict) or a Dataset.

    Streams Arrow batches, so memory stays bounded on large corpora. Bad rows are errors naming --data:
    input_ids/loss_mask of different lengths, ids outside [0, vocab_size), mask values other than 0/1.
    `summary` (optional) gets rows read, kept, and dropped for having no supervised token; `progress`
    shows a bar of rows counted."""
    if not hasattr(dataset, "features"):  # a DatasetDict
        if split not in dataset:
            raise BadInputError("--data", f"splits {sorted(dataset)}", f"a {split!r} split")
        dataset = dataset[split]
    import pyarrow.compute as pc
    from tqdm.auto import tqdm

    counts = np.zeros(vocab_size, dtype=np.int64)
    start = 0
    bar = tqdm(total=len(dataset), desc="vocab", unit="row", unit_scale=True, disable=not progress)
    for table in dataset.select_columns(["input_ids", "loss_mask"]).with_format("arrow").iter(batch_rows):
        ids_col, mask_col = table.column("input_ids"), table.column("loss_mask")
        lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False)
        mask_lengths = pc.list_value_length(mask_col).to_numpy(zero_copy_only=False)
        if not np.array_equal(lengths, mask_lengths):
            bad = int(np.flatnonzero(lengths != mask_lengths)[0])
            raise BadInputError(
                "--data",
                f"row {start + bad}: {lengths[bad]} input_ids and {mask_lengths[bad]} loss_mask entries",
                "loss_mask aligned with input_ids (the same length)",
            )
        ids = pc.list_flatten(ids_col).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        mask = pc.list_flatten(mask_col).to_numpy(zero_copy_only=False)
        if mask.size and not np.isin(mask, (0, 1)).all():
            raise BadInputError("--data", f"loss_mask values {sorted(set(mask.tolist()) - {0, 1})}", "0 or 1")
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            bad_id = int(ids.min() if ids.min() < 0 else ids.max())
            raise BadInputError("--data", f"token id {bad_id}", f"ids in [0, {vocab_size})")
        counts += np.bincount(ids[mask == 1], minlength=vocab_size)
        if summary is not None:
            ends = np.cumsum(lengths)
            cum = np.concatenate([[0], np.cumsum(mask == 1)])
            supervised = cum[ends] - cum[ends - lengths]
            summary.read += len(lengths)
            summary.kept += int((supervised > 0).sum())
            if (supervised == 0).any():
                summary.dropped["no supervised tokens"] += int((supervised == 0).sum())
        start += len(lengths)
        bar.update(len(lengths))
    bar.close()
    return counts


def _counts_array(token_counts, vocab_size: int) -> np.ndarray:
    if isinstance(token_counts, Mapping):
        counts = np.zeros(vocab_size, dtype=np.int64)
        for token, n in token_counts.items():
            if not 0 <= int(token) < vocab_size:
                raise BadInputError("token_counts", f"token id {token}", f"ids in [0, {vocab_size})")
            counts[int(token)] = int(n)
    else:
        counts = np.asarray(torch.as_tensor(token_counts).cpu(), dtype=np.int64)
        if counts.shape != (vocab_size,):
            raise BadInputError("token_counts", f"shape {tuple(counts.shape)}", f"[{vocab_size}]")
    if (counts < 0).any():
        raise BadInputError("token_counts", f"a negative count {int(counts.min())}", "counts >= 0")
    return counts


def select_tokens(counts: np.ndarray, draft_vocab_size: int) -> np.ndarray:
    """The draft vocab's target ids, ascending: top `draft_vocab_size` by count, ties to the lower id.

    Zero-count ids sort after every counted one, lowest id first, so a corpus with fewer distinct
    tokens is padded with the lowest unused ids."""
    order = np.lexsort((np.arange(counts.size), -counts))  # primary: count desc; secondary: id asc
    return np.sort(order[:draft_vocab_size])


def build_draft_vocab(
    source, vocab_size: int, draft_vocab_size: int, split: str = "train"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) from token counts (a {id: count} mapping or a [vocab_size] array) or a prepared dataset.

    A dataset (DatasetDict: its `split`; or a Dataset) is counted under loss_mask == 1."""
    check_draft_vocab_size(vocab_size, draft_vocab_size)
    counts = _counts_of(source, vocab_size, split)
    return _map_from_counts(counts, draft_vocab_size)


def _is_dataset(source) -> bool:
    """A datasets Dataset (has .features) or DatasetDict (a dict of Datasets)."""
    if hasattr(source, "features"):
        return True
    return (
        isinstance(source, Mapping) and bool(source) and all(hasattr(v, "features") for v in source.values())
    )


def _counts_of(source, vocab_size: int, split: str) -> np.ndarray:
    if _is_dataset(source):
        return count_supervised(source, vocab_size, split)
    return _counts_array(source, vocab_size)


def _map_from_counts(counts: np.ndarray, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    used = torch.from_numpy(select_tokens(counts, draft_vocab_size)).to(torch.int64)
    d2t = used - torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(counts.size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


# ---- files -------------------------------------------------------------------------------------------
def save_draft_vocab(path: str | Path, d2t: torch.Tensor, t2d: torch.Tensor, metadata: dict | None = None):
    """Write d2t/t2d atomically as safetensors, with the sizes and the convention in the metadata."""
    meta = {
        "vocab_size": str(t2d.numel()),
        "draft_vocab_size": str(d2t.numel()),
        "d2t_convention": D2T_CONVENTION,
        **{k: str(v) for k, v in (metadata or {}).items()},
    }
    atomic_save_file(path, {"d2t": d2t.contiguous(), "t2d": t2d.contiguous()}, meta)


def load_draft_vocab(
    path: str | Path, vocab_size: int | None = None, draft_vocab_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read a map (a vocab folder or the .safetensors file) and validate it, against sizes when given."""
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        path = path / VOCAB_FILE
    if not path.is_file():
        raise BadInputError(
            "draft vocab", str(path), f"a folder written by `draftsmith data vocab` ({VOCAB_FILE})"
        )
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        if names != {"d2t", "t2d"}:
            raise BadInputError("draft vocab", f"tensors {sorted(names)}", "exactly d2t and t2d")
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    validate_draft_vocab(d2t, t2d, vocab_size or t2d.numel(), draft_vocab_size or d2t.numel())
    return d2t, t2d


def write_draft_vocab(
    data_dir: str | Path, out: str | Path, draft_vocab_size: int, split: str = "train", progress: bool = True
) -> dict:
    """The `data vocab` step: count, build, validate, write. Returns the step record (a no-op if done)."""
    data_dir, out = Path(data_dir), Path(out)
    data_record = require_whole(data_dir, "--data", DATA_STEPS)  # one folder, or a sharded run's parts
    fp = data_record["inputs"].get("fingerprint") or {}
    vocab_size = fp.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise BadInputError("--data", f"vocab_size {vocab_size!r} in {RECORD_FILE}", "a positive integer")
    check_draft_vocab_size(vocab_size, draft_vocab_size)
    guard_out_dir(out, data_dir, "vocab")
    record = StepRecord(
        "vocab",
        inputs={
            "fingerprint": fp,
            "data_hash": data_record["inputs_hash"],
            "draft_vocab_size": draft_vocab_size,
            "split": split,
        },
    )
    if is_done(out, record) and (out / VOCAB_FILE).is_file():
        log.info("vocab: %s is up to date (same inputs); nothing to do", out)
        return read_record(out)

    done = read_record(out)
    if done is not None:  # a finished map with other inputs: it is being replaced
        (out / RECORD_FILE).unlink()
    summary = Summary()
    counts = count_supervised(load_prepared(data_dir), vocab_size, split, summary=summary, progress=progress)
    total = int(counts.sum())
    if total == 0:
        raise BadInputError("--data", f"no supervised tokens in the {split} split", "loss_mask 1 somewhere")
    d2t, t2d = _map_from_counts(counts, draft_vocab_size)
    validate_draft_vocab(d2t, t2d, vocab_size, draft_vocab_size)
    distinct = int((counts > 0).sum())
    record.outputs = {
        "file": VOCAB_FILE,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "supervised_tokens": total,
        "distinct_tokens": distinct,
        "padded": max(0, draft_vocab_size - distinct),
        "coverage": float(counts[t2d.numpy()].sum() / total),
        "d2t_convention": D2T_CONVENTION,
    }
    save_draft_vocab(out / VOCAB_FILE, d2t, t2d, {"data_hash": data_record["inputs_hash"]})
    return finish(out, record, summary)


def summary_line(record: dict) -> str:
    o = record["outputs"]
    return (
        f"vocab: draft vocab {o['draft_vocab_size']} of {o['vocab_size']} covers {100 * o['coverage']:.2f}% "
        f"of {o['supervised_tokens']} supervised tokens ({o['distinct_tokens']} distinct, "
        f"{o['padded']} padded with unused ids)"
    )


def run_from_args(args: argparse.Namespace) -> None:
    from draftsmith.data_recipes.step_summary import StepTimer

    timer = StepTimer()
    record = write_draft_vocab(args.data, args.out, args.draft_vocab_size)
    log.info(summary_line(record))
    rows = record.get("summary") or {}
    dropped = ", ".join(f"{n} ({reason})" for reason, n in rows.get("dropped", {}).items()) or "none"
    log.info("vocab: rows read %d, counted %d, dropped %s", rows.get("read", 0), rows.get("kept", 0), dropped)
    if record["outputs"]["padded"]:
        log.info(
            "vocab: the corpus has fewer distinct supervised tokens than --draft-vocab-size; "
            "a smaller draft vocab would lose nothing"
        )
    log.info("vocab: wrote %s", Path(args.out) / VOCAB_FILE)
    log.info(timer.line(record, args.out))
