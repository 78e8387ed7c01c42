"""Identity hashes, atomic tensor files (and readers that refuse damaged ones) and draft-vocabulary
checks shared by heads and data steps.

Pure helpers (torch, safetensors, json): `draftsmith.runtime` uses them to load and validate heads, and
`draftsmith.data_recipes` to record what data was made for.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from draftsmith.runtime.core.families import family_of
from draftsmith.runtime.errors import BadInputError, DraftsmithError


def content_hash(value) -> str:
    """sha256 of canonical JSON (sorted keys), 16 hex digits."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_hash(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    specials = {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return content_hash({"vocab": vocab, "specials": specials})


def template_hash(tokenizer) -> str:
    return content_hash({"chat_template": tokenizer.chat_template or ""})


def atomic_save_file(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """safetensors save_file to a temp name in the same folder, fsync, rename: never a half-written file."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; weights are meant to be shared and published
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _damaged(field: str, path: str | Path, err: Exception) -> BadInputError:
    return BadInputError(
        field, str(path), "a complete safetensors file", f"it is truncated or corrupted: {err}"
    )


def load_tensors(path: str | Path, field: str) -> dict[str, torch.Tensor]:
    """safetensors load_file; a truncated or corrupted file is a `BadInputError` naming `field`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise _damaged(field, path, err) from None


def open_tensors(path: str | Path, field: str):
    """safetensors safe_open (use it in a `with`); its header and size are checked as it opens, so a
    truncated or corrupted file is a `BadInputError` naming `field` before anything reads it."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt")
    except SafetensorError as err:
        raise _damaged(field, path, err) from None


def check_draft_vocab_size(vocab_size: int, draft_vocab_size: int) -> None:
    if not 0 < draft_vocab_size <= vocab_size:
        raise BadInputError(
            "--draft-vocab-size", draft_vocab_size, f"an integer in [1, {vocab_size}] (the target vocab)"
        )


# ---- the map -----------------------------------------------------------------------------------------


def validate_draft_vocab(
    d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, draft_vocab_size: int
) -> None:
    """Every invariant SGLang/vLLM rely on (docs/architecture.md, 5.7); errors name the field."""
    check_draft_vocab_size(vocab_size, draft_vocab_size)
    if not isinstance(d2t, torch.Tensor) or d2t.dtype != torch.int64:
        raise BadInputError("d2t", getattr(d2t, "dtype", type(d2t).__name__), "an int64 tensor (offsets)")
    if tuple(d2t.shape) != (draft_vocab_size,):
        raise BadInputError("d2t", f"shape {tuple(d2t.shape)}", f"[{draft_vocab_size}] (draft_vocab_size)")
    if not isinstance(t2d, torch.Tensor) or t2d.dtype != torch.bool:
        raise BadInputError("t2d", getattr(t2d, "dtype", type(t2d).__name__), "a bool tensor")
    if tuple(t2d.shape) != (vocab_size,):
        raise BadInputError("t2d", f"shape {tuple(t2d.shape)}", f"[{vocab_size}] (the target vocab size)")
    ids = d2t.cpu() + torch.arange(draft_vocab_size, dtype=torch.int64)
    if ids.min() < 0 or ids.max() >= vocab_size:
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise BadInputError(
            "d2t", f"a target id {bad} (d + d2t[d])", f"ids in [0, {vocab_size}); d2t holds offsets"
        )
    if ids.unique().numel() != draft_vocab_size:
        raise BadInputError(
            "d2t", f"{draft_vocab_size - ids.unique().numel()} duplicated target ids", "unique target ids"
        )
    total = int(t2d.sum())
    if total != draft_vocab_size:
        raise BadInputError(
            "t2d", f"{total} True entries", f"t2d.sum() == draft_vocab_size {draft_vocab_size}"
        )
    if not torch.equal(torch.nonzero(t2d.cpu()).flatten(), ids):
        raise BadInputError(
            "d2t/t2d", "nonzero(t2d) != d2t + arange", "the same ids, ascending (d2t sorted by target id)"
        )


def pid_alive(pid: int) -> bool:
    """Whether a process exists (temporary folders named after a dead process are stale)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- head files ----------------------------------------------------------------------------------------


def save_head_files(head, folder: str | Path, head_type: str) -> None:
    """config.json (the head's dataclass config) + model.safetensors, each written atomically; the
    rotary cache is derived from the config and never stored."""
    from dataclasses import asdict

    from draftsmith.runtime.core.config import atomic_write_text

    folder = Path(folder)
    tensors = {
        k: v.detach().contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")
    }
    atomic_save_file(folder / "model.safetensors", tensors, {"format": "pt", "head_type": head_type})
    atomic_write_text(folder / "config.json", json.dumps(asdict(head.config), indent=1) + "\n")


def check_tensors(expected: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], kind: str) -> None:
    """Strict: every expected tensor present with its exact shape, nothing extra, floats all finite."""
    for name in sorted(set(expected) | set(tensors)):
        if name not in tensors:
            raise BadInputError(f"tensor {name}", "missing", f"shape {list(expected[name].shape)}")
        if name not in expected:
            raise BadInputError(f"tensor {name}", "unexpected", f"only {len(expected)} known {kind} tensors")
        if tensors[name].shape != expected[name].shape:
            raise BadInputError(
                f"tensor {name}", list(tensors[name].shape), f"shape {list(expected[name].shape)}"
            )
        if tensors[name].is_floating_point() and not torch.isfinite(tensors[name]).all():
            raise BadInputError(f"tensor {name}", "non-finite values", "finite weights")


