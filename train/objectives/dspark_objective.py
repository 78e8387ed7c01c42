"""The DSpark objective (arXiv 2607.05147; speculators 0.9 models/dspark, ModelOpt #1849): DFlash's blocks
and distillation loss with the Markov-biased logits, plus a total-variation term and the confidence head's
binary cross-entropy against each position's realized acceptance.

    out = dspark_loss(head, target.embed, batch, target_logits=target.logits, tvd_weight=1.0,
                      confidence_weight=1.0)
    out.loss.backward()       # the backbone, the Markov head and the confidence head all get gradients
    out.calibration_error     # expected calibration error of the confidence head over the counted slots
    out.calibration           # its reducible sums (bins, per position): the evaluation pools them
    kind = DSparkKind(cfg, target, aux_layers, paths)     # what the trainer drives

The blocks, anchors and counted slots are DFlash's (`dflash_blocks` in dflash_objective.py). Slot k's
logits are the backbone's plus the Markov bias of the token before its label (teacher forced: the data's
token a + k - 1, the anchor's for k = 1). Per counted slot, with p the target's distribution and q the
draft's softmax over the draft vocabulary:
  distillation  CE(p, q) (DFlash's soft cross-entropy),
  TVD           0.5 * sum |p - q|,
  confidence    BCE(sigmoid(c_k), 1 - TVD): 1 - TVD = sum min(p, q) is the probability that rejection
                sampling accepts slot k's draft given the slots before it were (its realized acceptance at
                T = 1, speculators' c*; detached: the head learns to predict it, not to move it),
each weighted exp(-(k - 1) / gamma) as DFlash's, summed as
  loss = distillation + tvd_weight * TVD + confidence_weight * confidence, over the counted slots.
The evaluation adds the mean predicted and realized acceptance and the expected calibration error (10
equal-width bins of the prediction; runtime/verify/calibration.py's, the function `bench` scores with):
DSparkModel sums the validation slots' bins and per-position means while it is in eval mode, and the
trainer's evaluation row reports them (`DSparkKind.eval_begin`, `eval_fields`).
Tests: tests/train/test_dspark_objective.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from draftsmith.runtime.heads.dspark import DSparkConfig, DSparkHead
from draftsmith.runtime.verify.calibration import CalibrationSums, ece_of, expected_calibration_error
from draftsmith.train.objectives.dflash_objective import DFlashKind, DFlashOutput, block_output, dflash_blocks
from draftsmith.train.objectives.eagle3_objective import TTTBatch
from draftsmith.train.objectives.head_init import finish_head


@dataclass
class DSparkOutput(DFlashOutput):
    tvd: float = 0.0  # mean over counted slots
    confidence_loss: float = 0.0  # mean BCE over counted slots
    predicted: float = 0.0  # mean predicted acceptance (the confidence head's)
    realized: float = 0.0  # mean realized acceptance (1 - TVD)
    calibration_error: float = 0.0  # expected calibration error (runtime/verify/calibration.py)
    calibration: CalibrationSums | None = None  # its sums: bins and block positions 1..S-1


__all__ = ["DSparkKind", "DSparkModel", "DSparkOutput", "dspark_loss", "expected_calibration_error"]


def dspark_loss(
    head: DSparkHead,
    embed,
    batch: TTTBatch,
    *,
    target_logits,  # the target's pre-norm hidden [N, Ht] -> logits [N, V] (Target.logits)
    max_anchors: int = 32,
    gamma: float = 7.0,
    tvd_weight: float = 1.0,
    confidence_weight: float = 1.0,
    logit_chunk: int = 1024,
    generator: torch.Generator | None = None,
) -> DSparkOutput:
    b = dflash_blocks(head.backbone, embed, batch, target_logits, max_anchors, logit_chunk, generator)
    h = b.h[b.picked]  # [n, H]
    logits = head.draft_logits(h, b.prev)  # [n, Vd]
    log_q = F.log_softmax(logits, dim=-1)
    ce = -(b.goal * log_q).sum(-1)  # [n]
    tvd = 0.5 * (b.goal - log_q.exp()).abs().sum(-1)  # [n]
    realized = (1.0 - tvd).detach().clamp(0.0, 1.0)  # [n]
    confidence = head.confidence_logits(h, b.prev).float()  # [n]
    bce = F.binary_cross_entropy_with_logits(confidence, realized, reduction="none")  # [n]
    weights = torch.exp(-(b.slot - 1).to(ce.dtype) / gamma)
    n = b.picked.sum().clamp(min=1)
    loss = (weights * (ce + tvd_weight * tvd + confidence_weight * bce)).sum() / n
    out = block_output(loss, logits, ce, b, head.config.block_size)
    predicted = torch.sigmoid(confidence.detach())  # [n]
    sums = CalibrationSums.of(predicted, realized, b.slot - 1, head.config.block_size - 1)
    return DSparkOutput(
        **out.__dict__,
        tvd=float(tvd.detach().mean()) if len(tvd) else 0.0,
        confidence_loss=float(bce.detach().mean()) if len(bce) else 0.0,
        predicted=float(predicted.mean()) if len(predicted) else 0.0,
        realized=float(realized.mean()) if len(realized) else 0.0,
        calibration_error=ece_of(sums.bins),
        calibration=sums,
    )


class DSparkModel(nn.Module):
    """The head and its objective as one module (what Accelerate prepares); the frozen target's embedding
    and logits are used but deliberately not submodules."""

    def __init__(self, head: DSparkHead, embed, target_logits, section, chunk: int):
        super().__init__()
        self.head, self.section, self.chunk = head, section, chunk
        self._frozen = [embed, target_logits]
        self.eval_sums: CalibrationSums | None = None  # the confidence head's, summed while in eval mode

    def forward(self, input_ids, features, target_hidden, loss_mask, valid):
        """-> (loss, correct [S-1], counted [S-1]); in eval mode the batch's calibration sums add up in
        `eval_sums`."""
        embed, target_logits = self._frozen
        s = self.section
        out = dspark_loss(
            self.head, embed, TTTBatch(input_ids, features, target_hidden, loss_mask, valid),
            target_logits=target_logits, max_anchors=s.max_anchors, gamma=s.loss_gamma,
            tvd_weight=s.tvd_weight, confidence_weight=s.confidence_weight, logit_chunk=self.chunk,
        )  # fmt: skip
        if not self.training:
            self.eval_sums = out.calibration if self.eval_sums is None else self.eval_sums + out.calibration
        return out.loss, out.correct, out.counted


class DSparkKind:
    """What the trainer drives (DFlashKind's shape, its memory terms and data batches: the backbone's)."""

    kind, label, steps_label, ttt = "dspark", "DSpark", "block of {} + 1", False
    memory_terms = DFlashKind.memory_terms
    steps = DFlashKind.steps

    @staticmethod
    def new_head(target, aux_layers, draft_vocab: int, steps: int, cotrained: bool, options: dict):
        options = {k: v for k, v in options.items() if k != "max_anchors"}
        aux = list(aux_layers) or list(range(min(3, target.num_layers)))
        return DSparkHead(DSparkConfig.for_target(target, aux, draft_vocab, **options))

    def __init__(self, cfg, target, aux_layers, paths):
        self.target, self.aux = target, aux_layers
        section = cfg.head
        vocab = section.draft_vocab_size if section.reduce_vocab else None
        head = self.new_head(target, aux_layers, vocab or target.vocab_size, 0, False, section.head_options())
        self.head = finish_head(head, target, vocab, section.init_from_target, getattr(paths, "vocab", None))
        self.model = DSparkModel(self.head, target.embed, target.logits, section, cfg.train.logit_chunk)
        self.depth = section.block_size - 1

    batch = DFlashKind.batch

    def eval_begin(self) -> None:
        self.model.eval_sums = None

    def eval_fields(self, reduce) -> dict:
        """The evaluation row's calibration of the confidence head over this evaluation's validation slots;
        `reduce` sums a tensor over the ranks (every rank calls it, with or without slots of its own)."""
        depth = self.head.config.block_size - 1
        sums = self.model.eval_sums or CalibrationSums.of(
            *[torch.zeros(0)] * 2, torch.zeros(0, dtype=torch.long), depth
        )
        got = CalibrationSums.from_flat(reduce(sums.flat())).summary()
        return {
            "calibration_error": got["calibration_error"],
            "calibration_slots": got["calibration_slots"],
            "predicted_accept_per_position": got["predicted_accept_per_position"],
            "realized_accept_per_position": got["observed_accept_per_position"],
            "reliability": got["reliability"],
        }

    def save_final(self, state: dict, folder) -> None:
        from draftsmith.train.objectives.heads import load_partial

        load_partial(DSparkHead(self.head.config), state, "head.").save_pretrained(folder)
