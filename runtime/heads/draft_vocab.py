"""The reduced draft vocabulary of the EAGLE-3 and DFlash heads: their LM head scores `draft_vocab_size` of
the target's ids, held as EAGLE-3's buffers `d2t` (target id = draft id + d2t[draft id]) and `t2d` (a mask
over the target's ids); their logits read norm(h) through that LM head, and are placed at the target's ids.

    class Head(nn.Module, DraftVocab):
        def __init__(self, cfg):
            ...
            self.register_draft_vocab(cfg.draft_vocab_size, cfg.vocab_size)   # the first ids until set
    head.set_draft_vocab(torch.tensor([0, 5, 9]))
    head.target_logits(h)             # [..., V]: lm_head(norm(h)) at the target's ids, -inf elsewhere
"""

from __future__ import annotations

import torch


class DraftVocab:
    """The `d2t` / `t2d` buffers of an nn.Module head and what reads and writes them; the head's `norm` and
    `lm_head` (over the draft vocabulary) give its logits."""

    def register_draft_vocab(self, draft_vocab_size: int, vocab_size: int) -> None:
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(vocab_size, dtype=torch.bool))
        self.set_draft_vocab(torch.arange(draft_vocab_size))

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Draft id i stands for target id target_ids[i] (ascending, unique)."""
        self.d2t.copy_(target_ids - torch.arange(len(target_ids)))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    def draft_ids(self) -> torch.Tensor:
        """[Vd] the target id of each draft id."""
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(h))  # [..., Vd]
        return logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32, float64 kept

    def target_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft logits placed at their target ids, -inf elsewhere -> [..., V] (what vLLM's compute_logits
        does), so the runtime samples and verifies in the target's vocabulary."""
        draft = self.draft_logits(h)
        full = draft.new_full((*draft.shape[:-1], len(self.t2d)), float("-inf"))
        return full.scatter(-1, self.draft_ids().expand_as(draft), draft)
