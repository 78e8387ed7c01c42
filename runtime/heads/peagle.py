"""The P-EAGLE draft head (parallel EAGLE, arXiv 2602.01469): the EAGLE-3 head drafting K positions in one
forward.

    config = PEagleConfig.for_target(target, block_size=4, draft_vocab_size=8192)
    head = PEagleHead(config)
    embeds, feature = head.mask_inputs(batch, K - 1)     # [B, K-1, H] each: the learned mask inputs
    h = head(cat([target.embed(ids), embeds]), cat([head.fuse(aux), feature]), positions, cache)
    head.target_logits(h)                                # [B, T, V]: every position's draft logits

The layers, fc, norms, LM head and draft vocabulary are the EAGLE-3 head's (runtime/heads/eagle3.py,
subclassed). What P-EAGLE adds: position d >= 1 of a block reads no token and no feature of its own (those
are what is being drafted), but two learned inputs shared by every such position: `mask_hidden`
[1, 1, A*Ht], a stand-in for the target's concatenated aux hidden states, fused by `fc` like real ones
(speculators' `PEagleDraftModel.mask_hidden`, vLLM's `parallel_drafting_hidden_state_tensor =
combine_hidden_states(mask_hidden)`), and `mask_embed` [H], the embedding of the mask token. The block
sits after the last real pair (token t+1, feature t) at positions t+1 .. t+K-1 and attends causally to
the committed pairs and to the block's earlier mask positions; the output at pair t predicts token t+2
(depth 1, as EAGLE-3) and mask position t+d predicts token t+d+2 (depth d+1): K tokens per forward.

The head keeps the target's embedding shared (never stored), so the mask token's embedding is its own
parameter; `mask_token_id` names the row engines read it from: speculators and vLLM embed their
`mask_token_id` (vLLM: `pard_token`) with the draft's `embed_tokens`, which our export writes as the
target's embedding with that one row replaced by `mask_embed` (runtime/heads/peagle_kind.py). The default
id is the last row of the embedding (`vocab_size - 1`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from draftsmith.runtime.core.artifacts import save_head_files
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, check_head_matches_target
from draftsmith.runtime.heads.head_folder import fill_strict, read_head_folder

DEFAULT_BLOCK = 4  # K drafted tokens per forward; speculators trains 8 (`num_depths`), CPUs verify fewer


@dataclass
class PEagleConfig(Eagle3Config):
    head_type: str = "peagle"
    block_size: int = DEFAULT_BLOCK  # K: tokens drafted per forward (the trained depths)
    mask_token_id: int | None = None  # the embedding row engines read the mask embedding from (None: V-1)

    def validate(self, num_target_layers: int | None = None) -> PEagleConfig:
        super().validate(num_target_layers)
        if self.head_type != "peagle":
            raise BadInputError("head_type", self.head_type, "peagle")
        k = self.block_size
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise BadInputError("block_size", k, "an integer >= 2 (tokens drafted per forward)")
        if self.mask_token_id is None:
            self.mask_token_id = self.vocab_size - 1
        m = self.mask_token_id
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < self.vocab_size:
            raise BadInputError("mask_token_id", m, f"a token id in [0, {self.vocab_size})")
        return self


class PEagleHead(Eagle3Head):
    def __init__(self, cfg: PEagleConfig):
        super().__init__(cfg)
        width = len(cfg.aux_layer_ids) * cfg.target_hidden_size
        # speculators' shape [1, 1, A*Ht] (vLLM reads it as view(1, -1)); randn as speculators initialises it
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, width))
        self.mask_embed = nn.Parameter(torch.zeros(cfg.hidden_size))

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def mask_inputs(self, batch: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs of `count` mask positions per row -> (embeddings [B, n, H], features [B, n, H])."""
        feature = self.fuse(self.mask_hidden)[0, 0]  # [H]
        embed = self.mask_embed.to(feature.dtype)
        return embed.expand(batch, count, -1), feature.expand(batch, count, -1)

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> PEagleHead:
        return load_head(folder, target)  # save_pretrained is EAGLE-3's: it saves the config's head_type


# ---- files --------------------------------------------------------------------------------------------
def save_head(head: PEagleHead, folder: str | Path) -> None:
    save_head_files(head, folder, "peagle")


def load_head(folder: str | Path, target=None) -> PEagleHead:
    """Strict load (runtime/heads/head_folder.py), as the EAGLE-3 head's: every tensor with its exact
    shape, nothing extra, all finite, `head_type: peagle`, checked against `target` when given."""
    config, tensors = read_head_folder(folder, "peagle", PEagleConfig)
    return head_from_tensors(config, tensors, target)


def head_from_tensors(config: PEagleConfig, tensors: dict[str, torch.Tensor], target=None) -> PEagleHead:
    config.validate()
    if target is not None:
        try:  # the EAGLE-3 checks (vocabulary, sizes, tokenizer, family, a co-trained binding)
            check_head_matches_target(config, target)
        except BadInputError as err:
            field = err.field.replace("eagle3 head", "peagle head")
            raise BadInputError(field, err.got, err.expected, err.hint) from None
    return fill_strict(PEagleHead(config), tensors, "P-EAGLE", config.draft_vocab_size)


def check_block(head: PEagleHead, depth: int, field: str = "--tree") -> None:
    """A drafted tree or chain must fit in the head's block: depth in [1, K]."""
    if not 1 <= depth <= head.block_size:
        raise BadInputError(
            field,
            f"depth {depth}",
            f"a tree of depth 1..{head.block_size} (the P-EAGLE head drafts block_size={head.block_size} "
            "tokens per forward)",
        )
