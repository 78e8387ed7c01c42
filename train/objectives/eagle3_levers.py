"""The EAGLE-3 objective's training levers (issue 25): the distillation loss, a training-time-test schedule,
per-step weights and noise on the target's hidden states. Config keys, all off by default:

    head.loss=kl|rkl|jsd|tv|lk_hybrid   # train/objectives/draft_losses.py; kl = the soft cross-entropy as
    before head.ttt_schedule="3,7@0.3"          # 3 TTT steps, then 7 from 30% of train.max_steps
    head.ttt_weights=[1,0.8,0.64]        # one loss weight per TTT step, instead of train.step_decay**k
    train.noise_std=0.05                 # N(0, std^2) added to the aux features the head reads (training)

Schedule syntax: comma-separated stages `K` or `K@F`; the first stage starts at 0 (no `@`, or `@0`), each
later one at the fraction F of train.max_steps (0 < F < 1, increasing): optimizer step s (0-based) runs
the last stage whose start ceil(F * max_steps) <= s. Every K is in [1, train.ttt_steps]. Fewer early steps
is speculators' default (3) at a fraction of the unroll's cost; evaluation always scores all
train.ttt_steps steps, so validation rows stay comparable across stages and runs. The trainer logs the
stage's step count as `ttt_steps` in every train row of metrics.jsonl.

Weights: train.ttt_steps numbers >= 0, not all 0; a stage with K steps uses the first K. Noise: EAGLE
(Li et al. 2024, arXiv:2401.15077) trains on target features with added noise so that the head tolerates
the error of its own features at later steps; speculators' `--noise-std` defaults to 0.05. It is absolute
(the features are the raw aux hidden states) and applied in training forwards only, never in evaluation.

`divergence_loss` applies a draft_losses loss to the counted rows of one TTT step, in chunks recomputed in
backward (`over_chunks`, which the objective's soft cross-entropy, eagle3_objective.py `soft_ce`, shares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from draftsmith.runtime.errors import BadInputError
from draftsmith.train.objectives.draft_losses import combine, per_position

SCHEDULE_SYNTAX = "stages K or K@F (e.g. 3,7@0.3): K TTT steps from the fraction F of train.max_steps"


# ---- config -------------------------------------------------------------------------------------------
def parse_ttt_schedule(text: str, ttt_steps: int) -> tuple[tuple[float, int], ...]:
    """'3,7@0.3' -> ((0.0, 3), (0.3, 7)); '' -> () (every step runs train.ttt_steps)."""
    field = "head.ttt_schedule"
    if not text.strip():
        return ()
    stages = []
    for item in text.split(","):
        count, _, start = item.strip().partition("@")
        try:
            stage = (float(start) if start else 0.0, int(count))
        except ValueError:
            raise BadInputError(field, text, SCHEDULE_SYNTAX) from None
        stages.append(stage)
    fractions = [f for f, _ in stages]
    if fractions[0] != 0 or not all(0 < f < 1 for f in fractions[1:]) or fractions != sorted(set(fractions)):
        raise BadInputError(field, text, f"{SCHEDULE_SYNTAX}; the first from 0, then 0 < F < 1 increasing")
    if not all(1 <= k <= ttt_steps for _, k in stages):
        raise BadInputError(field, text, f"stages of 1 to train.ttt_steps={ttt_steps} TTT steps")
    return tuple(stages)


def check_weights(weights, ttt_steps: int) -> None:
    field = "head.ttt_weights"
    if weights is None:
        return
    if len(weights) != ttt_steps:
        raise BadInputError(field, list(weights), f"{ttt_steps} weights, one per TTT step (train.ttt_steps)")
    if any(w < 0 or not math.isfinite(w) for w in weights) or not any(w > 0 for w in weights):
        raise BadInputError(field, list(weights), "finite weights >= 0, at least one > 0")


def check_config(cfg) -> None:
    """The levers against the train config (TrainConfig.validate): exit code 2 naming the key."""
    t = cfg.train
    if t.noise_std < 0 or not math.isfinite(t.noise_std):
        raise BadInputError("train.noise_std", t.noise_std, "a standard deviation >= 0 (0 = off)")
    if cfg.head.type != "eagle3":
        if t.noise_std > 0:
            raise BadInputError(
                "train.noise_std", t.noise_std, f"0 for head.type={cfg.head.type} (eagle3 only)"
            )
        return
    parse_ttt_schedule(cfg.head.ttt_schedule, t.ttt_steps)
    check_weights(cfg.head.ttt_weights, t.ttt_steps)


@dataclass(frozen=True)
class Levers:
    """The levers of one run, resolved against train.max_steps."""

    loss: str = "kl"
    weights: tuple[float, ...] | None = None  # [train.ttt_steps]; None = step_decay**k
    noise_std: float = 0.0
    stages: tuple[tuple[int, int], ...] = ()  # (first optimizer step, TTT steps); () = always ttt_steps

    @classmethod
    def from_config(cls, cfg) -> Levers:
        head, t = cfg.head, cfg.train
        stages = parse_ttt_schedule(head.ttt_schedule, t.ttt_steps)
        starts = tuple((math.ceil(f * t.max_steps - 1e-9), k) for f, k in stages)  # 0.3 * 10 = 3.0000...04
        weights = None if head.ttt_weights is None else tuple(float(w) for w in head.ttt_weights)
        return cls(head.loss, weights, float(t.noise_std), starts)

    def steps_at(self, step: int, default: int) -> int:
        """TTT steps of optimizer step `step` (0-based)."""
        active = default
        for start, k in self.stages:
            if step >= start:
                active = k
        return active


# ---- the loss of one TTT step -------------------------------------------------------------------------
def _parts_chunk(name: str, head, probs: torch.Tensor, h: torch.Tensor, rows: torch.Tensor):
    """h [C, H] outputs, rows [C] their targets' rows of probs -> (parts summed [P], argmax matches)."""
    logits = head.draft_logits(h)  # [C, Vd]
    target = probs[rows]  # [C, Vd]
    parts = per_position(name, target, logits.to(torch.promote_types(logits.dtype, torch.float32)))
    return parts.sum(0), (logits.argmax(-1) == target.argmax(-1)).sum()


