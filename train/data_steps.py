"""The data steps a training run needs, run (or reused from the cache) before the first step.

    paths = ensure_data(cfg, target)     # prepare -> vocab (-> capture in offline mode); cached
    rows = TrainRows(paths.prepared, "train")

Each step is the same function `draftsmith data ...` runs and is a no-op when its folder already holds
a finished step with the same inputs, so a second run (or a resumed one) starts training at once. The
default folder is keyed by a hash of the data inputs and the target's fingerprint, so two configs that
want the same data share it and a config for another target never reads it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.data_recipes.common import check_same_target, fingerprint, read_record
from draftsmith.runtime.artifacts import content_hash
from draftsmith.runtime.errors import BadInputError, renamed_fields
from draftsmith.runtime.targets import cache_root

log = logging.getLogger("draftsmith")
PATH_SUFFIXES = (".json", ".jsonl", ".parquet", ".txt", ".gguf")  # names ending so are file paths
# the data steps' flags as this config's keys: their errors name what the user set in a train config
CONFIG_KEYS = {
    "--source": "data.source",
    "--max-samples": "data.max_samples",
    "--max-length": "data.max_length",
    "--validation-fraction": "data.validation_fraction",
    "--seed": "data.seed",
    "--storage-dtype": "data.storage_dtype",
    "--out": "data.dir",
    "--data": "data.dir",
}


@dataclass
class DataPaths:
    prepared: Path
    vocab: Path
    capture: Path | None  # offline mode only
    data_hash: str  # the prepared data's inputs hash (a resume refuses other data)


def data_root(cfg, target) -> Path:
    if cfg.data.dir:
        return Path(cfg.data.dir)
    d = cfg.data
    key = content_hash(
        {
            "fingerprint": fingerprint(target),
            "source": d.source,
            "max_samples": d.max_samples,
            "max_length": d.max_length,
            "validation_fraction": d.validation_fraction,
            "seed": d.seed,
        }
    )
    return cache_root() / "data" / f"{folder_stem(target.name)}-{folder_stem(d.source)}-{key[:12]}"


def folder_stem(name: str) -> str:
    """A readable, safe part of a cache folder name for a user-given name (the hash beside it tells
    sources apart): a Hub id or alias as it is ('/' -> '--'), a path by its file or folder stem
    (`prompts:FILE` -> prompts-STEM); only [A-Za-z0-9._-], no leading dot, at most 48 characters, so no
    source makes nested folders or a name like `..`."""
    prefix, sep, rest = name.partition(":")
    if sep and prefix == "prompts":
        return f"prompts-{folder_stem(rest)}"
    hub_like = re.fullmatch(r"[A-Za-z0-9][\w-]*(/[A-Za-z0-9][\w.-]*)?", name)  # sharegpt, org/name
    if hub_like and Path(name).suffix.lower() not in PATH_SUFFIXES:
        stem = name.replace("/", "--")
    else:
        stem = Path(name).stem
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).lstrip(".-")[:48]
    return stem or "source"


def ensure_data(cfg, target, aux_layers, progress: bool = True) -> DataPaths:
    """Run the data steps this config needs (each a no-op when already done) and return their folders."""
    with renamed_fields(CONFIG_KEYS):  # the steps name `draftsmith data` flags; the user wrote config keys
        return _ensure_data(cfg, target, aux_layers, progress)


def _ensure_data(cfg, target, aux_layers, progress: bool) -> DataPaths:
    from draftsmith.data_recipes.capture import capture
    from draftsmith.data_recipes.prepare import prepare
    from draftsmith.data_recipes.vocab import summary_line, write_draft_vocab

    d, root = cfg.data, data_root(cfg, target)
    log.info("data: %s", root)
    from draftsmith.runtime.prompt_sets import SHAREGPT_HELD_OUT_START

    if d.source == "sharegpt" and (d.max_samples is None or d.max_samples > SHAREGPT_HELD_OUT_START):
        log.warning(
            "data.max_samples=%s reaches ShareGPT's held-out slice (conversations from %d on): "
            "bench --prompts sharegpt would then measure prompts seen in training",
            d.max_samples,
            SHAREGPT_HELD_OUT_START,
        )
    existing = read_record(root / "prepared")
    if existing is not None:  # never silently replace data made for another target or template
        check_same_target(existing, target, "data.dir")
    record = prepare(
        target,
        d.source,
        root / "prepared",
        max_samples=d.max_samples,
        max_length=d.max_length,
        validation_fraction=d.validation_fraction,
        seed=d.seed,
        progress=progress,
    )
    if record.get("outputs", {}).get("prompts_only"):
        raise BadInputError(
            "data.source", d.source, "conversations with answers (run `draftsmith data regenerate` first)"
        )
    vocab = root / f"vocab-{cfg.head.draft_vocab_size}"
    log.info(summary_line(write_draft_vocab(root / "prepared", vocab, cfg.head.draft_vocab_size)))
    captured = None
    if d.mode == "offline":
        layers = "-".join(str(i) for i in aux_layers)
        captured = root / f"capture-{layers}-{d.storage_dtype}"
        capture(
            target,
            root / "prepared",
            captured,
            aux_layers=aux_layers,
            storage_dtype=d.storage_dtype,
            split="all",
            progress=progress,
        )
    return DataPaths(root / "prepared", vocab, captured, record["inputs_hash"])


class TrainRows:
    """Rows of one split that can teach something (at least 3 tokens, a supervised token past the first
    two), as {input_ids [T], loss_mask [T], id}. Offline mode reads the same rows from the capture."""

    def __init__(self, paths: DataPaths, split: str):
        import datasets

        self.split = split
        data = datasets.load_from_disk(str(paths.prepared))
        if split not in data:
            raise BadInputError("data", f"{paths.prepared} without a {split} split", "train and validation")
        part = data[split].with_format(None)
        self.ids = part["id"]  # column reads: iterating rows would decode every input_ids list too
        masks = part["loss_mask"]
        self.keep = [k for k, m in enumerate(masks) if len(m) >= 3 and any(m[2:])]
        self.part = part
        self.capture = None
        if paths.capture is not None:
            from draftsmith.data_recipes.capture_reader import CaptureFolder

            self.capture = CaptureFolder(paths.capture, field_name="data.mode")
            self.capture_at = {row_id: k for k, row_id in enumerate(self.capture.row_ids())}
            missing = [self.ids[k] for k in self.keep if self.ids[k] not in self.capture_at]
            if missing:
                raise BadInputError(
                    "data.mode", f"a capture without rows {missing[:3]}", "every row captured"
                )

    def __len__(self) -> int:
        return len(self.keep)

    def row_id(self, k: int) -> str:
        return self.ids[self.keep[k]]

    def __getitem__(self, k: int) -> dict:
        index = self.keep[k]
        if self.capture is not None:
            return self.capture[self.capture_at[self.ids[index]]]
        row = self.part[index]
        return {
            "input_ids": torch.tensor(row["input_ids"], dtype=torch.long),
            "loss_mask": torch.tensor(row["loss_mask"], dtype=torch.long),
            "id": row["id"],
        }


class SampleOrder:
    """Which rows each micro-batch reads: a pure function of (seed, step, micro-batch, world size, rank).

    The stream is an endless sequence of epochs, each a seeded permutation of the rows; global
    micro-batch g takes stream items [g*B, (g+1)*B) with g = (step * accum + micro) * world + rank. A resume
    therefore needs only the step number to continue exactly where an uninterrupted run would be."""

    def __init__(self, num_rows: int, seed: int, batch_size: int, accum: int, world: int, rank: int):
        if num_rows < 1:
            raise BadInputError("data", "no trainable rows", "rows with supervised tokens")
        self.n, self.seed, self.batch, self.accum, self.world, self.rank = (
            num_rows,
            seed,
            batch_size,
            accum,
            world,
            rank,
        )
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {epoch: torch.randperm(self.n, generator=gen).tolist()}
        return self._perms[epoch]

    def rows(self, step: int, micro: int) -> list[int]:
        g = (step * self.accum + micro) * self.world + self.rank
        return [self._perm(j // self.n)[j % self.n] for j in range(g * self.batch, (g + 1) * self.batch)]

    def epoch(self, step: int) -> float:
        return (step + 1) * self.accum * self.world * self.batch / self.n
