"""The data steps a training run needs, run (or reused from the cache) before the first step.

    paths = ensure_data(cfg, target)     # prepare -> vocab (-> capture in offline mode); cached
    rows = TrainRows(paths.prepared, "train")
    data_commands(cfg, target, aux)      # the same steps as `draftsmith data` lines, to run beforehand

Each step is the same function `draftsmith data ...` runs and is a no-op when its folder already holds
a finished step with the same inputs, so a second run (or a resumed one) starts training at once. The
default folder is keyed by a hash of the data inputs and the target's fingerprint, so two configs that
want the same data share it and a config for another target never reads it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.data_recipes.common import check_same_target, fingerprint, read_record
from draftsmith.runtime.core.artifacts import content_hash
from draftsmith.runtime.core.targets import cache_root
from draftsmith.runtime.errors import BadInputError, renamed_fields

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
    "--fp8-last-hidden": "data.fp8_last_hidden",
    "--fp8-bf16-layers": "data.fp8_bf16_layers",
    "--out": "data.dir",
    "--data": "data.dir",
}


@dataclass
class DataPaths:
    prepared: Path
    vocab: Path
    capture: Path | None  # offline mode only
    data_hash: str  # the prepared data's inputs hash (a resume refuses other data)
    fingerprint: dict = field(default_factory=dict)  # what it was made for: final/'s trained_for record


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


def ensure_data(cfg, target, aux_layers, progress: bool = True, acc=None) -> DataPaths:
    """Run the data steps this config needs (each a no-op when already done) and return their folders.

    With an Accelerator of several processes (`accelerate launch`), rank 0 runs prepare and vocab while
    the others wait; then, in offline mode, every rank captures its part of the rows (part rank of world
    size, `data capture --num-shards`) and all wait for the slowest. With `target_placement: tp` a part
    per tensor-parallel group: the group's rank 0 captures it, the others run each forward with it.
    `train.process_group_timeout_s` bounds each wait; one that runs out names the `draftsmith data`
    commands to run first instead."""
    with renamed_fields(CONFIG_KEYS):  # the steps name `draftsmith data` flags; the user wrote config keys
        return _ensure_data(cfg, target, aux_layers, progress, acc)


def _ensure_data(cfg, target, aux_layers, progress: bool, acc) -> DataPaths:
    from draftsmith.data_recipes.capture import capture, capture_done
    from draftsmith.data_recipes.parts import require_whole
    from draftsmith.runtime.core.placement import configured_tp, driving, follow
    from draftsmith.runtime.core.target_parts import PartsOnlyError
    from draftsmith.train.loop.process_group import rank0_first, wait_for_ranks

    d, root = cfg.data, data_root(cfg, target)
    prepared, vocab = root / "prepared", root / f"vocab-{cfg.head.draft_vocab_size}"
    world, rank = (acc.num_processes, acc.process_index) if acc is not None else (1, 0)
    tp = configured_tp(cfg, world)  # tp or ep: one capture part per group (placement.py)
    parts, part = world // tp, rank // tp
    commands = data_commands(cfg, target, aux_layers, parts)
    captured = capture_dir(root, aux_layers, storage_label(d)) if d.mode == "offline" else None

    def done() -> dict | None:  # the finished capture of this config (all parts), else None
        return capture_done(
            target,
            prepared,
            captured,
            aux_layers,
            d.storage_dtype,
            "all",
            fp8_last_hidden=d.fp8_last_hidden,
            fp8_bf16_layers=d.fp8_bf16_layers,
        )

    with rank0_first(acc, cfg, "the data steps", commands):
        # rank 0 has made them: a rank that cannot see them must not make them again
        if rank > 0 and not _visible(lambda: read_record(prepared) is not None):
            raise _not_shared(prepared, rank)
        record = _prepare_and_vocab(cfg, target, root, progress)
        todo = captured is not None and done() is None
    if captured is not None:  # every rank has asked before any writes a part: all take the same path
        wait_for_ranks(acc, cfg, "the other ranks to look for the capture", commands)
    if todo:
        if world > 1:
            log.info(
                "data: one capture part per %s; to make them before a run: %s",
                "tensor-parallel group" if tp > 1 else "rank",
                "; ".join(commands),
            )
        if tp > 1 and getattr(target, "tp_size", 1) != tp:  # offline parts: the trainer loads the shards
            raise PartsOnlyError(
                f"a capture under target_placement={cfg.target_placement} needs {target.name}'s layers "
                "in shards"
            )
        if rank % tp:  # the group's rank 0 captures the group's part; this rank runs each forward with it
            follow(target)
        else:
            with driving(target) if tp > 1 else contextlib.nullcontext():
                capture(
                    target,
                    prepared,
                    captured,
                    aux_layers=aux_layers,
                    storage_dtype=d.storage_dtype,
                    fp8_last_hidden=d.fp8_last_hidden,
                    fp8_bf16_layers=d.fp8_bf16_layers,
                    split="all",
                    progress=progress,
                    num_shards=parts,  # one part per rank or TP group (one process: the whole, no parts)
                    shard_index=part,
                )
    if captured is not None and world > 1:
        wait_for_ranks(acc, cfg, "every rank's part of the capture", commands)
        if not _visible(lambda: done() is not None):
            require_whole(captured, "data.dir", ("capture",))  # names a missing part
            raise _not_shared(captured, rank)
    return DataPaths(prepared, vocab, captured, record["inputs_hash"], record["inputs"]["fingerprint"])


def _prepare_and_vocab(cfg, target, root: Path, progress: bool) -> dict:
    from draftsmith.data_recipes.prepare import prepare
    from draftsmith.data_recipes.sources import SHAREGPT_HELD_OUT_START
    from draftsmith.data_recipes.vocab import summary_line, write_draft_vocab

    d = cfg.data
    log.info("data: %s", root)
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
    made = write_draft_vocab(root / "prepared", vocab, cfg.head.draft_vocab_size, progress=progress)
    log.info(summary_line(made))
    return record


def capture_dir(root: Path, aux_layers, storage_dtype: str) -> Path:
    return root / f"capture-{'-'.join(str(i) for i in aux_layers)}-{storage_dtype}"


def storage_label(d) -> str:
    """The capture folder's storage part: the dtype, `fp8-all` when the last hidden state is fp8 too,
    `fp8-bf16-L` for the aux layers L kept in bfloat16."""
    label = "fp8-all" if d.storage_dtype == "fp8" and d.fp8_last_hidden else d.storage_dtype
    return label + ("-bf16-" + "-".join(map(str, d.fp8_bf16_layers)) if d.fp8_bf16_layers else "")


def data_commands(cfg, target, aux_layers, world: int = 1) -> list[str]:
    """The `draftsmith data` lines that make this config's data beforehand, into the folders
    `ensure_data` then finds done (the capture as `world` parts, one command each)."""
    d, root = cfg.data, data_root(cfg, target)
    prepared = str(root / "prepared")
    prep = ["prepare", "--target", cfg.target, "--source", d.source, "--out", prepared]
    prep += ["--max-length", str(d.max_length), "--validation-fraction", str(d.validation_fraction)]
    prep += ["--seed", str(d.seed)] + (["--max-samples", str(d.max_samples)] if d.max_samples else [])
    prep += ["--thinking", d.thinking] if d.thinking else []  # capture follows the mode recorded by prepare
    vocab = ["vocab", "--data", prepared, "--draft-vocab-size", str(cfg.head.draft_vocab_size)]
    steps = [prep, [*vocab, "--out", str(root / f"vocab-{cfg.head.draft_vocab_size}")]]
    if d.mode == "offline":
        cap = ["capture", "--target", cfg.target, "--dtype", cfg.dtype, "--data", prepared]
        cap += ["--out", str(capture_dir(root, aux_layers, storage_label(d))), "--split", "all"]
        cap += ["--aux-layers", ",".join(map(str, aux_layers)), "--storage-dtype", d.storage_dtype]
        cap += ["--fp8-last-hidden"] if d.fp8_last_hidden else []
        cap += ["--fp8-bf16-layers", ",".join(map(str, d.fp8_bf16_layers))] if d.fp8_bf16_layers else []
        shards = [["--num-shards", str(world), "--shard-index", str(k)] for k in range(world)]
        steps += [cap + s for s in shards] if world > 1 else [cap]
    return [shlex.join(["draftsmith", "data", *step]) for step in steps]


def _visible(ready, seconds: float = 60.0) -> bool:
    """Whether `ready()` holds within `seconds`: what another rank wrote may show late on a shared
    filesystem (NFS caches directory entries for up to a minute), so poll before refusing."""
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def _not_shared(path: Path, rank: int) -> BadInputError:
    return BadInputError(
        "data.dir",
        f"{path} (rank {rank} does not see what the other ranks wrote there)",
        "a folder every process sees",
        "put data.dir (or $DRAFTSMITH_CACHE) on a filesystem every node shares",
    )


class TrainRows:
    """Rows of one split that can teach something (at least 3 tokens, a supervised token past the first
    two), as {input_ids [T], loss_mask [T], id}. Offline mode reads the same rows from the capture (hidden
    states in `dtype`; None: as stored, fp8 dequantized to float32)."""

    def __init__(self, paths: DataPaths, split: str, dtype: torch.dtype | None = None):
        import datasets

        self.split = split
        data = datasets.load_from_disk(str(paths.prepared))
        if split not in data:
            raise BadInputError("data", f"{paths.prepared} without a {split} split", "train and validation")
        part = data[split].with_format(None)
        self.ids = part["id"]  # column reads: iterating rows would decode every input_ids list too
        masks = part["loss_mask"]
        self.keep = [k for k, m in enumerate(masks) if len(m) >= 3 and any(m[2:])]
        self.lengths = [len(masks[k]) for k in self.keep]  # tokens per kept row (length bucketing)
        self.part = part
        self.capture = None
        if paths.capture is not None:
            from draftsmith.data_recipes.capture_reader import CaptureFolder

            # fp8 shards dequantize straight to `dtype` (the frozen target's, what the batch is built in)
            self.capture = CaptureFolder(paths.capture, field_name="data.mode", dtype=dtype)
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
    therefore needs only the step number to continue exactly where an uninterrupted run would be.

    Length bucketing (`bucket_batches` = N > 0, with each row's `lengths`): each epoch's permutation is cut
    into windows of N * B rows, each window sorted by length and split into N micro-batches whose order is
    shuffled (seeded). Rows of one micro-batch then have similar lengths, so padding (which the target and
    the head both compute over) shrinks, while every row is still read once per epoch in a seeded order:
    the megabatch sampling of Megatron-LM and fairseq's `batch_by_size`, made a pure function of the epoch."""

    def __init__(
        self,
        num_rows: int,
        seed: int,
        batch_size: int,
        accum: int,
        world: int,
        rank: int,
        lengths: list[int] | None = None,
        bucket_batches: int = 0,
    ):
        if num_rows < 1:
            raise BadInputError("data", "no trainable rows", "rows with supervised tokens")
        if bucket_batches and (lengths is None or len(lengths) != num_rows):
            raise ValueError("length bucketing needs one length per row")
        self.n, self.seed, self.batch, self.accum, self.world, self.rank = (
            num_rows,
            seed,
            batch_size,
            accum,
            world,
            rank,
        )
        self.lengths, self.bucket_batches = lengths, bucket_batches
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(self.n, generator=gen).tolist()
            if self.bucket_batches:
                order = self._bucketed(order, gen)
            self._perms = {epoch: order}
        return self._perms[epoch]

    def _bucketed(self, order: list[int], gen: torch.Generator) -> list[int]:
        """`order` with each window of bucket_batches * B rows sorted by length (ties keep the seeded
        order), cut into micro-batches of B, and those micro-batches shuffled within the window."""
        window, out = self.bucket_batches * self.batch, []
        for start in range(0, len(order), window):
            rows = sorted(order[start : start + window], key=lambda r: self.lengths[r])
            batches = [rows[i : i + self.batch] for i in range(0, len(rows), self.batch)]
            for b in torch.randperm(len(batches), generator=gen).tolist():
                out += batches[b]
        return out

    def rows(self, step: int, micro: int) -> list[int]:
        g = (step * self.accum + micro) * self.world + self.rank
        return [self._perm(j // self.n)[j % self.n] for j in range(g * self.batch, (g + 1) * self.batch)]

    def epoch(self, step: int) -> float:
        return (step + 1) * self.accum * self.world * self.batch / self.n