def over_chunks(fn, fixed: tuple, h: torch.Tensor, rows: torch.Tensor, chunk: int) -> tuple[list, list]:
    """fn(*fixed, h part, rows part) -> (a, b) over `chunk` rows of h [n, H] at a time -> ([a], [b]); with
    gradients each chunk is recomputed in backward instead of kept (its logits are the big tensor)."""
    firsts, seconds = [], []
    for start in range(0, max(len(h), 1), chunk):  # one (empty) chunk when n = 0 keeps the graph whole
        part = (*fixed, h[start : start + chunk], rows[start : start + chunk])
        if torch.is_grad_enabled():
            a, b = checkpoint(fn, *part, use_reentrant=False)
        else:
            a, b = fn(*part)
        firsts.append(a)
        seconds.append(b)
    return firsts, seconds


def divergence_loss(
    name: str, head, h: torch.Tensor, rows: torch.Tensor, probs: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss `name` (train/objectives/draft_losses.py) averaged over the counted outputs h [n, H] against
    probs[rows], `chunk` rows at a time (each chunk's logits recomputed in backward) -> (scalar loss, argmax
    matches)."""
    sums, corrects = over_chunks(_parts_chunk, (name, head, probs), h, rows, chunk)
    means = torch.stack(sums).sum(0) / max(len(h), 1)  # [P]
    return combine(name, means), torch.stack(corrects).sum()


def pad_steps(values: torch.Tensor, steps: int) -> torch.Tensor:
    """[K'] per-step counts of a stage with K' <= steps TTT steps -> [steps] (zeros for the steps not run)."""
    return torch.cat([values, values.new_zeros(steps - len(values))])
