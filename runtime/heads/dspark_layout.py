"""DSpark heads in speculators' layout (speculators 0.9, models/dspark), and the reader of both folders.

    config, tensors = to_speculators(head, verifier="HuggingFaceTB/SmolLM2-135M-Instruct")
    head = load_dspark(folder, target)     # ours, or a speculators export written here (detected)

speculators' DSpark is its DFlash layout (runtime/heads/dflash_layout.py writes the backbone: Qwen3 layer
config, block size, mask id, aux ids + 1, d2t/t2d below the full vocabulary) with `speculators_model_type:
dspark`, `architectures: [DSparkSpeculator]` (DSparkSpeculatorConfig's default) and its own keys:
`markov_rank`, `markov_head_type`, `enable_confidence_head: true`, `confidence_head_with_markov: true`
(our confidence head reads the previous token's markov_w1 row) and `sample_from_anchor: false` (block
position j predicts token p + j, as ours). Tensor names are speculators' (`DSparkDraftModel.state_dict()`):
the backbone's at the top level, `markov_head.markov_w1.weight` [V, r], `markov_head.markov_w2.weight`
[Vd, r] (and `markov_head.gate_proj.*` when gated), `confidence_head.proj.{weight, bias}`. Like the
DFlash exports, it carries a `draftsmith` block (our config) that `load_dspark` checks the engine keys
against. speculators' own DSparkDraftModel.from_pretrained loads it: tests/runtime/test_dspark_speculators.py.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import load_tensors
from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.aux_layers import AUX_LAYER_CONVENTION
from draftsmith.runtime.heads.dflash_layout import _engine_facts
from draftsmith.runtime.heads.dflash_layout import to_speculators as dflash_speculators
from draftsmith.runtime.heads.dspark import DSparkConfig, DSparkHead, check_head_matches_target, load_head
from draftsmith.runtime.heads.head_folder import CONFIG_FILE, WEIGHTS_FILE, fill_strict

ARCHITECTURE = "DSparkSpeculator"  # DSparkSpeculatorConfig's default architectures
BACKBONE = "backbone."


def to_speculators(head: DSparkHead, verifier: str | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """-> (config.json, tensors) of speculators' DSpark layout."""
    cfg = head.config
    config, tensors = dflash_speculators(head.backbone, verifier)
    config.update(
        architectures=[ARCHITECTURE],
        speculators_model_type="dspark",
        markov_rank=cfg.markov_rank,
        markov_head_type=cfg.markov_head_type,
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        sample_from_anchor=False,
        draftsmith={**asdict(cfg), "aux_layer_convention": AUX_LAYER_CONVENTION},
    )
    config["speculators_config"]["algorithm"] = "dspark"
    own = {
        k: v.detach().contiguous()
        for k, v in head.state_dict().items()
        if not k.startswith(BACKBONE) and not k.startswith("rotary.")
    }
    return config, {**tensors, **own}


def detect(config: dict) -> str:
    """'draftsmith' or 'speculators' from a config.json; another kind's is refused naming it."""
    if "head_type" in config:
        return "draftsmith"
    if config.get("speculators_model_type") == "dspark":
        return "speculators"
    got = config.get("speculators_model_type") or config.get("architectures") or sorted(config)[:6]
    raise BadInputError(
        "config.json", got,
        "a DSpark folder: ours (head_type: dspark) or speculators' (speculators_model_type: dspark)",
    )  # fmt: skip


def load_dspark(folder: str | Path, target=None) -> DSparkHead:
    """`--draft dspark:DIR`: our folder or a speculators export written here, strictly."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise BadInputError("--draft dspark", str(folder), f"a folder with {CONFIG_FILE} and {WEIGHTS_FILE}")
    raw = read_json(folder / CONFIG_FILE, "dspark head")
    if detect(raw) == "draftsmith":
        return load_head(folder, target)
    config = _provenance(raw, folder)
    facts = {**_engine_facts(raw, "speculators"), "markov_rank": raw.get("markov_rank")}
    facts["markov_head_type"] = raw.get("markov_head_type")
    for key, got in facts.items():
        if got != getattr(config, key):
            raise BadInputError(f"speculators {key}", got, f"{getattr(config, key)} (its draftsmith block)")
    if target is not None:
        check_head_matches_target(config, target)
    tensors = {_ours(name): t for name, t in load_tensors(folder / WEIGHTS_FILE, "dspark head").items()}
    full = config.draft_vocab_size == config.vocab_size  # no d2t/t2d at full vocabulary: identity
    absent = (f"{BACKBONE}d2t", f"{BACKBONE}t2d") if full else ()
    return fill_strict(DSparkHead(config), tensors, "DSpark", config.draft_vocab_size, absent)


def _provenance(raw: dict, folder: Path) -> DSparkConfig:
    provenance = raw.get("draftsmith")
    where = f"{folder / CONFIG_FILE} draftsmith"
    if not isinstance(provenance, dict):
        raise BadInputError(
            where,
            None,
            "a DSpark export written by draftsmith export (its `draftsmith` block names the target)",
        )
    provenance = {k: v for k, v in provenance.items() if k != "aux_layer_convention"}
    try:
        return DSparkConfig(**provenance).validate()
    except TypeError as err:
        raise BadInputError(where, sorted(provenance), "DSparkConfig", str(err)) from None


def _ours(name: str) -> str:
    """speculators' tensor name -> ours (the backbone's under `backbone.`)."""
    return name if name.startswith(("markov_head.", "confidence_head.")) else BACKBONE + name
