"""Drafting with a causal LM over its own KV cache: `self:layers=N` and `model:TARGET`.

    drafter = lm_drafter(target, tree, num_layers=24)   # self-speculation: the first 24 layers + norm + head
    drafter = lm_drafter(load_draft_model("path/to/small-lm", target), tree, target=target)

`LMSteps` is the step model the tree grower (runtime/drafters/grower.py) drives:
  pending  forward the committed tokens the drafter has not seen yet (right-padded per row; the last
           one is the root), which gives the root's next-token logits;
  level    forward a depth's frontier with a mask that lets each node see the committed context, its
           ancestors in this cycle and itself (`CycleTree.forward_mask` over the cycle's slots);
  commit   gather the cache slots of the accepted path (KVCache.compact) and drop the rest; which slot
           holds each node comes back in the proposal's `fetched` columns (the cycle's one transfer); an
           accepted node that was never forwarded is simply forwarded next cycle with the bonus token.
The forward is chosen once per batch: the model's own on a growing cache, or, on the engine's static
path, graphed steps on a static cache (runtime/drafters/static_steps.py `lm_steps`); tokens, masks and results
are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.static_forward import causal
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafter import param_ratio
from draftsmith.runtime.drafters.grower import Level, ModelDrafter, is_chain
from draftsmith.runtime.drafters.static_steps import lm_steps
from draftsmith.runtime.errors import BadInputError, renamed_fields
from draftsmith.runtime.verify.draft_batch import to_device
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.tree import TreeSpec


@dataclass
class LMState:
    """One batch's draft cache and bookkeeping (SSD copies it per branch)."""

    cache: KVCache
    cached: list[int]  # committed tokens of each row already in the cache
    start_slot: int = 0  # the cache length when this cycle's pending tokens were written
    pending_counts: tuple[int, ...] = ()  # pending tokens of each row this cycle


