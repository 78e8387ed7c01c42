"""The P-EAGLE head kind: what runtime/heads/head_kinds.py registers for `peagle` (runtime/heads/head_kind.py
says what a kind declares).

    head, options = KIND.load_draft("runs/peagle/final", target)   # --draft peagle:DIR
    KIND.all_layouts()["speculators"].write(head_folder, out, LayoutOptions(verifier="path/to/target"))

The head is runtime/heads/peagle.py, its drafter runtime/drafters/peagle_drafter.py, its objective
train/objectives/peagle_objective.py. Export layouts:
- `speculators`: speculators' `peagle` folder (speculators/models/peagle/config.py, 0.9.0), which vLLM
  serves as EAGLE-3 with `parallel_drafting: true` (vllm/transformers_utils/configs/speculators: base.py
  maps `speculators_model_type: peagle`, algos.py `update_peagle` reads draft_vocab_size,
  target_hidden_size, norm_before_residual (missing = False), norm_before_fc, eagle_aux_hidden_state_layer_ids
  and the required `mask_token_id`, written to `pard_token`). Tensors: the EAGLE-3 speculators names
  (`layers.0.*`, fc, norm, lm_head, d2t, t2d), `mask_hidden` [1, 1, A*Ht] (vLLM's llama_eagle3.py
  `load_weights` requires it under parallel drafting) and `embed_tokens.weight`: the verifier's embedding
  with row `mask_token_id` replaced by the head's `mask_embed` (vLLM keeps a draft embedding that differs
  from the target's instead of sharing the target's). The verifier's embedding must be at hand (a local
  `--verifier` or target folder).
- `vllm`: vLLM's own EAGLE-3 layout (LlamaForCausalLMEagle3 config, `midlayer.*`, aux ids in vLLM's
  input-of-layer convention) with `mask_token_id` and the same two extra tensors, served with
  `--speculative-config '{"method": "eagle3", "parallel_drafting": true, ...}'`.
Every writer reads its folder back and compares every tensor with the head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from draftsmith.runtime.core.artifacts import load_tensors
from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.head_kind import HeadKind, HeadSection, Layout, VllmServe
from draftsmith.runtime.heads.kind_parts import lazy_class, serve_speculators, write_checked

if TYPE_CHECKING:  # annotations only
    from draftsmith.runtime.heads.head_kind import LayoutOptions, ServeArgs, Written
    from draftsmith.runtime.heads.peagle import PEagleHead

# vLLM's EAGLE-3 proposer drafting the block in parallel
VLLM = VllmServe(layout="vllm", method="eagle3", extra={"parallel_drafting": True})


@dataclass
class PEagleSection(HeadSection):
    """`head:` of a P-EAGLE train config (configs/peagle-smollm2-135m.yaml)."""

    type: Literal["peagle"] = "peagle"
    block_size: int = 4  # K: tokens drafted per forward (and trained depths)
    mask_token_id: int | None = None  # the embedding row exports carry the mask embedding in (None: V-1)
    num_layers: int = 1  # draft decoder layers, as EAGLE-3's

    def validate(self) -> PEagleSection:
        super().validate()
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 2:
            raise BadInputError("head.block_size", self.block_size, "an integer >= 2 (tokens per forward)")
        if self.block_size > 16:
            raise BadInputError("head.block_size", self.block_size, "an integer in [2, 16]")
        self.check_at_least("num_layers", 1)
        return self

    def head_options(self) -> dict:
        """PEagleConfig.for_target's keywords."""
        return self.keywords("block_size", "mask_token_id", "num_layers")


# ---- drafting ---------------------------------------------------------------------------------------------
def default_depth(arg: str) -> int | None:
    return None  # the registry's chain:2; `--tree chain:K` drafts the whole block


def read_any(folder: str, target=None) -> PEagleHead:
    """Our folder, or a speculators / vLLM export of a P-EAGLE head (detected from config.json)."""
    from draftsmith.runtime.heads.peagle import load_head

    path = Path(folder).expanduser()
    config_file = path / "config.json"
    if not config_file.is_file():
        raise BadInputError("peagle head", str(path), "a folder with config.json and *.safetensors")
    config = read_json(config_file, "peagle head")
    if "head_type" in config:  # ours; load_head refuses another kind's folder, naming its head_type
        return load_head(path, target)
    if _is_engine_peagle(config):
        return read_engine(path, config, target)
    raise BadInputError(
        "peagle head",
        str(path),
        "a P-EAGLE folder: ours (head_type: peagle), speculators' (speculators_model_type: peagle) or "
        "vLLM's (an EAGLE-3 config with mask_token_id)",
    )


