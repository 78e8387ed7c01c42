"""The DFlash objective (arXiv 2602.06036, as speculators 0.9.0 implements it in models/dflash): blocks at
random anchors, every position of a block predicted in one forward, a position-weighted loss.

    out = dflash_loss(head, target.embed, batch, target_logits=target.logits, max_anchors=32, gamma=7.0)
    out.loss.backward()       # gradients reach the head's fc, norms and layers (embedding, LM head frozen)
    out.accuracy              # [S-1] per block position: the head's argmax = the target's
    kind = DFlashKind(cfg, target, aux_layers, paths)   # what the trainer drives (train/objectives/heads.py's
    shape)

Per row, up to `max_anchors` anchor positions a are drawn at random among the positions whose next token
is supervised (speculators' `select_anchors`). Block j holds the anchor's token input_ids[a] and S - 1
mask tokens at positions a .. a + S - 1; its queries see the target's fused features of positions < a
(the drafter's context: every committed token before the anchor) and their whole block, bidirectionally
(speculators' `create_anchor_block_mask_mod`), one dense boolean mask for SDPA. Block position k >= 1 is
scored against the target's distribution at position a + k - 1 (over token a + k), counted where that
token is supervised, inside the row and its target argmax is a draft-vocabulary token (EAGLE-3's rule
here). Loss: soft cross-entropy over the draft vocabulary (the gradient of speculators' default kl_div)
weighted exp(-(k - 1) / gamma) (speculators' `dflash_loss_decay`; the paper: gamma 7 for S = 16), summed
and divided by the number of counted positions (speculators' reduction). Accuracy per block position and
the simulated tau of the trainer (1 + sum_k prod_{j<=k} acc_j) are the evaluation's; `accepted_length`
is speculators' `eal` (each block's run of leading correct positions + 1, correlations kept).
Tests: tests/train/test_dflash_objective.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from draftsmith.runtime.heads.dflash import DFlashConfig, DFlashHead
from draftsmith.train.objectives.eagle3_objective import TTTBatch, TTTOutput, target_distributions
from draftsmith.train.objectives.head_init import finish_head
from draftsmith.train.preflight.dflash_memory import dflash_terms


@dataclass
class DFlashOutput(TTTOutput):
    accepted_length: float = 1.0  # mean over counted blocks of (leading correct positions + 1)


def select_anchors(eligible: torch.Tensor, count: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """eligible [B, T] bool -> anchors [B, A] (sorted; A = min(count, most eligible in a row)) and
    anchor_valid [B, A]: a uniform random subset of each row's eligible positions."""
    rows = []
    for row in eligible:
        where = row.nonzero().flatten()
        pick = torch.randperm(len(where), generator=generator, device="cpu")[:count].to(where.device)
        rows.append(where[pick].sort().values)
    width = max(1, max(len(r) for r in rows))
    anchors = eligible.new_zeros(len(rows), width, dtype=torch.long)
    valid = eligible.new_zeros(len(rows), width)
    for b, r in enumerate(rows):
        anchors[b, : len(r)], valid[b, : len(r)] = r, True
    return anchors, valid


def anchor_mask(
    anchors: torch.Tensor, valid: torch.Tensor, block: int, window: int | None = None
) -> torch.Tensor:
    """[B, 1, A*S, T + A*S]: block j's queries see valid context positions < anchors[j] (and >= anchors[j] -
    window with a sliding window, speculators' `in_window`) and block j."""
    batch, count = anchors.shape
    length = valid.shape[1]
    query_anchor = anchors.repeat_interleave(block, dim=1)  # [B, Q]
    context = torch.arange(length, device=anchors.device)[None, None] < query_anchor[..., None]  # [B, Q, T]
    if window is not None:
        context &= torch.arange(length, device=anchors.device)[None, None] >= query_anchor[..., None] - window
    context &= valid[:, None, :]
    blocks = torch.arange(count * block, device=anchors.device) // block
    own = (blocks[:, None] == blocks[None, :]).expand(batch, -1, -1)  # [B, Q, Q]
    return torch.cat([context, own], dim=-1)[:, None]


@dataclass
class Blocks:
    """One step's blocks, as the loss reads them: n counted slots of the [B, Q = A*S] block queries."""

    h: torch.Tensor  # [B, Q, H] the last layer's output, pre-norm
    picked: torch.Tensor  # [B, Q] bool: the counted slots
    goal: torch.Tensor  # [n, Vd] the target's distribution at each counted slot
    slot: torch.Tensor  # [n] each counted slot's block position k >= 1
    counted: torch.Tensor  # [B, A, S] bool
    prev: torch.Tensor  # [n] the token before each counted slot's label (the anchor's for k = 1)


