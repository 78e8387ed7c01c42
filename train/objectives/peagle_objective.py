"""The P-EAGLE objective (arXiv 2602.01469): all K positions of a block predicted from one context, the
positions beyond the first fed the head's learned mask inputs, as drafting does.

    out = peagle_loss(head, target.embed, batch, target_logits=target.logits)   # batch: a TTTBatch
    out.loss.backward()                      # sum_d w_d * CE_d, gradients reach the head only
    out.accuracy, out.simulated_tau          # [K] top-1 agreement per block position, the block's tau
    kind = PEagleKind(cfg, target, aux_layers, paths)   # what the trainer drives
    (train/objectives/registry.py)

Every position t of a sequence anchors a block, as in the paper and speculators' `PEagleDraftModel`:
depth 0 is the pair (token t+1, fc(F_t)) at position t (predicts token t+2, EAGLE-3's step 0); depth
d >= 1 is the mask input (mask_embed, fc(mask_hidden)) at position t+d and predicts token t+d+2. Depth d
of anchor t attends to the depth-0 keys at positions <= t (the committed context) and to the depth 1..d
keys of its own anchor (speculators' `create_peagle_mask_mod`: kv depth 0 and anchor-causal, or the same
rollout and a lower depth). That is exactly the training-time-test attention of
train/objectives/eagle3_objective.py (step-0 keys causal, step-j keys on the diagonal), so the K depths run as
K calls of the head on a `TTTCache` (its decomposed attention, no [KT, KT] mask); unlike EAGLE-3's unroll no
depth reads another's output, only its keys. `peagle_loss_dense` is the same loss as one forward over the K*T
inputs with the explicit block mask (the paper's single pass), the oracle tests compare against.

Loss per depth: soft cross-entropy to the target's distribution over token t+d+2 (its logits at t+d+1)
restricted to the draft vocabulary, on supervised positions whose target argmax is a draft token (the
EAGLE-3 rule), weighted train.step_decay**d (1.0 in the recipe: speculators weighs every sampled position
alike). Not implemented: the paper's conditional token drop (COD: depth d trained on a random r^d share
of the anchors). It saves memory by dropping queries from the one packed sequence; with the decomposed
attention the K calls already cost K x EAGLE-3's step 0 and dropping anchors would need gathers per
depth, so every anchor trains every depth.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

import torch
from torch import nn

from draftsmith.runtime.heads.peagle import PEagleConfig, PEagleHead
from draftsmith.train.objectives.eagle3_objective import (
    TTTBatch,
    TTTCache,
    TTTOutput,
    dense_step_losses,
    soft_ce,
    target_reads,
)
from draftsmith.train.objectives.head_init import copy_target_output, draft_ids
from draftsmith.train.preflight.eagle3_memory import eagle3_terms


def depth_inputs(head: PEagleHead, embed, input_ids: torch.Tensor, features: torch.Tensor, depth: int):
    """The inputs of depth `depth` at every anchor -> (embeddings [B, T, H], features [B, T, H])."""
    batch, length = input_ids.shape
    if depth > 0:
        return head.mask_inputs(batch, length)
    tokens = torch.zeros_like(input_ids)  # pair t reads token t+1 (0 past the end: never counted)
    tokens[:, : length - 1] = input_ids[:, 1:]
    with torch.no_grad():  # the target's embedding is reused and frozen
        embeds = embed(tokens)
    return embeds.to(features.dtype), head.fuse(features)


def unroll_block(head: PEagleHead, embed, input_ids: torch.Tensor, features: torch.Tensor, depths: int):
    """Yield the head's output [B, T, H] at depths 0..depths-1 (depth d at anchor t predicts t+d+2)."""
    cache = TTTCache()
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
    for d in range(depths):
        embeds, feature = depth_inputs(head, embed, input_ids, features, d)
        yield head(embeds, feature, positions + d, cache.at(d))