def _is_engine_peagle(config: dict) -> bool:
    """A speculators folder (its model type is checked when read) or vLLM's EAGLE-3 + parallel drafting."""
    from draftsmith.runtime.heads.layouts import OFFICIAL_ARCHITECTURES

    if "speculators_model_type" in config:
        return True
    official = any(arch in OFFICIAL_ARCHITECTURES for arch in config.get("architectures") or ())
    return official and ("mask_token_id" in config or "pard_token" in config)


# ---- export -----------------------------------------------------------------------------------------------
def _base(head: PEagleHead) -> dict:
    return {"block_size": head.config.block_size, "mask_token_id": head.config.mask_token_id}


def _embedding_with_mask(head: PEagleHead, options: LayoutOptions) -> tuple[torch.Tensor, list[str] | None]:
    """The verifier's embedding [V, H] with row mask_token_id := the head's mask_embed, its architectures."""
    from draftsmith.runtime.heads.eagle3_kind import _verifier_facts

    facts = _verifier_facts(options.verifier or head.config.target)
    if "embed_tokens" not in facts:
        raise BadInputError(
            "--verifier",
            options.verifier or head.config.target,
            "a local target folder with model.embed_tokens.weight",
            "a P-EAGLE export carries its learned mask embedding as a row of embed_tokens",
        )
    embed = facts["embed_tokens"].detach().clone().to(head.fc.weight.dtype)
    c = head.config
    if tuple(embed.shape) != (c.vocab_size, c.hidden_size):
        raise BadInputError(
            "--verifier embed_tokens", list(embed.shape), f"[{c.vocab_size}, {c.hidden_size}]"
        )
    embed[head.config.mask_token_id] = head.mask_embed.detach().to(embed.dtype)
    return embed.contiguous(), facts.get("architectures")


def engine_tensors(head: PEagleHead, layout: str, embed: torch.Tensor) -> dict[str, torch.Tensor]:
    from draftsmith.runtime.heads.layouts import _rename, _tensors

    tensors = {k: v for k, v in _tensors(head).items() if k != "mask_embed"}
    if head.config.draft_vocab_size == head.config.vocab_size:  # the engines then have no d2t/t2d tensors
        tensors = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    if layout == "speculators":
        tensors = {_rename(k, "midlayer.", "layers.0."): v for k, v in tensors.items()}
    tensors["embed_tokens.weight"] = embed
    return tensors


def to_speculators_peagle(head: PEagleHead, options: LayoutOptions, embed, architectures) -> dict:
    from draftsmith.runtime.heads.layouts import to_speculators

    k = _tokens(head, options)
    config, _ = to_speculators(head, options.verifier, k, architectures=architectures)
    config.update(
        architectures=["PEagleSpeculator"],  # speculators' PEagleSpeculatorConfig default
        speculators_model_type="peagle",
        mask_token_id=head.config.mask_token_id,
        embed_requires_grad=True,  # speculators' P-EAGLE default: the embedding is part of the head
    )
    config["speculators_config"]["algorithm"] = "peagle"
    config["draftsmith"]["peagle"] = _base(head)
    return config


def to_vllm_peagle(head: PEagleHead, options: LayoutOptions) -> dict:
    from draftsmith.runtime.heads.layouts import to_official

    config, _ = to_official(head, engine="vllm")
    config["mask_token_id"] = head.config.mask_token_id  # vLLM's proposer reads it (pard_token too)
    config["draftsmith"]["peagle"] = _base(head)
    return config


def _tokens(head: PEagleHead, options: LayoutOptions) -> int:
    k = options.speculative_tokens
    if k > head.config.block_size:
        raise BadInputError(
            "--num-speculative-tokens", k, f"at most the head's block_size={head.config.block_size}"
        )
    return k


def _write(head: PEagleHead, layout: tuple[dict, dict], out: Path, what: str) -> Written:
    """Write the layout, read it back as `--draft peagle:DIR` does, compare with the head."""
    c = head.config
    details = [
        f"block: {c.block_size} tokens per forward; mask token id {c.mask_token_id} (its embedding row)",
        f"aux layers (0-based decoder-layer outputs): {c.aux_layer_ids}",
        f"draft vocabulary: {c.draft_vocab_size} of {c.vocab_size} target tokens (`d2t`)",
    ]
    return write_checked(out, head, layout, read_any, f"peagle {what}", details)


