"""Medusa heads in vLLM's `medusa` layout (export and import) and FasterDecoding's (import).

    config, tensors = to_vllm(heads, target)          # write_vllm(heads, target, folder) writes them
    heads = load_medusa(folder, target)               # ours, vLLM's or FasterDecoding's, detected

vLLM (read at vllm-project/vllm@09cddad8: vllm/model_executor/models/medusa.py, and @4bb77b32:
vllm/transformers_utils/configs/medusa.py):
  - config.json: `model_type: medusa`, `architectures: ["MedusaModel"]`, `hidden_size`, `vocab_size`,
    `num_heads` (default 5), `num_hidden_layers` (default 1), `truncated_vocab_size` (default
    vocab_size), `max_paths` (64) and `topk` (10) (unused by its chain proposer); read with getattr:
    `medusa_fc_bias` (default False), `original_lm_head` (default False), `logit_scale` (default 1.0).
    MedusaConfig.from_pretrained renames every top-level key containing "num" and "heads" to num_heads
    and "num" and "layers" to num_hidden_layers, so no other top-level key may contain them (our
    provenance block is nested under one key for that reason).
  - tensors: `blocks.{k}.layers.{j}.weight` (+ `.bias` when medusa_fc_bias), then either
    `lm_heads.{k}.weight` per head or, with original_lm_head, one `lm_head.weight` (a checkpoint's
    `lm_heads.0.weight` is remapped to it); a `medusa_heads.` prefix is stripped. vLLM's Medusa reads its
    LM head from this checkpoint, never from the target, so a shared head is written as a copy of the
    target's. With truncated_vocab_size < vocab_size it needs `token_map` (the target id of each draft
    id) and slices an LM head with more rows by it; logits are scattered to the target's ids, -inf
    elsewhere, which is exactly our `d2t` reduced vocabulary, so every vocabulary option is loadable.
  - the input is the target's hidden state after its final norm (what vLLM's Llama returns), as ours.
FasterDecoding (FasterDecoding/Medusa@60eeab92 medusa/model/medusa_model.py, @fc0a6c7a
medusa_model_new.py): config `medusa_num_heads`, `medusa_num_layers`; `medusa_lm_head.safetensors` (or
`.pt`) holding `medusa_head`'s state dict: `[medusa_head.]{k}.{j}.linear.{weight,bias}` for the blocks
and `{k}.{L}.weight` for each head's own LM head (ResBlock has a bias; zero-init weight).
Tests: tests/runtime/test_medusa_layout.py.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import atomic_save_file, load_tensors
from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.head_folder import CONFIG_FILE
from draftsmith.runtime.heads.medusa import (
    MedusaConfig,
    MedusaHeads,
    build_heads,
    check_matches_target,
    config_from_dict,
)

log = logging.getLogger(__name__)
PROVENANCE_KEY = "draftsmith_medusa"  # our MedusaConfig, so the identity checks survive the round trip
VLLM_DEFAULTS = {"max_paths": 64, "topk": 10}  # MedusaConfig's, written for readers that expect them
FD_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


# ---- vLLM: export -------------------------------------------------------------------------------------
def to_vllm(heads: MedusaHeads, target) -> tuple[dict, dict[str, torch.Tensor]]:
    """-> (config.json, tensors) in vLLM's layout."""
    cfg = heads.config
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "num_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "truncated_vocab_size": cfg.out_vocab,
        "medusa_fc_bias": cfg.fc_bias,  # vLLM's default is False: always explicit
        "original_lm_head": cfg.original_lm_head,
        **VLLM_DEFAULTS,
        PROVENANCE_KEY: asdict(cfg),
    }
    tensors = {k: v for k, v in heads.state_dict().items() if k.startswith(("blocks.", "lm_heads."))}
    ids = heads.draft_ids().cpu()
    if cfg.original_lm_head:  # vLLM loads the shared head from the draft checkpoint: the target's rows
        tensors["lm_head.weight"] = target.model.lm_head.weight.detach().cpu()[ids]
    if heads.reduced:
        tensors["token_map"] = ids.clone()
        log.warning(
            "medusa export: a reduced vocabulary (%d of %d ids) is written as vLLM's token_map, which vLLM "
            "0.32's loader cannot load (load_weights makes token_map a Parameter it never reports loaded: "
            "'Following weights were not initialized from checkpoint: {token_map}'); heads trained with "
            "head.reduce_vocab=false load (scripts/medusa_full_vocab.py makes a full-vocabulary copy of "
            "heads that share the target's LM head)",
            cfg.out_vocab,
            cfg.vocab_size,
        )
    return config, {k: v.detach().cpu().contiguous() for k, v in tensors.items()}


