"""The DSpark block drafter (DeepSeek/PKU, arXiv 2607.05147): a DFlash backbone plus a low-rank Markov head
and a confidence head.

    config = DSparkConfig.for_target(target, block_size=8, markov_rank=64)
    head = DSparkHead(config)
    h = head.backbone(embeds, positions, k, v, mask)     # [B, S, H]: DFlash's forward (heads/dflash.py)
    head.target_logits(h[:, k], prev_ids)                # [B, V]: position k's logits, biased by token k-1
    head.survival(h[:, k], prev_ids)                     # [B]: P(position k accepted | position k-1 was)
    platt_folded(tensors, scale, shift)                  # a folder's tensors, the confidence recalibrated

One forward of the DFlash backbone gives every block position's hidden state. The **Markov head** then
biases position k's draft logits by the token drafted at position k - 1 (the anchor for k = 1) through a
rank-r map, `markov_w2(markov_w1[prev])` (an [V, r] embedding of the target's ids, then an [r, Vd]
projection to the draft vocabulary): `vanilla` adds it as it is, `gated` scales the r-vector by a sigmoid
gate of [norm(h_k); w1[prev]] first (speculators' and ModelOpt's two stateless variants; their `rnn`
variant carries a state along the block, which a tree's branches would have to fork, so it is not built).
The **confidence head** is one linear map of [norm(h_k); w1[prev]] to a logit: the head's estimate that
position k is accepted given that position k - 1 was. It reads the PARENT's token, never position k's own
drafted token: a verify budget chosen from the sampled tokens themselves would bias the output law.

The backbone is a DFlashHead held by composition (its tensors are `backbone.*` in our folder); the DSpark
parts are `markov_head.{markov_w1, markov_w2, gate_proj}` and `confidence_head.proj`, speculators' names
(speculators/models/dspark/model_definitions.py), so the speculators export only drops `backbone.`.
Block position j >= 1 predicts token p + j (speculators' `sample_from_anchor: false`, DFlash's convention).
Tests: tests/runtime/test_dspark.py, tests/runtime/test_dspark_law.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from draftsmith.runtime.core.artifacts import save_head_files
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.dflash import (
    DFlashConfig,
    DFlashHead,
    check_head_matches_target,
    default_mask_token,
)
from draftsmith.runtime.heads.eagle3 import feature_head_fields
from draftsmith.runtime.heads.head_folder import fill_strict, read_head_folder

MARKOV_TYPES = ("vanilla", "gated")  # the stateless variants (the module docstring says why not rnn)
DEFAULT_RANK = 256  # speculators' and DeepSpec's default


@dataclass
class DSparkConfig(DFlashConfig):
    markov_rank: int = DEFAULT_RANK  # r of the Markov bias markov_w2 @ markov_w1: <= draft_vocab_size
    markov_head_type: str = "vanilla"  # one of MARKOV_TYPES
    head_type: str = "dspark"

    @classmethod
    def for_target(
        cls, target, aux_layer_ids=None, draft_vocab_size: int | None = None, **options
    ) -> DSparkConfig:
        if options.get("mask_token_id") is None:
            options["mask_token_id"] = default_mask_token(target)
        config = cls(**feature_head_fields(target, aux_layer_ids, draft_vocab_size), **options)
        return config.validate(num_target_layers=target.num_layers)

    def validate(self, num_target_layers: int | None = None) -> DSparkConfig:
        super().validate(num_target_layers)
        check_markov(self.markov_rank, self.markov_head_type, self.draft_vocab_size)
        return self


def check_markov(rank, head_type, draft_vocab_size: int, prefix: str = "") -> None:
    """A rank in [1, draft vocabulary] (a larger one is no longer low-rank: it adds parameters and nothing
    the full [Vd] bias could not hold) and a known variant."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= draft_vocab_size:
        raise BadInputError(
            f"{prefix}markov_rank", rank, f"an integer in [1, {draft_vocab_size}] (the draft vocabulary size)"
        )
    if head_type not in MARKOV_TYPES:
        raise BadInputError(f"{prefix}markov_head_type", head_type, f"one of {list(MARKOV_TYPES)}")