def write_speculators(folder: Path, out: Path, options: LayoutOptions) -> Written:
    from draftsmith.runtime.heads.peagle import load_head

    head = load_head(folder)
    embed, architectures = _embedding_with_mask(head, options)
    config = to_speculators_peagle(head, options, embed, architectures)
    return _write(head, (config, engine_tensors(head, "speculators", embed)), out, "speculators")


def write_vllm(folder: Path, out: Path, options: LayoutOptions) -> Written:
    from draftsmith.runtime.heads.peagle import load_head

    head = load_head(folder)
    _tokens(head, options)
    embed, _ = _embedding_with_mask(head, options)
    return _write(head, (to_vllm_peagle(head, options), engine_tensors(head, "vllm", embed)), out, "vllm")


# ---- engines -> ours --------------------------------------------------------------------------------------
def read_engine(folder: Path, config: dict, target=None) -> PEagleHead:
    """A speculators or vLLM P-EAGLE folder -> our head: the EAGLE-3 part read as runtime/heads/layouts.py
    reads it, mask_embed = embed_tokens[mask_token_id] (the other rows must be the target's when given)."""
    from draftsmith.runtime.heads.layouts import _config_from_engine, _our_names
    from draftsmith.runtime.heads.peagle import PEagleConfig, head_from_tensors

    layout = "speculators" if "speculators_model_type" in config else "official"
    if layout == "speculators" and config["speculators_model_type"] != "peagle":
        raise BadInputError("speculators_model_type", config["speculators_model_type"], "peagle")
    ours = (config.get("draftsmith") or {}).get("peagle") or {}
    mask_id = config.get("mask_token_id", config.get("pard_token"))
    if mask_id is None:
        raise BadInputError("mask_token_id", None, "the mask token id (vLLM's parallel drafting needs it)")
    block = ours.get("block_size")
    if block is None and layout == "speculators":  # speculators writes its num_depths as the proposal's
        block = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    if block is None:
        raise BadInputError("draftsmith.peagle.block_size", None, "the head's trained block size")
    base = _config_from_engine({**config, "embed_requires_grad": False}, layout, target, "input")
    cfg = PEagleConfig(
        **{**asdict(base), "head_type": "peagle", "block_size": block, "mask_token_id": mask_id}
    )
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_tensors(file, "peagle head"))
    embed = tensors.get("embed_tokens.weight")
    if embed is None or embed.shape[0] != cfg.vocab_size:
        raise BadInputError("tensor embed_tokens.weight", "missing", f"[{cfg.vocab_size}, {cfg.hidden_size}]")
    if target is not None:
        _check_other_rows(embed, mask_id, target)
    mask_embed = embed[mask_id].clone()
    tensors = _our_names(tensors, layout, cfg)
    tensors["mask_embed"] = mask_embed
    return head_from_tensors(cfg, tensors, target)


def _check_other_rows(embed: torch.Tensor, mask_id: int, target) -> None:
    ours = target.decoder.embed_tokens.weight.detach()
    keep = torch.ones(len(ours), dtype=torch.bool)
    keep[mask_id] = False
    if embed.shape != ours.shape or not torch.allclose(
        embed[keep].to(ours), ours[keep], rtol=1e-2, atol=1e-3
    ):
        raise BadInputError(
            "embed_tokens.weight", "an embedding other than the target's", f"the embedding of {target.name}"
        )


# ---- the model card's serve texts -------------------------------------------------------------------------
def serve_vllm(args: ServeArgs) -> str:
    return f"## Serve\n\nvLLM:\n\n{VLLM.serve_command(args)}\ndraftsmith:\n\n{args.generate}"


KIND = HeadKind(
    name="peagle",
    title="P-EAGLE draft head",
    about="a P-EAGLE head drafting K tokens per forward: our folder, speculators' or vLLM's layout",
    module_class=lazy_class("draftsmith.runtime.heads.peagle", "PEagleHead"),
    section=PEagleSection,
    read=read_any,
    spec="peagle:DIR",
    layouts={
        "speculators": Layout(
            write=write_speculators,
            serve=partial(serve_speculators, note=", drafts in parallel"),
            reads="verifier",
            about="speculators' peagle folder (layers.0.*, mask_hidden, embed_tokens carrying the mask row): "
            "`vllm serve DIR` drafts in parallel (EAGLE-3 with parallel_drafting)",
        ),
        "vllm": Layout(
            write=write_vllm,
            serve=serve_vllm,
            reads="verifier",
            about="vLLM's own EAGLE-3 folder with mask_token_id, mask_hidden and embed_tokens: "
            '--speculative-config \'{"method": "eagle3", "parallel_drafting": true, ...}\'',
        ),
    },
    default_depth=default_depth,
    vllm=VLLM,
)
