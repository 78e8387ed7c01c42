"""Fitting a survival estimate's calibration: the verified slots collected pair by pair, Platt scaling
fitted to them, and the AUROC that shows the fit kept the estimate's ranking.

    pairs = SurvivalPairs()                       # passed where a SurvivalTally goes (calibration=pairs)
    pairs.add(batch, accepted)                    # per cycle: the reached nodes' (survival, accepted, depth)
    scale, shift = fit_platt(pairs.predicted(), pairs.outcome())
    calibrated = platt(pairs.predicted(), scale, shift)   # sigmoid(scale * logit(p) + shift)
    auroc(pairs.predicted(), pairs.outcome())     # the same for `calibrated`: the map is monotone

Platt scaling (Platt 1999; Guo et al. 2017's temperature scaling is its one-parameter case) maps a
prediction p to sigmoid(scale * logit(p) + shift), the two numbers chosen to minimize the binary
cross-entropy against the observed outcomes. Its loss is convex in (scale, shift), so Newton's method with a
halving line search reaches the minimum from (1, 0) (the identity) in a few steps. With scale > 0 the map is
increasing: every pair of slots keeps its order, so the AUROC (the chance that an accepted slot was
predicted above a rejected one, ties counted half) does not move; only the levels do. A DSpark head folds
the map into its confidence head's last linear layer (runtime/heads/dspark.py `platt_folded`).
The slots are calibration.py's: a drafted node whose parent was accepted, its outcome whether it was.
Tests: tests/runtime/test_recalibration.py.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.calibration import verified_slots
from draftsmith.runtime.verify.draft_batch import DraftBatch

MIN_SLOTS = 100  # fewer and two parameters are fitted to noise
EPS = 1e-6  # predictions clamped to [EPS, 1 - EPS] before the logit


class SurvivalPairs:
    """Every reached node's (survival, accepted) pair of a run and its draft depth, on the host: a
    SurvivalTally's `add`, kept slot by slot (a fit needs the pairs, the ECE only their bin sums)."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []  # [n, 3] float64 each: survival, outcome, depth

    def add(self, batch: DraftBatch, accepted: list[list[int]]) -> None:
        if batch.survival is None or batch.max_depth == 0:
            return
        s, hit, reached = verified_slots(batch, accepted)
        got = [s[reached].double(), hit[reached].double(), batch.depths[reached].double()]
        self.parts.append(torch.stack(got, dim=-1).cpu())

    def _all(self) -> torch.Tensor:
        return torch.cat(self.parts) if self.parts else torch.zeros(0, 3, dtype=torch.float64)

    def predicted(self) -> torch.Tensor:
        return self._all()[:, 0]  # [n]

    def outcome(self) -> torch.Tensor:
        return self._all()[:, 1]  # [n]

    def depths(self) -> torch.Tensor:
        return self._all()[:, 2].long()  # [n]: 1 = the first drafted token


def platt(predicted: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    """predicted [n] in [0, 1] -> sigmoid(scale * logit(p) + shift) [n] float64."""
    return torch.sigmoid(scale * torch.logit(predicted.double().clamp(EPS, 1 - EPS)) + shift)


def fit_platt(predicted: torch.Tensor, outcome: torch.Tensor, steps: int = 100) -> tuple[float, float]:
    """predicted [n] in [0, 1], outcome [n] in {0, 1} -> (scale, shift) minimizing the mean binary
    cross-entropy of `platt(predicted, scale, shift)` against `outcome` (float64 Newton steps)."""
    n = len(predicted)
    positives = int((outcome > 0.5).sum()) if n else 0
    if n < MIN_SLOTS or positives in (0, n):
        raise BadInputError(
            "calibration slots", f"{n} slots, {positives} accepted",
            f"at least {MIN_SLOTS} slots with both outcomes (more prompts or --max-new-tokens)",
        )  # fmt: skip
    x = torch.stack([torch.logit(predicted.double().clamp(EPS, 1 - EPS)), torch.ones(n, dtype=torch.float64)])
    y = outcome.double()  # [n]

    def loss(w: torch.Tensor) -> float:
        return float(torch.nn.functional.binary_cross_entropy_with_logits(w @ x, y))

    w = torch.tensor([1.0, 0.0], dtype=torch.float64)  # the identity map
    for _ in range(steps):
        p = torch.sigmoid(w @ x)  # [n]
        grad = x @ (p - y) / n  # [2]
        hess = (x * (p * (1 - p))) @ x.T / n + 1e-12 * torch.eye(2, dtype=torch.float64)  # [2, 2]
        step, before, t = torch.linalg.solve(hess, grad), loss(w), 1.0
        while loss(w - t * step) > before and t > 1e-8:  # halve until the loss does not rise
            t /= 2
        w = w - t * step
        if float((t * step).abs().max()) < 1e-10:
            break
    scale, shift = float(w[0]), float(w[1])
    if scale <= 0:  # the estimate ranks the slots backwards: no increasing map fixes that
        raise BadInputError(
            "confidence head", f"fitted scale {scale:.3g}", "a head whose survival rises with acceptance"
        )
    return scale, shift


def auroc(predicted: torch.Tensor, outcome: torch.Tensor) -> float | None:
    """The area under the ROC curve (Mann-Whitney U over average ranks, ties counted half); None when one
    outcome is absent. 0.5: no discrimination, 1: every accepted slot predicted above every rejected one."""
    pos = outcome > 0.5
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return None
    values, order = predicted.double().sort()
    _, inverse, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    average = ends - (counts.double() - 1) / 2  # 1-based average rank of each run of ties
    ranks = torch.empty_like(values)
    ranks[order] = average[inverse]
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
