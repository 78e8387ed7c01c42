"""The engine layouts of a DFlash head: speculators' and z-lab's (which vLLM and SGLang load).

    config, tensors = to_speculators(head, verifier="HuggingFaceTB/SmolLM2-135M-Instruct")
    config, tensors = to_zlab(head, num_target_layers=30)
    head = load_dflash(folder, target)     # ours, or either layout written here (detected)

- `speculators` (speculators 0.9.0 `DFlashSpeculatorConfig`, read by vLLM through its speculators config
  path, vllm/transformers_utils/configs/speculators/algos.py `update_dflash`): `speculators_model_type:
  dflash`, `transformer_layer_config` (a Qwen3 config: the draft layers are Qwen3 layers), `block_size`,
  `draft_vocab_size`, `target_hidden_size`, `mask_token_id`, `aux_hidden_state_layer_ids` in the
  input-of-layer convention (ours + 1; vLLM writes `dflash_config.target_layer_ids` = id - 1 from them),
  `sample_from_anchor: false` and `speculators_config` (algorithm, greedy proposal of block_size - 1
  tokens, verifier). `sliding_window_non_causal` is written true: speculators keeps full-attention layers
  bidirectional either way, but vLLM turns an explicit `false` (the default of speculators'
  DFlashSpeculatorConfig) into `dflash_config.causal = true` for every layer, serving the bidirectional
  head causally (checked with vLLM's config code in tests/runtime/test_dflash.py).
- `dflash` (z-lab's DFlash checkpoints, vLLM's `DFlashDraftModel` -> qwen3_dflash.py, SGLang's
  dflash_utils.parse_dflash_draft_config): a Qwen3 config.json with `architectures: [DFlashDraftModel]`,
  top-level `block_size` and `num_target_layers`, `dflash_config` {`mask_token_id`, `target_layer_ids`
  (0-based layer outputs: ours), `block_size`}; layers non-causal (vLLM's default without `layer_types`).
Both carry `fc`, `hidden_norm`, `layers.*`, `norm`, `lm_head` (our frozen copy of the target's rows) under
the same names as ours, and `d2t`/`t2d` only for a reduced vocabulary (speculators has no such buffers at
full vocabulary and vLLM maps `d2t` to `draft_id_to_target_id` only then). A `draftsmith` block holds
what only we read back (the target's identity), so `--draft dflash:EXPORT` loads them strictly.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import load_tensors
from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.aux_layers import AUX_LAYER_CONVENTION
from draftsmith.runtime.heads.dflash import DFlashConfig, DFlashHead, check_head_matches_target, load_head
from draftsmith.runtime.heads.head_folder import CONFIG_FILE, WEIGHTS_FILE, fill_strict

SPECULATORS_VERSION = "0.9.0"
ARCHITECTURE = "DFlashDraftModel"  # vLLM registry: qwen3_dflash.DFlashQwen3ForCausalLM


def qwen3_layer_config(cfg: DFlashConfig, dtype: str) -> dict:
    """The draft layers as a Qwen3 config (speculators' transformer_layer_config, z-lab's config.json)."""
    layer = dict(cfg.layer)
    rope = layer.pop("rope_parameters", None)
    out = {
        "model_type": "qwen3",
        **layer,
        "num_hidden_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }
    if rope:
        out["rope_parameters"] = rope
        if "rope_theta" in rope:  # the key older readers (z-lab's code, vLLM's default) look for
            out["rope_theta"] = rope["rope_theta"]
    return out


def _provenance(cfg: DFlashConfig) -> dict:
    from dataclasses import asdict

    return {**asdict(cfg), "aux_layer_convention": AUX_LAYER_CONVENTION}


def _tensors(head: DFlashHead) -> dict[str, torch.Tensor]:
    full = head.config.draft_vocab_size == head.config.vocab_size
    skip = ("rotary.", "d2t", "t2d") if full else ("rotary.",)
    return {k: v.detach().contiguous() for k, v in head.state_dict().items() if not k.startswith(skip)}


def to_speculators(
    head: DFlashHead, verifier: str | None = None, architectures: list[str] | None = None
) -> tuple[dict, dict[str, torch.Tensor]]:
    from draftsmith.runtime.heads.layouts import _architectures, speculators_config

    cfg = head.config
    dtype = str(head.fc.weight.dtype).removeprefix("torch.")
    verifier = verifier or cfg.target
    config = {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": qwen3_layer_config(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "block_size": cfg.block_size,
        "target_hidden_size": cfg.target_hidden_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.aux_layer_ids],
        "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": True,  # vLLM: dflash_config.causal = not this (see the docstring)
        "sample_from_anchor": False,
        "speculators_config": speculators_config(
            "dflash", cfg.drafts, verifier, architectures or _architectures(verifier, cfg.target_model_type)
        ),
        "torch_dtype": dtype,
        "draftsmith": _provenance(cfg),
    }
    if cfg.window is not None:  # speculators#749: every draft layer a (non-causal) sliding-window layer
        layer = config["transformer_layer_config"]
        layer.update(sliding_window=cfg.window, layer_types=["sliding_attention"] * cfg.num_layers)
        layer.update(use_sliding_window=True, max_window_layers=0)  # Qwen3Config drops the window without
    return config, _tensors(head)


def to_zlab(head: DFlashHead, num_target_layers: int) -> tuple[dict, dict[str, torch.Tensor]]:
    cfg = head.config
    dtype = str(head.fc.weight.dtype).removeprefix("torch.")
    config = {
        **qwen3_layer_config(cfg, dtype),
        "architectures": [ARCHITECTURE],
        "draft_vocab_size": cfg.draft_vocab_size,
        "block_size": cfg.block_size,
        "num_target_layers": num_target_layers,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(cfg.aux_layer_ids),  # z-lab: hidden_states[id + 1], as ours
            "block_size": cfg.block_size,
        },
        "draftsmith": _provenance(cfg),
    }
    return config, _tensors(head)


# ---- reading any of them -------------------------------------------------------------------------------
def detect(config: dict) -> str:
    """'draftsmith', 'speculators' or 'dflash' (z-lab's) from a config.json; another kind is refused."""
    if "head_type" in config:
        return "draftsmith"
    if "speculators_model_type" in config:
        if config["speculators_model_type"] != "dflash":
            raise BadInputError("speculators_model_type", config["speculators_model_type"], "dflash")
        return "speculators"
    if ARCHITECTURE in (config.get("architectures") or []) and "dflash_config" in config:
        return "dflash"
    raise BadInputError(
        "config.json",
        config.get("architectures") or sorted(config)[:6],
        "a DFlash folder: ours (head_type: dflash), speculators' (speculators_model_type: dflash) or "
        f"z-lab's ({ARCHITECTURE} with dflash_config)",
    )


def _engine_facts(config: dict, layout: str) -> dict:
    """What the engines read, back in our terms (compared with the provenance block)."""
    if layout == "speculators":
        layer = config["transformer_layer_config"]
        aux = [i - 1 for i in config["aux_hidden_state_layer_ids"]]
        mask, block = config["mask_token_id"], config["block_size"]
        sliding = "sliding_attention" in (layer.get("layer_types") or [])
        window = layer.get("sliding_window") if sliding else None
    else:
        layer, dflash = config, config["dflash_config"]
        aux, mask, block = list(dflash["target_layer_ids"]), dflash["mask_token_id"], config["block_size"]
        window = None
    return {
        "window": window,
        "aux_layer_ids": aux,
        "mask_token_id": mask,
        "block_size": block,
        "num_layers": layer["num_hidden_layers"],
        "vocab_size": layer["vocab_size"],
        "draft_vocab_size": config.get("draft_vocab_size") or layer["vocab_size"],
    }


def load_dflash(folder: str | Path, target=None) -> DFlashHead:
    """`--draft dflash:DIR`: our folder or an export written here, strictly, checked against `target`."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise BadInputError("--draft dflash", str(folder), f"a folder with {CONFIG_FILE} and {WEIGHTS_FILE}")
    raw = read_json(folder / CONFIG_FILE, "dflash head")
    layout = detect(raw)
    if layout == "draftsmith":
        return load_head(folder, target)
    provenance = raw.get("draftsmith")
    if not isinstance(provenance, dict):
        raise BadInputError(
            f"{folder / CONFIG_FILE} draftsmith", None, "a DFlash export written by draftsmith export (its "
            "`draftsmith` block names the target); foreign DFlash checkpoints are not read here",
        )  # fmt: skip
    provenance = {k: v for k, v in provenance.items() if k != "aux_layer_convention"}
    try:
        config = DFlashConfig(**provenance)
    except TypeError as err:
        raise BadInputError(
            f"{folder / CONFIG_FILE} draftsmith", sorted(provenance), "DFlashConfig", str(err)
        ) from None
    try:
        facts = _engine_facts(raw, layout)
    except (KeyError, TypeError) as err:
        raise BadInputError(str(folder / CONFIG_FILE), f"no {err}", f"the {layout} layout's keys") from None
    for key, got in facts.items():
        if got != getattr(config, key):
            raise BadInputError(f"{layout} {key}", got, f"{getattr(config, key)} (its draftsmith block)")
    if target is not None:
        check_head_matches_target(config, target)
    tensors = load_tensors(folder / WEIGHTS_FILE, "dflash head")
    full = config.draft_vocab_size == config.vocab_size  # no d2t/t2d at full vocabulary: identity
    absent = ("d2t", "t2d") if full else ()
    return fill_strict(DFlashHead(config), tensors, "DFlash", config.draft_vocab_size, absent)