def weights_hash(model) -> str:
    """A cheap identity of a causal LM's weights: blake2b over its final norm, the first and last decoder
    layers' query projections and the last layer's MLP down projection (its router where that layer is
    MoE: families.py `hash_tensors`), rounded to bfloat16 (so a float32 and a bfloat16 load of one
    checkpoint agree). Two fine-tunes of one base, or a co-trained target and its original, differ."""
    source = getattr(model, "source_weights_hash", None)  # a quantized target's (runtime/core/quantize.py)
    if source is not None:
        return source
    pairs = family_of(model.config).hash_tensors(model.config)
    return _hash_parts([model.get_parameter(module) for module, _ in pairs])


def weights_hash_names(num_layers: int, config=None) -> list[str]:
    """The checkpoint tensors (HF names) `weights_hash` reads, in its order: those of the family of
    `config` (the target's transformers config), or without one a dense Llama-family target's."""
    if config is not None:
        return [checkpoint for _, checkpoint in family_of(config).hash_tensors(config)]
    last = num_layers - 1
    return [
        "model.norm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        f"model.layers.{last}.self_attn.q_proj.weight",
        f"model.layers.{last}.mlp.down_proj.weight",
    ]


def weights_hash_of_tensors(tensors: dict[str, torch.Tensor], num_layers: int, config=None) -> str:
    """`weights_hash` from a checkpoint's tensors (HF names), without building the model."""
    return _hash_parts([tensors[n] for n in weights_hash_names(num_layers, config)])


def _hash_parts(parts: list[torch.Tensor]) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for t in parts:
        digest.update(t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return digest.hexdigest()


def parameter_summary(tensors: dict[str, torch.Tensor]) -> str:
    """The floating-point tensors' size and dtypes, e.g. "12.6M parameters, float32" (a model card's line)."""
    floats = [t for t in tensors.values() if t.is_floating_point()]
    count = sum(t.numel() for t in floats)
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in floats})
    return f"{count / 1e6:.1f}M parameters, {'/'.join(dtypes)}"


def check_round_trip(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor], what: str) -> None:
    """Every tensor back exactly (torch.equal) under the same name: a layout lost nothing."""
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or extra:
        raise DraftsmithError(f"{what}: round trip lost {missing[:5]} / added {extra[:5]}")
    for name in expected:
        if not torch.equal(expected[name].cpu(), got[name].cpu()):
            raise DraftsmithError(f"{what}: tensor {name} changed in the round trip")
