"""Read a finished `draftsmith data capture` folder row by row (what offline training iterates over).

    folder = CaptureFolder("data/sg-hidden")
    folder.check_target(target)          # refuse another tokenizer / template / vocab
    row = folder[0]         # input_ids [T], loss_mask [T], aux_hidden [T, A*H], last_hidden [T, H]

The shard format is described in `draftsmith.data_recipes.capture`. A folder of the parts of a sharded
capture (OUT/part-K-of-N/) reads as one capture, rows in their original order; a missing part is refused
by name (draftsmith.data_recipes.parts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from draftsmith.data_recipes.common import check_same_target
from draftsmith.data_recipes.parts import require_whole
from draftsmith.runtime.errors import BadInputError

TOKEN_TENSORS = ("input_ids", "loss_mask", "aux_hidden", "last_hidden")


class CaptureFolder:
    """A finished capture, row by row: `len`, `folder[k]`, iteration. Slices are read memory-mapped.

    A row is {input_ids int32 [T], loss_mask int8 [T], aux_hidden [T, A*H], last_hidden [T, H]} in the
    stored dtypes, plus row_index (int), id and split (str)."""

    def __init__(self, folder: str | Path, field_name: str = "--capture"):
        from safetensors import safe_open

        self.folder = Path(folder)
        self.record = require_whole(self.folder, field_name, ("capture",))  # one folder, or its parts
        inputs = self.record["inputs"]
        self.aux_layers = tuple(inputs["aux_layers"])
        self.hidden_size = inputs["hidden_size"]
        self.storage_dtype = inputs["storage_dtype"]
        self._handles = []
        self._rows: list[tuple[int, int, int, int, str]] = []  # shard, start, end, row_index, id
        for k, name in enumerate(self.record["outputs"]["shards"]):
            path = self.folder / name
            if not path.is_file():
                raise BadInputError(field_name, f"{self.folder} without {name}", "a complete capture folder")
            handle = safe_open(str(path), framework="pt")
            self._handles.append(handle)
            offsets = handle.get_tensor("offsets").tolist()
            row_index = handle.get_tensor("row_index").tolist()
            ids = json.loads(handle.metadata()["ids"])
            for r, (index, row_id) in enumerate(zip(row_index, ids)):
                self._rows.append((k, offsets[r], offsets[r + 1], index, row_id))
        self._splits = self.record["outputs"].get("splits", {})

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
        handle = self._handles[shard]
        row = {name: handle.get_slice(name)[start:end] for name in TOKEN_TENSORS}
        row.update(row_index=index, id=row_id, split=self.split_of(index))
        return row

    def __iter__(self) -> Iterator[dict]:
        for k in range(len(self)):
            yield self[k]


def load_capture(folder: str | Path) -> Iterator[dict]:
    """Rows of a finished capture in order (see CaptureFolder)."""
    return iter(CaptureFolder(folder))
