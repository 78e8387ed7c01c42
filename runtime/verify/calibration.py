"""Calibration of survival estimates: the expected calibration error (ECE), the reliability bins it is read
from, per-position predicted vs observed acceptance, and a device-resident tally of a run's cycles.

    ece = expected_calibration_error(predicted, outcome)          # [n], [n] in [0, 1] -> float
    sums = CalibrationSums.of(predicted, outcome, positions, K)   # reducible sums (training's evaluation)
    tally = SurvivalTally()              # bench: generate_speculative(..., calibration=tally) calls
    tally.add(batch, accepted)           # per cycle, no host synchronization
    tally.sums.summary()                 # -> ECE, reliability bins, per position, accepted lengths

ECE (Guo et al. 2017; the same function scores the training objective and `bench`): the predictions are put
in BINS equal-width bins of [0, 1] (a prediction of exactly 1 in the last), and
    ECE = sum over bins b of (n_b / n) * |mean predicted in b - mean outcome in b|
        = sum_b |sum predicted in b - sum outcome in b| / n.
The outcome may be 0/1 (bench: was the node accepted) or a probability (training: 1 - TVD, the chance that
rejection sampling accepts the slot); either way a calibrated predictor scores 0 as n grows.

Which event is calibrated. `DraftBatch.survival` holds, per drafted node, P(node accepted | its parent was
accepted) (runtime/drafters/dspark_drafter.py, runtime/verify/adaptive.py): a CONDITIONAL probability. So a
node counts only when it was reached, i.e. its parent is the root or was accepted, and was verified (a node
the adaptive rule cut, or one past a finished row, is padding and never counts); its outcome is 1 when it
was accepted. A node after a rejection is excluded, not counted as a failure (that would calibrate a
cumulative probability, which survival is not). Training's slots are the same conditional event: slot k's
realized acceptance 1 - TVD is computed with the slots before it teacher-forced, i.e. accepted.
The predicted accepted length of a cycle is sum over its verified nodes of the product of the survivals
on the node's path (root excluded): with calibrated conditionals this is E[accepted drafted tokens], chains
and trees alike (at most one path is accepted, so the nodes' acceptance events add up to its length).

Tests: tests/runtime/test_calibration.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.runtime.verify.draft_batch import DraftBatch, to_device

BINS = 10  # equal-width bins of the prediction


def bin_sums(predicted: torch.Tensor, outcome: torch.Tensor, weight=None, bins: int = BINS) -> torch.Tensor:
    """predicted, outcome [n] in [0, 1] (weight [n]: 1 counts a slot, 0 skips it) -> [bins, 3] float64:
    per bin (slots, summed prediction, summed outcome). No host synchronization."""
    w = torch.ones_like(predicted, dtype=torch.float64) if weight is None else weight.double()
    which = (predicted.double() * bins).long().clamp(0, bins - 1)  # [n]
    cols = torch.stack([w, w * predicted.double(), w * outcome.double()], dim=-1)  # [n, 3]
    return torch.zeros(bins, 3, dtype=torch.float64, device=predicted.device).index_add_(0, which, cols)


def ece_of(bins: torch.Tensor) -> float:
    """[bins, 3] sums (bin_sums) -> the ECE; 0 for no slots."""
    n = float(bins[:, 0].sum())
    return 0.0 if n == 0 else float((bins[:, 1] - bins[:, 2]).abs().sum()) / n


def expected_calibration_error(predicted: torch.Tensor, outcome: torch.Tensor, bins: int = BINS) -> float:
    """predicted, outcome [n] in [0, 1] -> sum over equal-width bins of the prediction of (share of slots)
    * |mean predicted - mean outcome| (module docstring)."""
    return ece_of(bin_sums(predicted.flatten(), outcome.flatten(), bins=bins))


@dataclass
class CalibrationSums:
    """Additive sums of a calibration measurement (on any device; `+` pools two, across ranks they
    all-reduce as one tensor): per prediction bin and per draft position (slots, summed prediction,
    summed outcome), and per cycle-row (rows with a verified draft, summed predicted accepted length,
    summed accepted length; bench only)."""

    bins: torch.Tensor  # [BINS, 3] float64
    positions: torch.Tensor  # [K, 3] float64: position k + 1's (slots, predicted, outcome)
    lengths: torch.Tensor = field(default_factory=lambda: torch.zeros(3, dtype=torch.float64))  # [3]

    @staticmethod
    def of(predicted, outcome, positions, depth: int, weight=None, bins: int = BINS) -> CalibrationSums:
        """Flat predicted, outcome [n], positions [n] (0-based draft position, < depth), weight [n] or None
        -> the sums (no host synchronization)."""
        w = torch.ones_like(predicted, dtype=torch.float64) if weight is None else weight.double()
        cols = torch.stack([w, w * predicted.double(), w * outcome.double()], dim=-1)  # [n, 3]
        per = torch.zeros(depth, 3, dtype=torch.float64, device=predicted.device)
        per.index_add_(0, positions.clamp(0, depth - 1), cols)
        lengths = torch.zeros(3, dtype=torch.float64, device=predicted.device)
        return CalibrationSums(bin_sums(predicted, outcome, w, bins), per, lengths)

    def __add__(self, other: CalibrationSums) -> CalibrationSums:
        depth = max(len(self.positions), len(other.positions))
        return CalibrationSums(
            self.bins + other.bins.to(self.bins.device),
            _widen(self.positions, depth) + _widen(other.positions, depth).to(self.bins.device),
            self.lengths + other.lengths.to(self.bins.device),
        )

    def flat(self) -> torch.Tensor:
        """One tensor (for an all-reduce): bins, lengths, positions."""
        return torch.cat([self.bins.flatten(), self.lengths, self.positions.flatten()])

    @staticmethod
    def from_flat(flat: torch.Tensor, bins: int = BINS) -> CalibrationSums:
        head = 3 * bins + 3
        return CalibrationSums(flat[: 3 * bins].view(bins, 3), flat[head:].view(-1, 3), flat[3 * bins : head])

    def cpu(self) -> CalibrationSums:
        return CalibrationSums(self.bins.cpu(), self.positions.cpu(), self.lengths.cpu())

    def summary(self, digits: int = 4) -> dict:
        """The host report (one transfer): ECE, the slots counted, the reliability bins, per position the
        mean prediction and outcome, and (with cycle-rows) the predicted and observed mean accepted
        length."""
        bins, per, lengths = self.bins.cpu().tolist(), self.positions.cpu().tolist(), self.lengths.tolist()
        width = 1.0 / len(bins)

        def mean(total: float, n: float) -> float | None:
            return None if n == 0 else round(total / n, digits)

        out = {
            "calibration_error": round(ece_of(self.bins.cpu()), digits),
            "calibration_slots": int(sum(b[0] for b in bins)),
            "reliability": [
                {
                    "bin": [round(i * width, 4), round((i + 1) * width, 4)],
                    "count": int(n),
                    "predicted": mean(p, n),
                    "observed": mean(o, n),
                }
                for i, (n, p, o) in enumerate(bins)
            ],  # fmt: skip
            "predicted_accept_per_position": [mean(p, n) for n, p, _ in per],
            "observed_accept_per_position": [mean(o, n) for n, _, o in per],
            "calibration_slots_per_position": [int(n) for n, _, _ in per],
        }
        if lengths[0]:
            out["predicted_mean_accepted_length"] = mean(lengths[1], lengths[0])
            out["observed_mean_accepted_length"] = mean(lengths[2], lengths[0])
        return out


def _widen(per: torch.Tensor, depth: int) -> torch.Tensor:
    return torch.cat([per, per.new_zeros(depth - len(per), 3)]) if len(per) < depth else per


def verified_slots(batch: DraftBatch, accepted: list[list[int]]) -> tuple[torch.Tensor, ...]:
    """A verified batch with survival and each row's accepted node ids -> survival [B, N] in [0, 1], hit
    [B, N] (accepted, roots included) and reached [B, N] (a drafted node whose parent was accepted: the
    slots that count, module docstring), on the batch's device."""
    rows, nodes = batch.tokens.shape
    hit = torch.zeros(rows, nodes, dtype=torch.bool)  # [B, N] host: accepted nodes and the roots
    hit[:, 0] = True
    for b, path in enumerate(accepted):
        hit[b, path] = True
    hit = to_device(hit, batch.device)
    reached = (batch.parents >= 0) & hit.gather(1, batch.parents.clamp(min=0))  # the parent was accepted
    return batch.survival.float().clamp(0.0, 1.0), hit, reached


