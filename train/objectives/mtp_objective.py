"""The MTP objective: each module m predicts token t+m+2 from (token t+m+1, h_m[t]), DeepSeek-V3 style.

    out = mtp_loss(head, target, input_ids, h0, target_logits, loss_mask, valid, labels="target")
    out.loss, out.accuracy          # sum_m decay**m * L_m; per-module argmax agreement with the target

Module m at position t is trained on the target's distribution over token t+m+2 (its logits at position
t+m+1; `labels="target"`, distillation, soft cross-entropy) or on the data's token t+m+2 (`labels="data"`,
DeepSeek's own objective). Accuracy always compares the module's argmax with the target's: that is what
a greedy verifier accepts. Positions count where token t+m+2 is supervised (loss_mask) and real (valid).
Module m >= 1 uses `mtp.module_mask`, the attention the runtime reproduces when drafting.

Co-training adds the target's own next-token loss (`next_token_loss`, on the data) to the total:
L = L_next + lambda * sum_m decay**m * L_m (DeepSeek-V3 section 2.2, lambda 0.3 early in pretraining).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from draftsmith.runtime.heads.mtp import MtpHead, module_mask
from draftsmith.train.objectives.eagle3_objective import TTTOutput


def shift(x: torch.Tensor, by: int, fill=0) -> torch.Tensor:
    """out[:, t] = x[:, t + by] (fill past the end) for [B, T, ...] tensors."""
    out = torch.full_like(x, fill)
    if by < x.shape[1]:
        out[:, : x.shape[1] - by] = x[:, by:]
    return out


def teacher_positions(loss_mask: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: positions whose next token is supervised, the only places any loss reads the
    target's logits (computing [B, T, V] everywhere would waste a third of a step on ShareGPT)."""
    return shift((loss_mask > 0) & valid, 1, False)


def mtp_loss(
    head: MtpHead,
    target,
    input_ids: torch.Tensor,  # [B, T]
    h0: torch.Tensor,  # [B, T, H] module 0's feature: head.target_feature of the target's last state
    teacher_logits: torch.Tensor,  # [N, V] the target's logits at `teacher_positions` (used detached)
    loss_mask: torch.Tensor,  # [B, T] 1 = token t is supervised
    valid: torch.Tensor,  # [B, T] False on right padding
    labels: str = "target",
    decay: float = 1.0,
) -> TTTOutput:
    length, device = input_ids.shape[1], input_ids.device
    positions = torch.arange(length, device=device)[None].expand_as(input_ids)
    sel = teacher_positions(loss_mask, valid)
    row_of = torch.full(sel.shape, -1, dtype=torch.long, device=device)  # position -> teacher row
    row_of[sel] = torch.arange(int(sel.sum()), device=device)
    teacher = teacher_logits.detach().float()
    supervised = (loss_mask > 0) & valid
    h, losses, corrects, counts = h0, [], [], []
    for m in range(head.config.num_modules):
        embeds = target.embed(shift(input_ids, m + 1))  # token t+m+1
        h = head(m, embeds, h, positions, mask=module_mask(length, m, device))  # [B, T, H]
        counted = shift(supervised, m + 2, False)  # token t+m+2 is supervised
        logits = head.logits(target, m, h[counted])  # [n, V] over token t+m+2
        rows = shift(row_of, m + 1, -1)[counted]  # the target's logits at t+m+1: its law of token t+m+2
        if labels == "target":
            ce = F.cross_entropy(logits, torch.softmax(teacher[rows], dim=-1), reduction="none")  # [n]
        else:
            ce = F.cross_entropy(logits, shift(input_ids, m + 2)[counted], reduction="none")
        n = counted.sum()
        losses.append(ce.sum() / n.clamp(min=1))
        corrects.append((logits.argmax(-1) == teacher[rows].argmax(-1)).sum())
        counts.append(n)
    step_losses = torch.stack(losses)
    weights = decay ** torch.arange(len(losses), device=device, dtype=step_losses.dtype)
    return TTTOutput((weights * step_losses).sum(), step_losses, torch.stack(corrects), torch.stack(counts))


def next_token_loss(teacher_logits: torch.Tensor, input_ids: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """The target's own language-model loss on the data: mean CE of token t+1 over the positions `sel`
    (`teacher_positions`) where the target's logits `teacher_logits` [N, V] were computed."""
    labels = shift(input_ids, 1)[sel]  # [N]
    logits = teacher_logits.to(torch.promote_types(teacher_logits.dtype, torch.float32))  # float64 stays
    return F.cross_entropy(logits, labels, reduction="sum") / max(int(sel.sum()), 1)
