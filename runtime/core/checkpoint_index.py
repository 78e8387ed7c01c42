"""Where each tensor of a safetensors checkpoint lives: the index (`model.safetensors.index.json`'s
weight_map) or the single `model.safetensors`, read without loading the rest.

    ckpt = Checkpoint.open(Path("path/to/model"))
    tensors = ckpt.read(["model.norm.weight", "lm_head.weight"])   # opens only the files that hold them

Used by the target adapter (a tensor-parallel rank reads whole tensors) and by `target_parts` (offline
training's embedding, norm and LM head). A block-scaled FP8 checkpoint (DeepSeek-V3/R1 as published: its
config.json's `quantization_config`; runtime/core/block_fp8.py) reads as float: `weight_map` lists its
weights, `scales` where each `NAME_scale_inv` lives, and `read` returns the weights dequantized (float32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import open_tensors
from draftsmith.runtime.core.block_fp8 import (
    SCALE_SUFFIX,
    BlockFp8,
    block_fp8_of,
    dequantize_read,
    split_scales,
)
from draftsmith.runtime.errors import BadInputError, read_json

INDEX_FILE, SINGLE_FILE = "model.safetensors.index.json", "model.safetensors"


@dataclass(frozen=True)
class Checkpoint:
    """Where each tensor of a safetensors checkpoint lives: {HF tensor name: file name in `folder`}."""

    folder: Path
    weight_map: dict[str, str]
    source: str  # the file that told us (the index, or the single weights file)
    # block-scaled FP8 (config.json's quantization_config): weight name -> the file of its `_scale_inv`
    scales: dict[str, str] = field(default_factory=dict)
    fp8: BlockFp8 | None = None

    @classmethod
    def open(cls, folder: Path) -> Checkpoint:
        found = cls._open(folder)
        config = folder / "config.json"
        fp8 = block_fp8_of(read_json(config, "--target"), str(config)) if config.is_file() else None
        if fp8 is None:
            return found
        weights, scales = split_scales(found.weight_map, str(folder / found.source))
        return cls(folder, weights, found.source, scales, fp8)

    @classmethod
    def _open(cls, folder: Path) -> Checkpoint:
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
        return sorted(set(self.weight_map.values()) | set(self.scales.values()))

    def total_bytes(self) -> int:
        return sum((self.folder / f).stat().st_size for f in self.files)

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """These tensors as stored (on the CPU), opening only the files that hold them; block-FP8 weights
        dequantized to float32 with their scales (an FP8 tensor without one is refused)."""
        for name in names:
            if name not in self.weight_map:
                raise BadInputError(
                    "--target", f"{self.folder / self.source} without tensor {name}", f"a {name} entry"
                )
        where = {n: self.weight_map[n] for n in names}
        where.update({n + SCALE_SUFFIX: self.scales[n] for n in names if n in self.scales})
        return dequantize_read(self._read_stored(where), names, self.fp8, str(self.folder))

    def _read_stored(self, where: dict[str, str]) -> dict[str, torch.Tensor]:
        """{name: file} -> the tensors as stored."""
        out = {}
        for file in sorted(set(where.values())):
            with open_tensors(self.folder / file, "--target") as f:
                held = set(f.keys())
                for name in (n for n in where if where[n] == file):
                    if name not in held:
                        raise BadInputError(
                            "--target",
                            f"{self.folder / file} without tensor {name}",
                            f"the tensors {self.source} places in {file}",
                        )
                    out[name] = f.get_tensor(name)
        return out