def counted_at(supervised: torch.Tensor, in_vocab_at: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, T]: anchors t whose depth-d prediction is scored (token t+d+2 supervised, its argmax drafted)."""
    length = supervised.shape[1]
    counted = torch.zeros_like(supervised)
    counted[:, : max(length - depth - 2, 0)] = supervised[:, depth + 2 :]
    width = max(length - depth - 1, 0)
    counted[:, :width] &= in_vocab_at[:, depth + 1 :]
    return counted


def peagle_loss(
    head: PEagleHead,
    embed,
    batch: TTTBatch,
    depths: int | None = None,  # K (default: the head's block size)
    decay: float = 1.0,
    *,
    target_logits: Callable,  # the target's pre-norm hidden [N, Ht] -> logits [N, V] (Target.logits)
    logit_chunk: int = 1024,
) -> TTTOutput:
    depths = depths or head.block_size
    ids = batch.input_ids
    supervised, probs, row_of, in_vocab_at = target_reads(head, batch, target_logits, logit_chunk)
    losses, corrects, counts = [], [], []
    for d, h in enumerate(unroll_block(head, embed, ids, batch.features, depths)):
        counted = counted_at(supervised, in_vocab_at, d)
        width = max(ids.shape[1] - d - 1, 0)
        rows = row_of[:, d + 1 :][counted[:, :width]]  # the target's law of token t+d+2 (logits at t+d+1)
        ce, correct = soft_ce(head, h[counted], rows, probs, logit_chunk)
        n = counted.sum()
        losses.append(ce / n.clamp(min=1))
        corrects.append(correct)
        counts.append(n)
    step_losses = torch.stack(losses)
    weights = decay ** torch.arange(depths, device=ids.device, dtype=step_losses.dtype)
    return TTTOutput((weights * step_losses).sum(), step_losses, torch.stack(corrects), torch.stack(counts))


# ---- the oracle: one forward over the K*T inputs, the paper's block mask -----------------------------------
def block_mask(length: int, depths: int, device) -> torch.Tensor:
    """[KT, KT] bool over depth-major inputs (index d*T + t): depth-0 keys anchor-causal, depth 1..d keys
    of the same anchor (speculators' create_peagle_mask_mod without documents)."""
    t = torch.arange(length, device=device)
    anchor, depth = t.repeat(depths), torch.arange(depths, device=device).repeat_interleave(length)
    kv_depth0 = (depth[None] == 0) & (anchor[:, None] >= anchor[None])
    same = (anchor[:, None] == anchor[None]) & (depth[:, None] >= depth[None])
    return kv_depth0 | same


def block_outputs(head: PEagleHead, embed, input_ids: torch.Tensor, features: torch.Tensor, depths: int):
    """The head's outputs [K, B, T, H] from ONE forward over all depths with `block_mask`."""
    batch, length = input_ids.shape
    parts = [depth_inputs(head, embed, input_ids, features, d) for d in range(depths)]
    embeds = torch.cat([e for e, _ in parts], dim=1)  # [B, KT, H]
    feature = torch.cat([f for _, f in parts], dim=1)
    t = torch.arange(length, device=input_ids.device)
    positions = torch.cat([t + d for d in range(depths)])[None].expand(batch, -1)  # [B, KT]
    mask = block_mask(length, depths, input_ids.device)[None, None]  # [1, 1, KT, KT]
    h = head.run_layers(embeds, feature, positions, None, mask)  # [B, KT, H]
    return h.view(batch, depths, length, -1).transpose(0, 1)


def peagle_loss_dense(
    head: PEagleHead, embed, batch: TTTBatch, depths: int | None = None, decay: float = 1.0, *, target_logits
) -> TTTOutput:
    """The same loss, dense: one forward with the block mask, the target's logits everywhere."""
    depths = depths or head.block_size
    outputs = block_outputs(head, embed, batch.input_ids, batch.features, depths)  # [K, B, T, H]
    return dense_step_losses(head, outputs, batch, decay, target_logits)


# ---- what the trainer drives ------------------------------------------------------------------------------
class PEagleModel(nn.Module):
    """The head and its objective as one module (what Accelerate prepares); the target's embedding and
    logits are used frozen and deliberately not submodules (never trained, sharded or saved)."""

    def __init__(self, head: PEagleHead, embed, target_logits, decay: float, logit_chunk: int):
        super().__init__()
        self.head, self.decay, self.logit_chunk = head, decay, logit_chunk
        self._frozen = [embed, target_logits]  # a list hides them from nn.Module registration

    def forward(self, input_ids, features, target_hidden, loss_mask, valid):
        """-> (the block loss, correct [K], counted [K])"""
        embed, target_logits = self._frozen
        batch = TTTBatch(input_ids, features, target_hidden, loss_mask, valid)
        out = peagle_loss(
            self.head,
            embed,
            batch,
            None,
            self.decay,
            target_logits=target_logits,
            logit_chunk=self.logit_chunk,
        )
        return out.loss, out.correct, out.counted


def build_peagle_head(cfg, target, aux_layers, vocab_dir) -> PEagleHead:
    """A fresh head for the run: the draft vocabulary of the data steps; with head.init_from_target the
    LM head rows and final norm start as the target's (as EAGLE-3's) and the mask embedding as the
    target's embedding of mask_token_id."""
    head = PEagleKind.new_head(
        target, aux_layers, cfg.head.draft_vocab_size, 0, False, cfg.head.head_options()
    )
    ids = draft_ids(vocab_dir, target, cfg.head.draft_vocab_size)
    head.set_draft_vocab(ids)
    if cfg.head.init_from_target:
        copy_target_output(head, target, ids)
        with torch.no_grad():
            mask_id = torch.tensor([head.config.mask_token_id], device=target.device)
            head.mask_embed.copy_(target.embed(mask_id)[0].float())
    return head.float()


class PEagleKind:
    """train/objectives/registry.py's entry for `peagle`: the trainer's and the memory preflight's view."""

    kind, label, steps_label, ttt = "peagle", "P-EAGLE", "K={} block", True
    memory_terms = staticmethod(eagle3_terms)  # the preflight's terms: K head calls over B x T, as EAGLE-3's
    steps = staticmethod(attrgetter("head.block_size"))  # steps(cfg): the block's K positions

    @staticmethod
    def new_head(
        target, aux_layers, draft_vocab: int, steps: int, cotrained: bool, options: dict
    ) -> PEagleHead:
        return PEagleHead(PEagleConfig.for_target(target, aux_layers, draft_vocab, **options))

    def __init__(self, cfg, target, aux_layers, paths):
        self.target, self.aux = target, aux_layers
        self.head = build_peagle_head(cfg, target, aux_layers, paths.vocab)
        t = cfg.train
        self.model = PEagleModel(self.head, target.embed, target.logits, t.step_decay, t.logit_chunk)
        self.depth = cfg.head.block_size

    def batch(self, rows, device) -> dict:
        from draftsmith.train.objectives.heads import make_batch

        return make_batch(self.target, rows, self.aux, device)

    def save_final(self, state: dict, folder) -> None:
        from draftsmith.runtime.heads.peagle import save_head
        from draftsmith.train.objectives.heads import load_partial

        save_head(load_partial(PEagleHead(self.head.config), state, "head."), folder)
