"""The MTP export layouts written one shard at a time: what `draftsmith export RUN --format mtp|mtp-mimo`
runs (runtime/heads/mtp_kind.py) once the target's weights hash is checked and config.json is written.

    draftsmith export runs/mtp-smollm2-135m --format mtp --out exports/mtp-deepseek
    write_shards(config, head.config, ours, target_dir, out, mimo=False)   # the library call

The target is read through its safetensors index (runtime/core/checkpoint_index.py; a single
`model.safetensors` is one shard) and written back shard by shard under the layout's names
(runtime/heads/mtp_layout.py), the modules in shards of their own, one a module:

    model-00001-of-0000N.safetensors ... target shard 1 .. n, in the target's order
    model-0000{n+1}-of-0000N.safetensors ... module 0 .. M-1 (DeepSeek: layer L + m with its embedding and
                                             LM head copies; MiMo: model.mtp_layers.0)
    model.safetensors.index.json          HF's schema, written last

Each shard is written atomically, read back and compared with what was meant to be written before the next
is read; the modules are also mapped back to ours (`from_deepseek` / `from_mimo`). Peak memory is about one
target shard plus the modules, so a target far larger than the host's memory (DeepSeek-V3, 671B) exports;
tests/runtime/test_mtp_stream.py measures it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import atomic_save_file, check_round_trip, load_tensors
from draftsmith.runtime.core.checkpoint_index import INDEX_FILE, Checkpoint
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.runtime.heads.mtp_config import MtpConfig
from draftsmith.runtime.heads.mtp_layout import (
    deepseek_module,
    from_deepseek,
    from_mimo,
    mimo_module,
    mimo_target,
    module_index,
)

log = logging.getLogger(__name__)
SHARD_NAME = "model-{index:05d}-of-{count:05d}.safetensors"  # HF's names, counted from 1
EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


class ShardWriter:
    """`count` shards, each written atomically and read back, then the index: a folder without the index is
    an export that did not finish, whatever shards it holds."""

    def __init__(self, out: Path, count: int, what: str):
        self.out, self.count, self.what = out, count, what
        self.weight_map: dict[str, str] = {}  # tensor name -> shard file
        self.total_size = 0  # bytes of tensor data, as HF's index counts them
        self.done: set[int] = set()

    def file(self, index: int) -> str:
        return SHARD_NAME.format(index=index + 1, count=self.count)

    def write(self, index: int, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Shard `index` (from 0) -> the tensors read back from it, equal to `tensors` (checked)."""
        file = self.file(index)
        if index in self.done or not 0 <= index < self.count:
            raise DraftsmithError(f"{self.what}: shard {index + 1} of {self.count} twice or out of range")
        clash = sorted(set(tensors) & set(self.weight_map))
        if clash:  # an index maps each name to one file
            raise DraftsmithError(f"{self.what}: {file} repeats tensors already written: {clash[:3]}")
        tensors = _unshared(tensors)
        atomic_save_file(self.out / file, tensors, {"format": "pt"})
        back = load_tensors(self.out / file, "--out")
        check_round_trip(tensors, back, f"{self.what} ({file})")
        self.weight_map.update(dict.fromkeys(tensors, file))
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        self.total_size += size
        self.done.add(index)
        log.info("export: %s written and read back (%d tensors, %.1f MB)", file, len(tensors), size / 1e6)
        return back

    def finish(self) -> None:
        """The index, once every shard is in place (atomically, like the shards)."""
        from draftsmith.runtime.core.config import atomic_write_text

        if len(self.done) != self.count:
            missing = sorted(set(range(self.count)) - self.done)
            raise DraftsmithError(f"{self.what}: shards {[self.file(i) for i in missing[:3]]} never written")
        index = {
            "metadata": {"total_size": self.total_size},
            "weight_map": dict(sorted(self.weight_map.items())),
        }
        atomic_write_text(self.out / INDEX_FILE, json.dumps(index, indent=2) + "\n")
        os.chmod(self.out / INDEX_FILE, 0o644)  # mkstemp made it private; an export is meant to be shared