@dataclass
class SurvivalTally:
    """The calibration of a run's `DraftBatch.survival` against what verification accepted, summed on the
    device cycle by cycle (module docstring: the conditional event); cycles without survival are skipped."""

    bins: int = BINS
    sums: CalibrationSums | None = None

    def add(self, batch: DraftBatch, accepted: list[list[int]]) -> None:
        """The verified batch (after any adaptive cut) and each row's accepted node ids (the verdicts)."""
        if batch.survival is None or batch.max_depth == 0:
            return
        s, hit, reached = verified_slots(batch, accepted)
        drafted = batch.parents >= 0  # [B, N]
        cycle = CalibrationSums.of(
            s.flatten(), hit.flatten(), (batch.depths - 1).flatten(), batch.max_depth, reached.flatten(),
            self.bins,
        )  # fmt: skip
        logs = torch.where(drafted, s.clamp(min=1e-30).log(), torch.zeros_like(s))  # [B, N]
        path = torch.einsum("bia,ba->bi", batch.ancestors.float(), logs).exp() * drafted  # [B, N]
        some = drafted.any(dim=1).double()  # [B]: rows that verified a draft
        got = (hit & drafted).sum(dim=1).double()  # [B] accepted drafted tokens
        cycle.lengths = torch.stack([some.sum(), path.sum(dim=1).double().sum(), (got * some).sum()])
        self.sums = cycle if self.sums is None else self.sums + cycle
