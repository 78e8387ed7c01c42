"""Read a finished `draftsmith data capture` folder row by row (what offline training iterates over).

    folder = CaptureFolder("data/sg-hidden", dtype=torch.bfloat16)
    folder.check_target(target)          # refuse another tokenizer / template / vocab
    row = folder[0]         # input_ids [T], loss_mask [T], aux_hidden [T, A*H], last_hidden [T, H]

The shard format is described in `draftsmith.data_recipes.capture`. A folder of the parts of a sharded
capture (OUT/part-K-of-N/) reads as one capture, rows in their original order; a missing part is refused
by name (draftsmith.data_recipes.parts). fp8 shards are dequantized on read (data_recipes/fp8.py), to
`dtype` (float32 when None); other shards come back as stored, or cast to `dtype`.

Streamed reads: the row index (offsets, ids) is read once, each shard closed after; a row's tensors are
then memory-mapped slices of its shard, so a capture far larger than RAM (or on a shared filesystem)
reads only the pages of the rows asked for. At most `max_open` shards are open at once (least recently
used closed first: a 6.7 TB capture has thousands of shards, past a default 1024-file limit), and the
handles belong to one process: a DataLoader worker (fork or spawn) opens its own on first use.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import torch

from draftsmith.data_recipes.capture_storage import check_storage, decode, kept_positions
from draftsmith.data_recipes.common import check_same_target
from draftsmith.data_recipes.parts import require_whole
from draftsmith.runtime.errors import BadInputError

TOKEN_TENSORS = ("input_ids", "loss_mask", "aux_hidden", "last_hidden")
SHARD_KEYS = (
    "storage_dtype",
    "last_hidden_dtype",
    "fp8_bf16_aux",
    "hidden_size",
    "aux_layers",
)  # all the same


class CaptureFolder:
    """A finished capture, row by row: `len`, `folder[k]`, iteration. Slices are read memory-mapped.

    A row is {input_ids int32 [T], loss_mask int8 [T], aux_hidden [T, A*H], last_hidden [T, H]} (stored
    dtype, or `dtype`; fp8 dequantized), plus row_index (int), id and split (str)."""

    def __init__(
        self,
        folder: str | Path,
        field_name: str = "--capture",
        dtype: torch.dtype | None = None,
        max_open: int = 64,
    ):
        self.folder, self.field_name, self.dtype, self.max_open = Path(folder), field_name, dtype, max_open
        self.record = require_whole(self.folder, field_name, ("capture",))  # one folder, or its parts
        inputs = self.record["inputs"]
        self.aux_layers = tuple(inputs["aux_layers"])
        self.hidden_size = inputs["hidden_size"]
        self.storage_dtype = inputs["storage_dtype"]
        self.last_dtype = inputs.get("last_hidden_dtype", self.storage_dtype)
        bf16_layers = inputs.get("fp8_bf16_layers", [])
        self.kept = kept_positions(self.aux_layers, bf16_layers)  # aux positions stored in bfloat16
        try:
            check_storage(self.storage_dtype, self.last_dtype == "fp8", bf16_layers, self.aux_layers)
        except BadInputError as err:  # e.g. an fp8 capture read by a torch without float8
            raise BadInputError(
                field_name, f"{self.folder} ({err.got!r} capture)", err.expected, err.hint
            ) from None
        self._paths = [self.folder / name for name in self.record["outputs"]["shards"]]
        self._rows: list[tuple[int, int, int, int, str]] = []  # shard, start, end, row_index, id
        first_meta = None
        for k, path in enumerate(self._paths):
            meta, offsets, row_index = self._index(path)
            first_meta = first_meta or meta
            self._check_shard(path, meta, first_meta)
            for r, (index, row_id) in enumerate(zip(row_index, json.loads(meta["ids"]))):
                self._rows.append((k, offsets[r], offsets[r + 1], index, row_id))
        self._splits = self.record["outputs"].get("splits", {})
        self._handles: OrderedDict[int, object] = OrderedDict()
        self._pid = os.getpid()

    def _index(self, path: Path) -> tuple[dict, list[int], list[int]]:
        from safetensors import safe_open

        if not path.is_file():
            raise BadInputError(
                self.field_name, f"{self.folder} without {path.name}", "a complete capture folder"
            )
        with safe_open(str(path), framework="pt") as handle:  # closed after: only the index stays
            meta = handle.metadata() or {}
            return meta, handle.get_tensor("offsets").tolist(), handle.get_tensor("row_index").tolist()

    def _check_shard(self, path: Path, meta: dict, first: dict) -> None:
        """Refuse a shard stored otherwise than the record says, or than the first shard (mixed dtypes)."""
        expected = {"storage_dtype": self.storage_dtype, "hidden_size": str(self.hidden_size)}
        if self.storage_dtype == "fp8":
            expected["last_hidden_dtype"] = self.last_dtype
        if self.kept:
            expected["fp8_bf16_aux"] = json.dumps(list(self.kept))
        for key in SHARD_KEYS:
            want = expected.get(key, first.get(key))
            if meta.get(key) != want:
                where = path.relative_to(self.folder)
                raise BadInputError(
                    self.field_name,
                    f"{self.folder} with {where} stored with {key} {meta.get(key)!r}",
                    f"every shard with {key} {want!r} (one capture's shards)",
                    "capture the folder again, or keep the shards of one capture in it",
                )

    def _handle(self, shard: int):
        """This process's open handle of shard `shard` (a forked worker drops its parent's)."""
        from safetensors import safe_open

        if os.getpid() != self._pid:
            self._handles, self._pid = OrderedDict(), os.getpid()
        handle = self._handles.pop(shard, None)
        if handle is None:
            handle = safe_open(str(self._paths[shard]), framework="pt")
            while len(self._handles) >= self.max_open:
                self._handles.popitem(last=False)  # least recently used: its mmap goes with it
        self._handles[shard] = handle  # most recently used last
        return handle

    def __getstate__(self) -> dict:  # a spawned worker opens its own handles
        return {**self.__dict__, "_handles": OrderedDict()}

    def check_target(self, target, field_name: str = "--target") -> None:
        """Refuse a target whose tokenizer/template/vocab differs from the one captured."""
        check_same_target(self.record, target, field_name)

    def __len__(self) -> int:
        return len(self._rows)

    def row_ids(self) -> list[str]:
        """The id of every stored row, in order (rows without supervised tokens were never stored)."""
        return [row[4] for row in self._rows]

    def split_of(self, row_index: int) -> str:
        for name, (lo, hi) in self._splits.items():
            if lo <= row_index < hi:
                return name
        return self.record["inputs"]["split"]

    def __getitem__(self, k: int) -> dict:
        shard, start, end, index, row_id = self._rows[k]
        handle = self._handle(shard)
        row = {name: handle.get_slice(name)[start:end] for name in ("input_ids", "loss_mask")}
        row["aux_hidden"] = decode(
            handle, "aux_hidden", start, end, self.storage_dtype, self.dtype, self.kept
        )
        row["last_hidden"] = decode(handle, "last_hidden", start, end, self.last_dtype, self.dtype)
        row.update(row_index=index, id=row_id, split=self.split_of(index))
        return row

    def __iter__(self) -> Iterator[dict]:
        for k in range(len(self)):
            yield self[k]


def load_capture(folder: str | Path, dtype: torch.dtype | None = None) -> Iterator[dict]:
    """Rows of a finished capture in order (see CaptureFolder)."""
    return iter(CaptureFolder(folder, dtype=dtype))
