"""Training checkpoints: atomic, rotated, resumable exactly (bitwise on CPU).

    output_dir/checkpoints/step-000100/   Accelerate's save_state (model, optimizer, scheduler, RNG of
                                          every process; DeepSpeed's sharded ZeRO state) + trainer_state.json

A checkpoint is written to `step-N.tmp` by every process, then the main process writes
`trainer_state.json` and renames the folder into place, so a crash mid-write never leaves a folder that
looks finished. Only the newest `keep` are kept. The data order is a pure function of (seed, step,
world size), so the step number is all a resume needs to continue the sample stream; the state records
the world size and data hash, and a resume with other values is refused unless explicitly allowed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zipfile
from dataclasses import asdict
from pathlib import Path

from draftsmith.runtime.core.artifacts import content_hash
from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.errors import BadInputError

log = logging.getLogger("draftsmith")
STATE_FILE = "trainer_state.json"


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def finished_checkpoints(output_dir: str | Path) -> list[Path]:
    """Finished checkpoint folders, oldest first (unfinished `.tmp-*` folders are ignored)."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step-*") if "." not in p.name and (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def save_checkpoint(accelerator, output_dir: str | Path, state: dict, keep: int) -> Path:
    """Every process calls this (DeepSpeed writes per-rank shards); returns the finished folder."""
    root = checkpoint_dir(output_dir)
    final = root / step_name(state["step"])
    # one temporary name every rank can compute; the main process clears leftovers of a killed run
    tmp = root / f"{final.name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        atomic_write_text(tmp / STATE_FILE, json.dumps(state, indent=1) + "\n")
        if final.exists():  # the same step saved again (a resumed run's last step): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in finished_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint: %s", final)
    accelerator.wait_for_everyone()
    return final


def read_state(folder: Path) -> dict:
    return json.loads((folder / STATE_FILE).read_text())


def damage(folder: Path) -> str | None:
    """Why a finished checkpoint cannot be resumed from (e.g. "optimizer.bin: truncated or corrupted
    (...)"), or None when every file in it is whole: trainer_state.json parses, each safetensors header
    covers its file, and each torch.save file (a zip: optimizer, scheduler, RNG states, ZeRO shards) has all
    its records with matching CRCs. It reads each file once and unpickles nothing."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder)
        try:
            if path.name == STATE_FILE:
                json.loads(path.read_text())
            elif path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt"):
                    pass
            elif path.suffix in (".bin", ".pt", ".pth", ".pkl"):
                with zipfile.ZipFile(path) as archive:
                    bad = archive.testzip()
                if bad is not None:
                    return f"{name}: corrupted (record {bad} fails its CRC check)"
        except (zipfile.BadZipFile, SafetensorError) as err:
            return f"{name}: truncated or corrupted ({str(err).splitlines()[0]})"
        except ValueError as err:  # json.JSONDecodeError, UnicodeDecodeError
            return f"{name}: not valid JSON ({err})"
        except OSError as err:
            return f"{name}: unreadable ({err})"
    return None


def newest_intact(output_dir: str | Path) -> Path | None:
    """The newest finished checkpoint whose files are whole; a damaged newer one is skipped with a warning
    that names it (checkpoint.keep > 1 keeps older ones for this). None without checkpoints; checkpoints
    that are all damaged are a `BadInputError` naming the folder and the way out."""
    damaged = []
    for folder in reversed(finished_checkpoints(output_dir)):
        why = damage(folder)
        if why is None:
            return folder
        log.warning("checkpoint %s is damaged (%s): skipped, resuming from an older one", folder, why)
        damaged.append(f"{folder.name} ({why})")
    if not damaged:
        return None
    raise BadInputError(
        "output_dir",
        str(checkpoint_dir(output_dir)),
        "a checkpoint to resume from",
        f"every one is damaged: {'; '.join(damaged)}. To train from step 0, delete that folder or set "
        "checkpoint.resume=never (or another output_dir)",
    )


def check_resume(state: dict, world_size: int, data_hash: str, cfg) -> None:
    """A resume must continue the same sample stream, unless the config explicitly allows a change."""
    if state["world_size"] != world_size and not cfg.train.allow_world_size_change:
        raise BadInputError(
            "resume",
            f"a checkpoint written by {state['world_size']} processes",
            f"{world_size} processes (or train.allow_world_size_change=true: the data order changes)",
        )
    if state["data_hash"] != data_hash and not cfg.train.allow_data_change:
        raise BadInputError(
            "resume",
            f"a checkpoint trained on data {state['data_hash'][:12]}",
            f"data {data_hash[:12]} (or train.allow_data_change=true)",
        )
    if state["config_hash"] != cfg_fingerprint(cfg):
        log.warning(
            "resume: the model/loop config changed since the checkpoint (LR schedule, head shape ...)"
        )


def cfg_fingerprint(cfg) -> str:
    """Hash of what shapes the head and the loss (not step counts, logging, paths or memory knobs)."""
    ignored = ("max_steps", "ttt_attention", "logit_chunk", "activation_checkpointing")  # same loss
    ignored += ("loader_workers", "loader_prefetch", "process_group_timeout_s")  # same batches
    loop = {k: v for k, v in asdict(cfg.train).items() if k not in ignored and not k.startswith("allow")}
    return content_hash({"head": asdict(cfg.head), "loop": loop, "target": cfg.target})
