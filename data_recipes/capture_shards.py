"""The shard files of a capture: `shard-NNNNN.safetensors`, each a run of rows with their offsets.

    writer = ShardWriter(out, index, first_row, static_meta, Storage.of("bfloat16", num_aux, hidden))
    writer.add(row_index, row_id, input_ids, loss_mask, {"aux_hidden": ..., "last_hidden": ...})
    meta = writer.flush(end_row)                 # written atomically; the metadata names its rows
    kept = scan_shards(out, inputs_hash)         # the complete shards of this capture, for a resume

data_recipes/capture.py writes them; data_recipes/capture_reader.py reads them; how the hidden states
are stored (a dtype, or fp8 values plus `NAME_scale` tensors) is data_recipes/capture_storage.py's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from draftsmith.data_recipes.capture_storage import Storage
from draftsmith.data_recipes.common import atomic_save_file
from draftsmith.runtime.errors import BadInputError, DraftsmithError

log = logging.getLogger("draftsmith.data_recipes.capture")

CAPTURE_FORMAT = "draftsmith-capture"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def _shard_meta(path: Path) -> dict | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except Exception:  # truncated or not safetensors: not one of ours, or not complete
        return None


def scan_shards(out: Path, inputs_hash: str, first_row: int = 0) -> list[dict]:
    """Complete shards of this capture (its rows start at `first_row`), in order; our shards made with
    other inputs are removed."""
    for tmp in out.glob(".shard-*.tmp"):  # a write killed before its rename
        tmp.unlink()
    files = sorted(out.glob("shard-*.safetensors"))
    metas = [_shard_meta(path) for path in files]
    for path, meta in zip(files, metas):
        if meta is None or meta.get("format") != CAPTURE_FORMAT:
            raise BadInputError(
                "--out",
                f"{out} (holds {path.name}, not written by draftsmith data capture)",
                "a capture folder",
            )
    kept: list[dict] = []
    next_row = first_row
    for k, (path, meta) in enumerate(zip(files, metas)):
        ok = (
            meta.get("inputs_hash") == inputs_hash
            and path.name == shard_name(k)
            and int(meta["index"]) == k
            and int(meta["first_row"]) == next_row
        )
        if not ok:
            stale = files[k:]
            log.info("capture: removing %d shard(s) from a capture with other inputs", len(stale))
            for p in stale:
                p.unlink()
            break
        kept.append(meta)
        next_row = int(meta["end_row"])
    return kept


class ShardWriter:
    def __init__(self, out: Path, index: int, first_row: int, static_meta: dict, storage: Storage):
        self.out, self.index, self.first_row = out, index, first_row
        self.static_meta, self.storage = static_meta, storage
        self._reset()

    def _reset(self) -> None:
        names = ["input_ids", "loss_mask", *self.storage.tensor_names()]
        self.parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
        self.lengths: list[int] = []
        self.row_index: list[int] = []
        self.ids: list[str] = []

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def add(self, row_index: int, row_id: str, input_ids, loss_mask, tensors: dict) -> None:
        stored = {}
        for name in ("aux_hidden", "last_hidden"):
            try:
                stored |= self.storage.encode(name, tensors[name])
            except ValueError as err:  # non-finite: stop here, naming the row
                raise DraftsmithError(f"capture: row {row_index} ({row_id}): {err}") from None
        self.parts["input_ids"].append(torch.tensor(input_ids, dtype=torch.int32))
        self.parts["loss_mask"].append(torch.tensor(loss_mask, dtype=torch.int8))
        for name, tensor in stored.items():
            self.parts[name].append(tensor)
        self.lengths.append(len(input_ids))
        self.row_index.append(row_index)
        self.ids.append(row_id)

    def flush(self, end_row: int) -> dict:
        tensors = {name: torch.cat(parts).contiguous() for name, parts in self.parts.items()}
        offsets = torch.zeros(len(self.lengths) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor(self.lengths, dtype=torch.int64).cumsum(0)
        tensors["offsets"] = offsets
        tensors["row_index"] = torch.tensor(self.row_index, dtype=torch.int64)
        meta = {
            **self.static_meta,
            "index": str(self.index),
            "first_row": str(self.first_row),
            "end_row": str(end_row),
            "rows": str(len(self.lengths)),
            "tokens": str(self.tokens),
            "ids": json.dumps(self.ids),
        }
        atomic_save_file(self.out / shard_name(self.index), tensors, meta)
        self.index, self.first_row = self.index + 1, end_row
        self._reset()
        return meta
