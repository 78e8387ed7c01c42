"""Where each tensor of a safetensors checkpoint lives: the index (`model.safetensors.index.json`'s
weight_map) or the single `model.safetensors`, read without loading the rest.

    ckpt = Checkpoint.open(Path("path/to/model"))
    tensors = ckpt.read(["model.norm.weight", "lm_head.weight"])   # opens only the files that hold them

Used by the target adapter (a tensor-parallel rank reads whole tensors) and by `target_parts` (offline
training's embedding, norm and LM head).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import open_tensors
from draftsmith.runtime.core.errors import BadInputError, read_json

INDEX_FILE, SINGLE_FILE = "model.safetensors.index.json", "model.safetensors"


@dataclass(frozen=True)
class Checkpoint:
    """Where each tensor of a safetensors checkpoint lives: {HF tensor name: file name in `folder`}."""

    folder: Path
    weight_map: dict[str, str]
    source: str  # the file that told us (the index, or the single weights file)

    @classmethod
    def open(cls, folder: Path) -> Checkpoint:
        index = folder / INDEX_FILE
        if index.is_file():
            weight_map = read_json(index, "--target").get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise BadInputError("--target", str(index), "a safetensors index with a weight_map")
            absent = sorted({f for f in weight_map.values() if not (folder / f).is_file()})
            if absent:  # the whole target would not load either: refuse before reading anything
                raise BadInputError(
                    "--target",
                    f"{folder} without {', '.join(absent[:3])}",
                    f"every file {INDEX_FILE} names",
                    "the download or copy is incomplete",
                )
            return cls(folder, weight_map, INDEX_FILE)
        if (folder / SINGLE_FILE).is_file():
            with open_tensors(folder / SINGLE_FILE, "--target") as f:
                return cls(folder, dict.fromkeys(f.keys(), SINGLE_FILE), SINGLE_FILE)
        raise BadInputError("--target", str(folder), f"safetensors weights: {SINGLE_FILE} or {INDEX_FILE}")

    @property
    def files(self) -> list[str]:
        return sorted(set(self.weight_map.values()))

    def total_bytes(self) -> int:
        return sum((self.folder / f).stat().st_size for f in self.files)

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """These tensors as stored (on the CPU), opening only the files that hold them."""
        for name in names:
            if name not in self.weight_map:
                raise BadInputError(
                    "--target", f"{self.folder / self.source} without tensor {name}", f"a {name} entry"
                )
        out = {}
        for file in sorted({self.weight_map[n] for n in names}):
            with open_tensors(self.folder / file, "--target") as f:
                held = set(f.keys())
                for name in (n for n in names if self.weight_map[n] == file):
                    if name not in held:
                        raise BadInputError(
                            "--target",
                            f"{self.folder / file} without tensor {name}",
                            f"the tensors {self.source} places in {file}",
                        )
                    out[name] = f.get_tensor(name)
        return out
