"""Per-position distillation losses between the target's distribution p and the draft's q (pure torch).

    parts = per_position("lk_hybrid", p, logits)   # p [N, V] rows summing to 1, logits [N, V] -> [N, P]
    loss = combine("lk_hybrid", parts.mean(0))     # the loss of the N positions (a scalar)
    divergence("tv", p, logits)                     # the two together

p is the target's distribution restricted to the draft vocabulary and renormalized
(train/objectives/eagle3_objective.py `draft_targets`), q = softmax(logits) the head's. alpha = sum_v min(p_v,
q_v) is the probability that speculative sampling accepts the drafted token (Leviathan et al. 2023,
arXiv:2211.17192, section 3.4), so 1 - alpha is what an acceptance-driven loss minimizes. The losses, natural
logs, per position:

- `kl`: forward KL(p || q) = sum p (log p - log q), mass-covering (EAGLE-3, SpecForge, speculators'
  default). It is the soft cross-entropy the objective always used minus the target's entropy H(p), which
  carries no gradient: the objective keeps computing the cross-entropy for `kl` (its logged loss unchanged)
  and tests check the two give equal gradients.
- `rkl`: reverse KL(q || p) = sum q (log q - log p), mode-seeking. A target probability that underflowed to
  0 counts as the smallest normal number of its dtype (rkl would be infinite otherwise).
- `jsd`: Jensen-Shannon, (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2; symmetric, at most log 2.
- `tv`: total variation, 1 - alpha = sum |p - q| / 2: 1 - the acceptance probability. d/dq_v is -1 where
  q_v < p_v and 0 where q_v > p_v: it does not care how far q is from p, so it learns slowly from a cold
  start (speculators' docs say the same).
- `lk_hybrid`: the LK loss of arXiv:2602.23881 (sections 4.2, 4.4, as NVIDIA ModelOpt's
  `masked_lk_lambda_loss` and speculators' `lk_hybrid` implement it): lambda * KL + (1 - lambda) * TV with
  lambda = exp(-eta * alpha_bar), eta = 3, alpha_bar the mean acceptance over the positions of one call (one
  TTT step of one micro-batch), detached. It is a schedule by the head's own progress, not by step count:
  a fresh head (alpha ~ 0) trains on KL, one that already agrees (alpha -> 1) mostly on TV.

`per_position` returns the parts a loss is made of (lk_hybrid: KL and TV; the others: themselves), so a
caller can sum them over chunks of rows first and `combine` their means once (lambda needs the mean).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

LOSSES = ("kl", "rkl", "jsd", "tv", "lk_hybrid")
LK_ETA = 3.0  # arXiv:2602.23881's decay of lambda in the acceptance (speculators', ModelOpt's default)


def _log_q(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_q = F.log_softmax(logits, dim=-1)  # [N, V]
    return log_q, log_q.exp()


def kl(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) [N]; 0 * log 0 = 0 where p_v = 0."""
    log_q, _ = _log_q(logits)
    return (torch.xlogy(p, p) - p * log_q).sum(-1)


def rkl(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(q || p) [N]; p clamped at the dtype's smallest normal number so that it stays finite."""
    log_q, q = _log_q(logits)
    log_p = p.clamp_min(torch.finfo(p.dtype).tiny).log()
    return (q * (log_q - log_p)).sum(-1)


def jsd(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """(KL(p || m) + KL(q || m)) / 2 [N], m = (p + q) / 2. In log space: a q_v that underflows to 0 in
    float32 would make xlogy(q, m)'s gradient 0 / 0; log q and log m = logaddexp(log p, log q) - log 2 stay
    finite (log p = -inf where p_v = 0 is fine: p carries no gradient)."""
    log_q, q = _log_q(logits)
    log_m = torch.logaddexp(p.log(), log_q) - math.log(2)
    return 0.5 * (torch.xlogy(p, p) - p * log_m + q * (log_q - log_m)).sum(-1)


def acceptance(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """alpha = sum_v min(p_v, q_v) [N]: speculative sampling's acceptance probability of a draft from q."""
    _, q = _log_q(logits)
    return torch.minimum(p, q).sum(-1)


def tv(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """1 - alpha [N] (= sum |p - q| / 2 when both rows sum to 1)."""
    return 1 - acceptance(p, logits)


def lk_lambda(tv_mean: torch.Tensor, eta: float = LK_ETA) -> torch.Tensor:
    """lambda = exp(-eta * alpha_bar), alpha_bar = 1 - mean TV, detached (one blend weight per call)."""
    return torch.exp(-eta * (1 - tv_mean.detach()))


PER_POSITION = {"kl": (kl,), "rkl": (rkl,), "jsd": (jsd,), "tv": (tv,), "lk_hybrid": (kl, tv)}


def check_loss(name: str) -> None:
    if name not in LOSSES:
        raise ValueError(f"loss={name!r}: one of {LOSSES}")


def per_position(name: str, p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The parts of loss `name` per position [N, P] (P = 2 for lk_hybrid: KL, TV; else 1)."""
    check_loss(name)
    return torch.stack([part(p, logits) for part in PER_POSITION[name]], dim=-1)


def combine(name: str, part_means: torch.Tensor) -> torch.Tensor:
    """The loss from its parts' means over the positions [P] -> scalar."""
    if name == "lk_hybrid":
        kl_mean, tv_mean = part_means[0], part_means[1]
        lam = lk_lambda(tv_mean)
        return lam * kl_mean + (1 - lam) * tv_mean
    return part_means[0]


def divergence(name: str, p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Loss `name` averaged over the N rows of p [N, V] and logits [N, V] (0 for N = 0)."""
    parts = per_position(name, p, logits)  # [N, P]
    means = parts.sum(0) / max(len(p), 1)
    return combine(name, means)