def dflash_loss(
    head: DFlashHead,
    embed,
    batch: TTTBatch,
    *,
    target_logits,  # the target's pre-norm hidden [N, Ht] -> logits [N, V] (Target.logits)
    max_anchors: int = 32,
    gamma: float = 7.0,
    logit_chunk: int = 1024,
    generator: torch.Generator | None = None,
) -> DFlashOutput:
    b = dflash_blocks(head, embed, batch, target_logits, max_anchors, logit_chunk, generator)
    logits = head.draft_logits(b.h[b.picked])  # [n, Vd]
    ce = -(b.goal * F.log_softmax(logits, dim=-1)).sum(-1)  # [n]
    weights = torch.exp(-(b.slot - 1).to(ce.dtype) / gamma)
    loss = (weights * ce).sum() / b.picked.sum().clamp(min=1)
    return block_output(loss, logits, ce, b, head.config.block_size)


def block_output(loss, logits: torch.Tensor, ce: torch.Tensor, b: Blocks, size: int) -> DFlashOutput:
    """The evaluation's counts per block position of the counted slots' logits [n, Vd] and losses [n]."""
    right = logits.argmax(-1) == b.goal.argmax(-1)  # [n]
    device = logits.device
    correct = torch.zeros(size, dtype=torch.long, device=device).index_add_(0, b.slot, right.long())[1:]
    counts = torch.bincount(b.slot, minlength=size)[1:]
    step_losses = torch.zeros(size, dtype=ce.dtype, device=device).index_add_(0, b.slot, ce.detach())[1:]
    step_losses = step_losses / counts.clamp(min=1)
    return DFlashOutput(loss, step_losses, correct, counts, accepted_length(b.counted, right))


def dflash_blocks(
    head: DFlashHead, embed, batch: TTTBatch, target_logits, max_anchors, logit_chunk, generator
) -> Blocks:
    """The anchors drawn, the blocks built and forwarded, the counted slots and their targets."""
    ids, size = batch.input_ids, head.config.block_size
    batch_size, length = ids.shape
    device = ids.device
    valid = torch.ones_like(ids, dtype=torch.bool) if batch.valid is None else batch.valid
    supervised = (batch.loss_mask > 0) & valid  # [B, T]
    eligible = torch.zeros_like(supervised)
    eligible[:, :-1] = supervised[:, 1:]  # an anchor whose next token is supervised
    anchors, anchor_valid = select_anchors(eligible, max_anchors, generator)  # [B, A]
    count = anchors.shape[1]
    offsets = torch.arange(size, device=device)
    positions = anchors[..., None] + offsets  # [B, A, S]: the block's positions (label token of slot k)
    inside = positions < length
    # the target's distributions where some slot reads them: position p scores the slot predicting p + 1
    read = torch.zeros_like(supervised)
    read[:, :-1] = supervised[:, 1:]
    probs, in_vocab = target_distributions(head, target_logits, batch.target_hidden[read], logit_chunk)
    row_of = read.flatten().cumsum(0).view_as(read) - 1  # [B, T] row of p in probs (where read)
    clamped = positions.clamp(max=length - 1)
    teacher_pos = (positions - 1).clamp(0, length - 1)  # slot k >= 1 reads the target at a + k - 1
    gathered = lambda t, p: t.gather(1, p.flatten(1)).view_as(p)  # noqa: E731 [B, T] at [B, A, S]
    counted = anchor_valid[..., None] & inside & gathered(supervised, clamped) & (offsets >= 1)
    counted &= gathered(read, teacher_pos)  # [B, A, S]
    rows = gathered(row_of, teacher_pos).clamp(min=0)
    counted[counted.clone()] &= in_vocab[rows[counted]]  # the target's argmax is a draft token
    # the blocks: the anchor's token, then masks; every layer attends to the fused target features
    tokens = torch.full((batch_size, count, size), head.config.mask_token_id, dtype=torch.long, device=device)
    tokens[..., 0] = ids.gather(1, anchors)
    with torch.no_grad():  # the target's embedding is frozen
        embeds = embed(tokens.flatten(1))  # [B, Q, H]
    fused = head.fuse(batch.features)  # [B, T, H]
    keys, values = head.context_kv(fused, torch.arange(length, device=device)[None].expand(batch_size, -1))
    mask = anchor_mask(anchors, valid, size, head.config.window)
    h = head(embeds, positions.flatten(1), keys, values, mask)  # [B, Q, H]
    picked = counted.flatten(1)  # [B, Q]
    goal = probs[rows.flatten(1)[picked]]  # [n, Vd]
    slot = offsets.expand_as(positions).flatten(1)[picked]  # [n] block position k of each
    prev = gathered(ids, (positions - 1).clamp(0, length - 1)).flatten(1)[picked]  # [n] token a + k - 1
    return Blocks(h, picked, goal, slot, counted, prev)