def write_shards(
    config: dict,  # the layout's config.json (mtp_layout.deepseek_config / mimo_config)
    mtp_config: MtpConfig,
    ours: dict[str, torch.Tensor],  # the modules' tensors, layers.{m}.*
    target_dir: Path,
    out: Path,
    mimo: bool,
) -> None:
    """The target's shards and the modules' in `out`, each checked, then the index."""
    fmt = "mtp-mimo" if mimo else "mtp"
    ckpt = Checkpoint.open(target_dir)
    if getattr(ckpt, "fp8", None) is not None:  # a Checkpoint that dequantizes block-FP8 weights as it reads
        raise BadInputError(
            "--target",
            str(target_dir),
            "a target stored unquantized (bf16/fp16/fp32)",
            "the MTP export passes the target through, and this reader would write its FP8 weights "
            "dequantized, without their scales",
        )
    shards = _target_shards(ckpt, mtp_config.num_target_layers, mimo)
    writer = ShardWriter(out, len(shards) + mtp_config.num_modules, f"{fmt} export")
    # The modules first, though numbered last: DeepSeek's layout copies the target's embedding and LM head
    # into each module, and those are dropped here before the target streams.
    _write_modules(writer, len(shards), config, mtp_config, ours, ckpt, mimo)
    for index, names in enumerate(shards):
        tensors = ckpt.read(names)  # one shard of the target, nothing else of it in memory
        writer.write(index, mimo_target(tensors, ckpt.weight_map) if mimo else tensors)
        del tensors  # before the next shard is read
    writer.finish()


def _write_modules(
    writer: ShardWriter,
    first: int,
    config: dict,
    mtp_config: MtpConfig,
    ours: dict[str, torch.Tensor],
    ckpt: Checkpoint,
    mimo: bool,
) -> None:
    """One shard a module, mapped back to ours with the layout's inverse (as a loader reads it)."""
    if mimo:
        back = writer.write(first, mimo_module(ours, config["hidden_size"]))
        check_round_trip(ours, from_mimo(config, back)[1], f"{writer.what} (module 0)")
        return
    shared = ckpt.read([EMBED, LM_HEAD] if LM_HEAD in ckpt.weight_map else [EMBED])
    embed, head = shared[EMBED], shared.get(LM_HEAD, shared[EMBED])  # [V, H] each; tied: one tensor
    for m in range(mtp_config.num_modules):
        back = writer.write(first + m, deepseek_module(mtp_config, ours, m, embed, head))
        # from_deepseek checks the copies against the target's own embedding and LM head
        _, back_ours, _ = from_deepseek(config, {**back, **shared})
        want = {k: v for k, v in ours.items() if k.startswith(f"layers.{m}.")}
        check_round_trip(want, back_ours, f"{writer.what} (module {m})")


def _target_shards(ckpt: Checkpoint, layers: int, mimo: bool) -> list[list[str]]:
    """The tensor names of each target shard, in the target's order. A target that ships MTP layers of its own
    (DeepSeek-V3's layer 61) has them where the modules go: they are left out, the modules replace them."""

    def modules_place(name: str) -> bool:
        if mimo:
            return name.startswith("model.mtp_layers.")
        return module_index(name, layers) is not None

    left_out = sorted(n for n in ckpt.weight_map if modules_place(n))
    if left_out:
        log.warning(
            "export: the target's own %d tensors where the modules go (%s, ...) are left out; "
            "the exported modules take their place",
            len(left_out),
            left_out[0],
        )
    names: dict[str, list[str]] = {}
    for name, file in ckpt.weight_map.items():
        if not modules_place(name):
            names.setdefault(file, []).append(name)
    return [sorted(names[file]) for file in ckpt.files if file in names]


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous, and a copy of any tensor whose storage another one already uses (a tied LM head, the
    embedding twice in a module): safetensors refuses shared storage in one file."""
    seen: set[int] = set()
    out = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen and tensor.numel():
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out
