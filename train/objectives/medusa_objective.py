"""The Medusa-1 objective (Cai et al. 2024, arXiv:2401.10774): K heads on the frozen target's last
hidden state, head k trained to predict token t+k+2 at every position t.

    out = medusa_loss(heads, target, input_ids, h, teacher_logits, loss_mask, valid, labels="target")
    out.loss, out.accuracy           # sum_k decay**k * CE_k (decay 0.8, the paper's); per-head agreement
    kind = MedusaKind(cfg, target, aux_layers, paths)   # what the trainer drives (train/objectives/heads.py's
    shape)

h is the target's last hidden state AFTER its final norm: online from its forward, offline from the
capture (which stores it BEFORE the norm: `target.final_norm` is applied here). Head k at position t is
trained on the target's distribution of token t+k+2 (its logits at position t+k+1; `labels="target"`,
soft cross-entropy, self-distillation) or on the data's token t+k+2 (`labels="data"`, the paper's
Medusa-1 on SFT data). With a reduced vocabulary both live in the draft vocabulary (EAGLE-3's rule: the
teacher renormalized over the draft ids, data tokens outside it not counted). Accuracy compares the
head's argmax with the target's (what a greedy verifier accepts); simulated tau is the trainer's
`simulated_tau` of those. The target stays frozen; with `cotrain.enabled` (Medusa-2,
train/objectives/medusa2.py) `MedusaModel` runs it with gradients and adds its own loss: L_LM + lambda0 *
L_medusa. Tests: tests/train/test_medusa_objective.py, tests/train/test_medusa2.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import torch
from torch import nn
from torch.nn import functional as F

from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads, rank_hits, with_accuracies
from draftsmith.runtime.heads.medusa_kind import (
    MedusaSection,
)  # the `head:` section (the runtime declares it)
from draftsmith.train.objectives.eagle3_objective import TTTOutput
from draftsmith.train.objectives.head_init import finish_head
from draftsmith.train.objectives.mtp_objective import shift, teacher_positions
from draftsmith.train.preflight.medusa_memory import medusa_terms


@dataclass
class MedusaOutput(TTTOutput):
    hits: torch.Tensor | None = None  # [K, topk] positions where head k's rank-i token is the target's
    target_loss: torch.Tensor | None = None  # Medusa-2: the target's own L_LM (CE, or KL to the original)


def head_targets(teacher: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor | None, t2d: torch.Tensor):
    """The soft targets [n, Vd] (teacher logits [n, V] renormalized over the draft ids), or the data's
    draft ids [n] with -100 for tokens outside the draft vocabulary (ignored by cross_entropy)."""
    if labels is None:
        return torch.softmax(teacher[:, ids], dim=-1)
    draft_id = torch.cumsum(t2d.long(), 0) - 1  # [V] target id -> draft id (where t2d)
    return torch.where(t2d[labels], draft_id[labels], torch.full_like(labels, -100))


def medusa_loss(
    heads: MedusaHeads,
    target,
    input_ids: torch.Tensor,  # [B, T]
    h: torch.Tensor,  # [B, T, H] the target's last hidden state after its final norm
    teacher_logits: torch.Tensor,  # [N, V] the target's logits at `teacher_positions` (used detached)
    loss_mask: torch.Tensor,  # [B, T] 1 = token t is supervised
    valid: torch.Tensor,  # [B, T] False on right padding
    labels: str = "target",
    decay: float = 0.8,
    topk: int = 1,  # ranks counted per head: hits [K, topk] (calibration), correct = rank 0's
    detach_hidden: bool = True,  # Medusa-1; Medusa-2 lets the heads' loss reach the target through h
) -> MedusaOutput:
    device = input_ids.device
    sel = teacher_positions(loss_mask, valid)  # [B, T]
    row_of = torch.full(sel.shape, -1, dtype=torch.long, device=device)  # position -> teacher row
    row_of[sel] = torch.arange(int(sel.sum()), device=device)
    teacher = teacher_logits.detach().to(torch.promote_types(teacher_logits.dtype, torch.float32))
    supervised = (loss_mask > 0) & valid
    ids = heads.draft_ids()
    blocks = heads(h.detach() if detach_hidden else h)  # [K, B, T, H]: one forward, every head on h
    losses, corrects, counts, hits = [], [], [], []
    for k in range(heads.config.num_heads):
        counted = shift(supervised, k + 2, False)  # [B, T]: token t+k+2 is supervised
        logits = heads.draft_logits(target, k, blocks[k][counted])  # [n, Vd]
        rows = shift(row_of, k + 1, -1)[counted]  # the target's logits at t+k+1: its law of token t+k+2
        data = shift(input_ids, k + 2)[counted] if labels == "data" else None
        goal = head_targets(teacher[rows], ids, data, heads.t2d)
        ce = F.cross_entropy(logits, goal, reduction="sum", ignore_index=-100)
        n = counted.sum() if data is None else (goal >= 0).sum()
        losses.append(ce / n.clamp(min=1))
        truth = teacher[rows].argmax(-1)  # [n] the target's token t+k+2
        hits.append(rank_hits(logits.detach(), ids, truth, topk))
        corrects.append((ids[logits.argmax(-1)] == truth).sum())
        counts.append(counted.sum())
    step_losses = torch.stack(losses)
    weights = decay ** torch.arange(len(losses), device=device, dtype=step_losses.dtype)
    loss = (weights * step_losses).sum()
    return MedusaOutput(loss, step_losses, torch.stack(corrects), torch.stack(counts), torch.stack(hits))


class MedusaModel(nn.Module):
    """The heads and their objective as one module (what Accelerate prepares); the frozen target is used
    but deliberately not a submodule (never trained, sharded or saved). Medusa-2: `cotrain`
    (train/objectives/medusa2.CotrainedTarget) holds the trained target as a submodule and computes its
    loss."""

    def __init__(
        self, heads: MedusaHeads, target, labels: str, decay: float, cotrain: nn.Module | None = None
    ):
        super().__init__()
        self.heads, self.labels, self.decay, self.cotrain = heads, labels, decay, cotrain
        self._target = [target]  # a list hides it from nn.Module registration
        self.topk = 1

    def forward(self, input_ids, loss_mask, valid, last_hidden=None):
        """-> (loss, correct [K], counted [K]); online runs the frozen target here."""
        out = self.objective(input_ids, loss_mask, valid, last_hidden)
        return out.loss, out.correct, out.counted

    def objective(self, input_ids, loss_mask, valid, last_hidden=None) -> MedusaOutput:
        target, cotrain = self._target[0], self.cotrain
        if cotrain is not None:  # Medusa-2: online only (train/config.py); h and L_LM with gradients
            h, teacher, target_loss = cotrain(input_ids, loss_mask, valid)
        else:
            with torch.no_grad():
                if last_hidden is None:  # [B, T, H] after the final norm, from the model's own forward
                    h = target.decoder(input_ids=input_ids, attention_mask=valid.long(), use_cache=False)[0]
                else:  # offline: the capture holds the state before the final norm
                    h = target.final_norm(last_hidden.to(target.dtype))
                sel = teacher_positions(loss_mask, valid)
                teacher = target.lm_head(h[sel])  # [N, V] only where some head reads them
        out = medusa_loss(
            self.heads, target, input_ids, h, teacher, loss_mask, valid, self.labels, self.decay, self.topk,
            detach_hidden=cotrain is None,
        )  # fmt: skip
        if cotrain is not None:  # the combined loss of Cai et al. 2024 section 2.3.2: L_LM + lambda0 L_medusa
            out.target_loss, out.loss = target_loss, target_loss + cotrain.weight * out.loss
        return out


def build_heads(section: MedusaSection, target, vocab_dir=None) -> MedusaHeads:
    """Fresh heads for `target` (blocks at zero; own LM heads from the target's when asked)."""
    vocab = section.draft_vocab_size if section.reduce_vocab else None
    config = MedusaConfig.for_target(
        target,
        num_heads=section.num_heads,
        num_layers=section.num_layers,
        original_lm_head=section.original_lm_head,
        fc_bias=section.fc_bias,
        draft_vocab_size=vocab,
    )
    return finish_head(MedusaHeads(config), target, vocab, section.init_from_target, vocab_dir)


class MedusaKind:
    """What the trainer drives (train/objectives/heads.py's Eagle3Kind / MtpKind shape): `head`, `model`,
    `depth`, `batch(rows, device)`, `save_final(state, folder)`; with Medusa-2 also `peft_model` (LoRA),
    `original` (what the drift report compares with), `begin_step(step)` (lambda0) and `log_fields()`."""

    # train/objectives/registry.py's keys
    kind, label, steps_label, ttt = "medusa", "Medusa", "K={} heads", False
    memory_terms = staticmethod(medusa_terms)  # the memory preflight's terms: no attention
    steps = staticmethod(attrgetter("head.num_heads"))  # steps(cfg): K heads

    @staticmethod
    def new_head(target, aux_layers, draft_vocab: int, steps: int, cotrained: bool, options: dict):
        """A head of the right shapes (the memory preflight's); `options`: MedusaConfig's keywords."""
        return MedusaHeads(MedusaConfig.for_target(target, steps, **options))

    def __init__(self, cfg, target, aux_layers, paths):
        self.cfg, self.target, self.paths = cfg, target, paths
        section = cfg.head
        self.head = build_heads(section, target, getattr(paths, "vocab", None))  # from the original target
        self.peft_model = self.original = cotrain = None
        # Medusa-2 (train/objectives/medusa2.py)
        if getattr(cfg, "cotrain", None) is not None and cfg.cotrain.enabled:
            from draftsmith.train.objectives.medusa2 import cotrained_target

            cotrain, self.peft_model, self.original = cotrained_target(cfg, target)
        self.model = MedusaModel(self.head, target, section.labels, cfg.train.step_decay, cotrain)
        self.depth = section.num_heads

    def begin_step(self, step: int) -> None:
        """Medusa-2: lambda0 of optimizer step `step` (0-based; the trainer calls this before each step)."""
        if self.model.cotrain is not None:
            from draftsmith.train.objectives.medusa2 import medusa_weight

            self.model.cotrain.weight = medusa_weight(step, self.cfg.head)

    def log_fields(self) -> dict:
        """What a train row adds: Medusa-2's lambda0 of the step."""
        return {} if self.model.cotrain is None else {"medusa_weight": self.model.cotrain.weight}

    def batch(self, rows, device) -> dict:
        # the same inputs as MTP: ids, masks, last_hidden
        from draftsmith.train.objectives.heads import mtp_batch

        return mtp_batch(rows, device, self.target.dtype)

    def save_final(self, state: dict, folder) -> None:
        """The heads to `folder`, with per-rank accuracies measured on the validation split (the sparse
        tree's calibration) when there is one. Medusa-2: the co-trained target (adapters merged) to
        `folder/target` first, the heads bound to its weights hash and calibrated with it."""
        from pathlib import Path

        from draftsmith.train.objectives.heads import load_partial

        heads = load_partial(MedusaHeads(self.head.config), state, "heads.")
        if self.model.cotrain is not None:
            from draftsmith.train.objectives.cotrain import save_cotrained_target
            from draftsmith.train.objectives.medusa2 import bind_to_target

            where = Path(folder) / "target"
            heads = bind_to_target(heads, save_cotrained_target(self.target, self.peft_model, where), where)
        rows = self.calibration_rows()
        if rows:
            heads = with_accuracies(heads, self.calibrate(heads, rows))
        heads.save_pretrained(folder)

    def calibration_rows(self) -> list[dict]:
        from draftsmith.train.loop.data_steps import TrainRows

        n = self.cfg.head.calibration_rows
        if not n or self.paths is None:
            return []
        val = TrainRows(self.paths, "validation")
        return [val[i] for i in range(min(n, len(val)))]

    @torch.no_grad()
    def calibrate(self, heads: MedusaHeads, rows: list[dict]) -> list[list[float]]:
        """accuracies[k][i] = P(head k's rank-i token is the target's), over the rows' supervised tokens."""
        model = MedusaModel(heads.to(self.target.device), self.target, "target", 1.0)
        model.topk = self.cfg.head.calibration_topk
        hits = torch.zeros(heads.config.num_heads, model.topk, dtype=torch.float64)
        seen = torch.zeros(heads.config.num_heads, dtype=torch.float64)
        for i in range(0, len(rows), self.cfg.train.batch_size):
            out = model.objective(**self.batch(rows[i : i + self.cfg.train.batch_size], self.target.device))
            hits += out.hits.cpu()
            seen += out.counted.cpu().double()
        return (hits / seen.clamp(min=1)[:, None]).tolist()