def pending_inputs(rows: list[list[int]], first: list[int], device) -> tuple[torch.Tensor, ...]:
    """Per row tokens right-padded to the widest, at positions first[b].. -> ids, positions [B, W] on
    `device`, and valid [B, W] (None when every row is as wide: the forward then knows there is no
    padding without reading the device, KVCache.holes)."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, tokens in enumerate(rows):
        ids[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        valid[b, : len(tokens)] = True
    positions = torch.tensor(first)[:, None] + torch.arange(width)  # [B, W]
    dense = min(map(len, rows)) == width
    return to_device(ids, device), to_device(positions, device), None if dense else to_device(valid, device)


class LMSteps:
    slots = "draft"  # the cache key whose forwarded nodes `commit` keeps
    capture_layers: tuple[int, ...] = ()

    def __init__(self, model: Target, num_layers: int | None = None):
        self.model, self.num_layers, self.device = model, num_layers, model.device
        self.vocab_size = model.vocab_size  # set to the target's by load_draft_model
        self.forwards = 0
        self.sessions: dict = {}  # graphed steps by shape (the static path), captured once

    def start(self, prompts, features=None, static_slots: int | None = None) -> None:
        self.static = bool(static_slots)
        if static_slots:  # the engine's static path: a static cache and graphed steps
            graphed = lm_steps(self.model, self.num_layers, len(prompts), static_slots, self.sessions)
            self.run, cache = self._graphed(graphed), graphed.caches[0]
        else:
            self.run = self._eager
            cache = self.model.new_cache(len(prompts), max(map(len, prompts)) + 64, self.num_layers)
        self.state = LMState(cache, [0] * len(prompts))

    def _eager(self, ids, positions, valid=None, mask=None) -> torch.Tensor:
        out = self.model.forward(
            ids, self.state.cache, positions, token_valid=valid, tree_mask=mask, num_layers=self.num_layers
        )
        return out.hidden

    def _graphed(self, steps):
        def run(ids, positions, valid=None, mask=None) -> torch.Tensor:
            valid = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid
            mask = causal(*ids.shape, self.device) if mask is None else mask
            return steps(0, ids, positions, valid=valid, tree_mask=mask)

        return run

    def pending(self, contexts: list[list[int]], tree: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward the committed tokens not in the cache yet -> root logits [B, V], root positions [B, 1]."""
        state = self.state
        pending = [ctx[seen:] for ctx, seen in zip(contexts, state.cached, strict=True)]
        state.start_slot, state.pending_counts = state.cache.length, tuple(map(len, pending))
        self.cut_chain_masks = self.static and is_chain(tree)
        ids, positions, valid = pending_inputs(pending, state.cached, self.device)
        hidden = self.run(ids, positions, valid)
        self.forwards += 1
        last = to_device(state.pending_counts, self.device) - 1
        root_logits = self.logits(hidden[torch.arange(len(pending), device=self.device), last])  # [B, V]
        roots = [seen + n - 1 for seen, n in zip(state.cached, state.pending_counts, strict=True)]
        return root_logits, to_device(roots, self.device)[:, None]

    def level(self, cycle: CycleTree, level: Level) -> torch.Tensor:
        """Forward one depth's frontier -> logits [B, F, V]; its mask: the pending context, the ancestors
        forwarded this cycle, itself (graphed chains: cut to [B, 1, 1], one shape for every level)."""
        mask = level_mask(cycle, level, self.slots, max(self.state.pending_counts), self.cut_chain_masks)
        self.forwards += 1
        return self.logits(self.run(level.ids, level.positions, mask=mask))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary (a draft LM's padded rows cut, missing ids at -inf)."""
        logits, vocab = self.model.logits(hidden), self.vocab_size
        if logits.shape[-1] > vocab:
            return logits[..., :vocab]
        if logits.shape[-1] < vocab:
            pad = logits.new_full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    def commit(self, accepted: list[list[int]], features=None, fetched=None) -> None:
        """Keep each row's pending slots and its accepted path's forwarded slots (fetched[b][node] = the
        order the node was forwarded in this cycle, -1 never), in path order."""
        state, width = self.state, max(self.state.pending_counts)
        keep_rows = []
        for b, nodes in enumerate(accepted):
            slots = [state.start_slot + j for j in range(state.pending_counts[b])]
            for node in nodes:  # the accepted path, root to leaf, while its slots exist
                if fetched[b][node] < 0:
                    break
                slots.append(state.start_slot + width + fetched[b][node])
            keep_rows.append(slots)
            state.cached[b] += len(slots)
        state.cache.keep_rows(state.start_slot, keep_rows)

    def skip(self, features=None) -> None:
        """Nothing to keep: the plain step's token is pending next cycle."""

    def retain(self, rows: list[int]) -> None:
        self.state.cache.retain(torch.tensor(rows, device=self.device))
        self.state.cached = [self.state.cached[r] for r in rows]


def level_mask(cycle: CycleTree, level: Level, cache, prefix: int, cut_chain: bool) -> torch.Tensor:
    """A frontier's tree mask over `cache`'s slots this cycle (CycleTree.forward_mask, after `prefix`
    always-seen slots); a graphed chain's is cut to [B, 1, 1]: earlier valid slots are seen anyway, and
    every level then has one shape, one graph."""
    mask = cycle.forward_mask(cache, level.nodes, prefix)
    return mask[..., -level.nodes.shape[1] :] if cut_chain else mask


def lm_drafter(
    model: Target, tree: TreeSpec, num_layers: int | None = None, children: str = "auto", target=None
) -> ModelDrafter:
    """`self:layers=N` (model = the target, its first N layers) or `model:X` (a draft LM; `target` sets
    the cost: its parameters over the target's)."""
    name = f"self:layers={num_layers}" if num_layers else f"model:{model.name}"
    cost = (
        num_layers / model.num_layers if num_layers else (param_ratio(model.model, target) if target else 0.0)
    )
    return ModelDrafter(LMSteps(model, num_layers), tree, name, cost, children)


def load_draft_model(
    spec: str,
    target: Target,
    device: str = "auto",
    dtype: str = "auto",
    field: str = "--draft",
    prefix="model:",
) -> Target:
    """Load a standalone draft LM on the target's device and dtype; refuse one whose tokenizer differs.
    Errors name what the user typed: `field` (bench's hf-assisted:X is `--baselines`) and `prefix + spec`."""
    dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
        target.dtype
    ]
    with renamed_fields({"--target": field}, got=lambda got: f"{prefix}{got}"):  # what the user set
        draft = Target.load(spec, device=str(target.device), dtype=dtype_name)
    check_same_tokenizer(draft, target, spec, field, prefix)
    draft_vocab_ok = draft.vocab_size >= len(target.tokenizer)
    if not draft_vocab_ok:
        raise BadInputError(field, f"{prefix}{spec}", f"a vocabulary of at least {len(target.tokenizer)} ids")
    return draft


def check_same_tokenizer(
    draft: Target, target: Target, spec: str, field: str = "--draft", prefix: str = "model:"
) -> None:
    ours, theirs = draft.tokenizer, target.tokenizer
    if ours.get_vocab() != theirs.get_vocab():
        diff = len(set(ours.get_vocab().items()) ^ set(theirs.get_vocab().items()))
        raise BadInputError(
            field,
            f"{prefix}{spec}",
            f"a model with {target.name}'s tokenizer",
            f"the vocabularies differ in {diff} (token, id) pairs",
        )
    if draft.eos_token_ids != target.eos_token_ids:
        raise BadInputError(
            field,
            f"{prefix}{spec}",
            f"EOS ids {target.eos_token_ids} like the target",
            f"got {draft.eos_token_ids}",
        )