def accepted_length(counted: torch.Tensor, right: torch.Tensor) -> float:
    """speculators' eal: per block with a counted slot, its leading run of counted correct slots + 1."""
    hits = torch.zeros_like(counted)
    hits[counted] = right
    run = hits[..., 1:].long().cumprod(-1).sum(-1).double() + 1  # [B, A]
    used = counted.any(-1)
    return float(run[used].mean()) if bool(used.any()) else 1.0


class DFlashModel(nn.Module):
    """The head and its objective as one module (what Accelerate prepares); the frozen target's
    embedding and logits are used but deliberately not submodules."""

    def __init__(self, head: DFlashHead, embed, target_logits, max_anchors: int, gamma: float, chunk: int):
        super().__init__()
        self.head, self.max_anchors, self.gamma, self.chunk = head, max_anchors, gamma, chunk
        self._frozen = [embed, target_logits]

    def forward(self, input_ids, features, target_hidden, loss_mask, valid):
        """-> (loss, correct [S-1], counted [S-1])"""
        embed, target_logits = self._frozen
        batch = TTTBatch(input_ids, features, target_hidden, loss_mask, valid)
        out = dflash_loss(
            self.head, embed, batch, target_logits=target_logits, max_anchors=self.max_anchors,
            gamma=self.gamma, logit_chunk=self.chunk,
        )  # fmt: skip
        return out.loss, out.correct, out.counted


def build_head(cfg, target, aux_layers, vocab_dir=None) -> DFlashHead:
    """A fresh head for `target`: the LM head rows and final norm from the target's, the rest random."""
    section = cfg.head
    vocab = section.draft_vocab_size if section.reduce_vocab else None
    head = DFlashKind.new_head(
        target, aux_layers, vocab or target.vocab_size, 0, False, section.head_options()
    )
    return finish_head(head, target, vocab, section.init_from_target, vocab_dir)


class DFlashKind:
    """What the trainer drives (train/objectives/heads.py's Eagle3Kind shape): `head`, `model`, `depth` (= S -
    1 accuracy slots: one per block position), `batch(rows, device)`, `save_final(state, folder)`."""

    # train/objectives/registry.py
    kind, label, steps_label, ttt = "dflash", "DFlash", "block of {} + 1", False
    memory_terms = staticmethod(dflash_terms)  # the memory preflight's terms: batch, block queries

    @staticmethod
    def steps(cfg) -> int:
        return cfg.head.block_size - 1

    @staticmethod
    def new_head(target, aux_layers, draft_vocab: int, steps: int, cotrained: bool, options: dict):
        options = {k: v for k, v in options.items() if k != "max_anchors"}
        # the memory preflight passes no aux layers (ttt=False): count three taps, the default's number
        aux = list(aux_layers) or list(range(min(3, target.num_layers)))
        return DFlashHead(DFlashConfig.for_target(target, aux, draft_vocab, **options))

    def __init__(self, cfg, target, aux_layers, paths):
        self.target, self.aux = target, aux_layers
        self.head = build_head(cfg, target, aux_layers, getattr(paths, "vocab", None))
        h, t = cfg.head, cfg.train
        self.model = DFlashModel(
            self.head, target.embed, target.logits, h.max_anchors, h.loss_gamma, t.logit_chunk
        )
        self.depth = h.block_size - 1

    def batch(self, rows, device) -> dict:
        # EAGLE-3's inputs: ids, fused aux, last states, masks
        from draftsmith.train.objectives.heads import make_batch

        return make_batch(self.target, rows, self.aux, device)

    def save_final(self, state: dict, folder) -> None:
        from draftsmith.train.objectives.heads import load_partial

        load_partial(DFlashHead(self.head.config), state, "head.").save_pretrained(folder)