def write_vllm(heads: MedusaHeads, target, folder: str | Path) -> Path:
    """config.json + model.safetensors that `vllm serve TARGET --speculative-config
    '{"method": "medusa", "model": FOLDER, "num_speculative_tokens": K}'` loads."""
    from draftsmith.runtime.core.config import atomic_write_text

    folder = Path(folder)
    config, tensors = to_vllm(heads, target)
    atomic_save_file(folder / "model.safetensors", tensors, {"format": "pt"})
    atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=1) + "\n")
    return folder


# ---- vLLM: import -------------------------------------------------------------------------------------
def vllm_config_keys(raw: dict) -> dict:
    """vLLM MedusaConfig.from_pretrained's renaming of top-level keys (num*heads, num*layers)."""
    out = dict(raw)
    for key in list(out):
        if "num" in key and "heads" in key:
            out["num_heads"] = out.pop(key)
        elif "num" in key and "layers" in key:
            out["num_hidden_layers"] = out.pop(key)
    return out


def from_vllm(raw: dict, tensors: dict[str, torch.Tensor], target) -> MedusaHeads:
    """vLLM-layout config and tensors -> our heads, checked against `target`. With our provenance block
    the original identity (tokenizer, weights hash) is checked; without it (a foreign export) the sizes
    are, and a shared LM head must equal the target's own rows."""
    keys = vllm_config_keys(raw)
    tensors = {k.replace("medusa_heads.", ""): v for k, v in tensors.items()}
    vocab = keys.get("vocab_size", 32001)
    truncated = keys.get("truncated_vocab_size") or vocab
    shared = bool(keys.get("original_lm_head", False))
    if shared and "lm_head.weight" not in tensors and "lm_heads.0.weight" in tensors:
        tensors["lm_head.weight"] = tensors.pop("lm_heads.0.weight")  # vLLM's remapping
    if keys.get("logit_scale", 1.0) != 1.0:
        raise BadInputError(
            "logit_scale", keys["logit_scale"], "1.0 (draftsmith's heads do not scale logits)"
        )
    options = dict(
        num_heads=keys.get("num_heads", 5),
        num_layers=keys.get("num_hidden_layers", 1),
        original_lm_head=shared,
        fc_bias=bool(keys.get("medusa_fc_bias", False)),
        draft_vocab_size=None if truncated == vocab else truncated,
    )
    if PROVENANCE_KEY in raw:
        config = config_from_dict(raw[PROVENANCE_KEY], PROVENANCE_KEY)
        mismatch = {k: v for k, v in options.items() if getattr(config, k) != v}
        if mismatch or (config.hidden_size, config.vocab_size) != (keys.get("hidden_size"), vocab):
            raise BadInputError(PROVENANCE_KEY, sorted(mismatch), "the same values as the vLLM keys")
        check_matches_target(config, target, "the target this export was made for")  # before the tensors
    else:
        check_sizes(keys.get("hidden_size"), vocab, target)
        config = MedusaConfig.for_target(target, **options)
    ids = _token_map(tensors.pop("token_map", None), truncated, vocab)
    ours = {k: v for k, v in tensors.items() if k.startswith(("blocks.", "lm_heads."))}
    ours["d2t"] = ids - torch.arange(len(ids))
    ours["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
    if shared:
        _check_shared_head(tensors.get("lm_head.weight"), ids, target)
    else:
        ours = {k: (v[ids] if k.startswith("lm_heads.") and v.shape[0] == vocab > truncated else v)
                for k, v in ours.items()}  # fmt: skip
    extra = sorted(set(tensors) - set(ours) - {"lm_head.weight"})
    if extra:
        raise BadInputError(
            "medusa tensors", extra[:6], "only blocks.*, lm_heads.*, lm_head.weight, token_map"
        )
    return build_heads(config, ours, target, "a Medusa export made for this target")


def _token_map(token_map, truncated: int, vocab: int) -> torch.Tensor:
    """[Vd] target ids of the draft ids, ascending (our d2t needs them sorted; vLLM does not)."""
    if truncated == vocab:
        return torch.arange(vocab)
    if token_map is None:
        raise BadInputError(
            "token_map", "missing", f"a tensor of {truncated} target ids (truncated_vocab_size)"
        )
    ids = token_map.long().flatten()
    if len(ids) != truncated or ids.unique().numel() != truncated or ids.min() < 0 or ids.max() >= vocab:
        raise BadInputError("token_map", f"{len(ids)} ids", f"{truncated} distinct ids in [0, {vocab})")
    if not bool((ids[1:] > ids[:-1]).all()):
        raise BadInputError(
            "token_map", "ids out of order", "ascending target ids (as draftsmith writes them)"
        )
    return ids


def _check_shared_head(weight, ids: torch.Tensor, target) -> None:
    """A shared (original) LM head must be the target's own, rows sliced by the token map or not."""
    own = target.model.lm_head.weight.detach().cpu().float()
    if weight is None:
        raise BadInputError("lm_head.weight", "missing", "the target's LM head (original_lm_head: true)")
    weight = weight.float()
    expected = own if weight.shape[0] == own.shape[0] else own[ids]
    if weight.shape != expected.shape or not torch.allclose(weight, expected, rtol=1e-2, atol=1e-3):
        raise BadInputError(
            "lm_head.weight", f"shape {list(weight.shape)}", f"the LM head of the target {target.name}"
        )


def check_sizes(hidden, vocab, target) -> None:
    for name, got, expected in (
        ("hidden_size", hidden, target.hidden_size),
        ("vocab_size", vocab, target.vocab_size),
    ):
        if got != expected:
            raise BadInputError(f"medusa {name}", got, f"{expected} of the target {target.name}")


# ---- FasterDecoding: import ---------------------------------------------------------------------------
FD_NAME = re.compile(r"^(?:medusa_head\.)?(\d+)\.(\d+)\.(?:linear\.)?(weight|bias)$")


def from_fasterdecoding(raw: dict, tensors: dict[str, torch.Tensor], target) -> MedusaHeads:
    """FasterDecoding's `medusa_head` state dict -> our heads (own LM heads, biased blocks)."""
    # its config may carry the base model's own num_* keys too: read Medusa's by their names
    heads, layers = raw["medusa_num_heads"], raw.get("medusa_num_layers", 1)
    check_sizes(raw.get("hidden_size", target.hidden_size), raw.get("vocab_size", target.vocab_size), target)
    config = MedusaConfig.for_target(target, num_heads=heads, num_layers=layers, original_lm_head=False)
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        match = FD_NAME.match(name)
        if match is None:
            raise BadInputError(
                f"tensor {name}", "unexpected", "medusa_head.{k}.{j}.linear.* or {k}.{L}.weight"
            )
        k, j, leaf = int(match[1]), int(match[2]), match[3]
        ours[f"lm_heads.{k}.weight" if j == layers else f"blocks.{k}.layers.{j}.{leaf}"] = tensor
    ours["d2t"] = torch.zeros(target.vocab_size, dtype=torch.long)
    ours["t2d"] = torch.ones(target.vocab_size, dtype=torch.bool)
    return build_heads(config, ours, target, "FasterDecoding heads trained on this base model")


def _fasterdecoding_tensors(folder: Path) -> dict[str, torch.Tensor]:
    for name in FD_FILES:
        path = folder / name
        if path.is_file() and name.endswith(".safetensors"):
            return load_tensors(path, "medusa head")
        if path.is_file():  # a pickle: tensors only (weights_only refuses arbitrary objects)
            try:
                return torch.load(path, map_location="cpu", weights_only=True)
            except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad file
                raise BadInputError("medusa head", str(path), "a state dict of tensors", str(err)) from None
    raise BadInputError("medusa head", str(folder), f"a folder with {' or '.join(FD_FILES)}")


# ---- any layout ---------------------------------------------------------------------------------------
def load_medusa(folder: str | Path, target) -> MedusaHeads:
    """Our folder, vLLM's layout (model_type medusa) or FasterDecoding's (medusa_num_heads), strict."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file():
        raise BadInputError("medusa head", str(folder), f"a folder with {CONFIG_FILE}")
    raw = read_json(folder / CONFIG_FILE, "medusa head")
    if raw.get("head_type") == "medusa":
        return MedusaHeads.from_pretrained(folder, target)
    if raw.get("model_type") == "medusa":
        tensors = {}
        for file in sorted(folder.glob("*.safetensors")):
            tensors.update(load_tensors(file, "medusa head"))
        return from_vllm(raw, tensors, target)
    if "medusa_num_heads" in raw:
        return from_fasterdecoding(raw, _fasterdecoding_tensors(folder), target)
    raise BadInputError(
        f"{folder / CONFIG_FILE}",
        sorted(raw)[:8],
        "draftsmith's (head_type medusa), vLLM's or FasterDecoding's",
    )