class MarkovHead(nn.Module):
    """The low-rank bias of position k's draft logits by the token at k - 1."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        rank = cfg.markov_rank
        self.head_type = cfg.markov_head_type
        self.markov_w1 = nn.Embedding(cfg.vocab_size, rank)  # indexed by the target's ids
        self.markov_w2 = nn.Linear(rank, cfg.draft_vocab_size, bias=False)
        if self.head_type == "gated":
            self.gate_proj = nn.Linear(cfg.hidden_size + rank, rank)
        with torch.no_grad():  # a small bias at start: the backbone's drafts first (speculators' init)
            self.markov_w1.weight.normal_(0, 0.01)

    def bias(self, prev_emb: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        """prev_emb [.., r] (markov_w1 of the previous tokens), normed [.., H] -> the bias [.., Vd]."""
        if self.head_type == "gated":
            prev_emb = prev_emb * torch.sigmoid(self.gate_proj(torch.cat([normed, prev_emb], dim=-1)))
        return self.markov_w2(prev_emb)


class ConfidenceHead(nn.Module):
    """[norm(h_k); w1[prev]] -> the logit of P(position k accepted | position k - 1 accepted)."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.hidden_size + cfg.markov_rank, 1)

    def forward(self, normed: torch.Tensor, prev_emb: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([normed, prev_emb], dim=-1)).squeeze(-1)  # [..]


class DSparkHead(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        self.config = cfg.validate()
        self.backbone = DFlashHead(cfg)
        self.markov_head = MarkovHead(cfg)
        self.confidence_head = ConfidenceHead(cfg)

    # what the folder reader and the drafter read off the backbone
    @property
    def d2t(self) -> torch.Tensor:
        return self.backbone.d2t

    @property
    def t2d(self) -> torch.Tensor:
        return self.backbone.t2d

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        self.backbone.set_draft_vocab(target_ids)

    def init_from_target(self, target) -> DSparkHead:
        self.backbone.init_from_target(target)
        return self

    def parts(self, h: torch.Tensor, prev_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [.., H] (the backbone's, pre-norm), prev_ids [..] target ids -> norm(h) [.., H], w1[prev]
        [.., r]."""
        normed = self.backbone.norm(h)
        prev_emb = self.markov_head.markov_w1(prev_ids.clamp(min=0)).to(normed.dtype)
        return normed, prev_emb

    def draft_logits(self, h: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """-> [.., Vd]: the backbone's draft logits plus the Markov bias (float32 at least)."""
        normed, prev_emb = self.parts(h, prev_ids)
        logits = self.backbone.lm_head(normed) + self.markov_head.bias(prev_emb, normed)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def target_logits(self, h: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """-> [.., V]: the draft logits at their target ids, -inf elsewhere (DraftVocab.target_logits)."""
        draft = self.draft_logits(h, prev_ids)
        full = draft.new_full((*draft.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.scatter(-1, self.backbone.draft_ids().expand_as(draft), draft)

    def confidence_logits(self, h: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        return self.confidence_head(*self.parts(h, prev_ids))  # [..]

    def survival(self, h: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """-> [..] float32 in (0, 1): P(position accepted | its parent accepted)."""
        return torch.sigmoid(self.confidence_logits(h, prev_ids).float())

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> DSparkHead:
        return load_head(folder, target)

    def save_pretrained(self, folder: str | Path) -> None:
        save_head_files(self, folder, "dspark")


CONFIDENCE_WEIGHT, CONFIDENCE_BIAS = "confidence_head.proj.weight", "confidence_head.proj.bias"


def platt_folded(tensors: dict[str, torch.Tensor], scale: float, shift: float) -> dict[str, torch.Tensor]:
    """A DSpark folder's tensors (ours or the speculators layout: the confidence head has the same names in
    both) with Platt scaling (runtime/verify/recalibration.py) folded into the confidence head's linear map,
    scale * (W x + b) + shift = (scale W) x + (scale b + shift): survival becomes sigmoid(scale * logit +
    shift) wherever the head is read, exports included. Each tensor keeps its dtype (computed in float64)."""
    for name in (CONFIDENCE_WEIGHT, CONFIDENCE_BIAS):
        if name not in tensors:
            raise BadInputError(f"tensor {name}", "missing", "a DSpark head with a confidence head")
    w, b = tensors[CONFIDENCE_WEIGHT], tensors[CONFIDENCE_BIAS]
    return {
        **tensors,
        CONFIDENCE_WEIGHT: (scale * w.double()).to(w.dtype),
        CONFIDENCE_BIAS: (scale * b.double() + shift).to(b.dtype),
    }


def load_head(folder: str | Path, target=None) -> DSparkHead:
    """Strict load of our folder (runtime/heads/head_folder.py), checked against `target` when given."""
    config, tensors = read_head_folder(folder, "dspark", DSparkConfig)
    if target is not None:
        check_head_matches_target(config, target)
    return fill_strict(DSparkHead(config), tensors, "DSpark", config.draft_vocab_size)
