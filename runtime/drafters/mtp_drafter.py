"""`--draft mtp:DIR`: drafting with MTP modules on the target's own last hidden state.

    drafter = mtp_drafter(load_head("runs/mtp/final", target), target, parse_tree_spec("chain:3"))
    drafter = mtp_drafter(head, target, parse_tree_spec("chain:5"), recursive=True)   # `mtp:DIR#recursive`

Depth d of the draft tree is proposed by module d (stacked, as trained): module m runs at the root's
position n-1 on (the depth-m node's token, the output of module m-1 at its parent), attending to its own
cache of committed positions t <= n-1-m, exactly the mask it was trained with (`mtp.module_mask`).
Each module keeps its own KV cache; at the start of a cycle every module the tree reaches catches up on
the committed positions it has not seen, fed by the outputs module m-1 produced there (kept in a buffer).

Past the last module (only with recursion allowed), the last module is applied again one position
further per depth, its input feature being its own output at the parent, like an EAGLE head; it then
also sees the slots of its ancestors that it forwarded this cycle. On commit every module drops its
draft slots: the accepted tokens come back next cycle with the target's real features. On the engine's
static path (`static_slots` set) every module forward runs on a static cache as a CUDA graph
(runtime/drafters/static_steps.py), chosen once per batch, with the same tokens, masks and results.
`MtpSteps` is the step model the tree grower (runtime/drafters/grower.py) drives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.static_forward import causal
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafter import count_params, param_ratio
from draftsmith.runtime.drafters.grower import Level, ModelDrafter
from draftsmith.runtime.drafters.lm_drafter import level_mask, pending_inputs
from draftsmith.runtime.drafters.static_steps import mtp_steps
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.mtp import MtpHead
from draftsmith.runtime.verify.draft_batch import to_device
from draftsmith.runtime.verify.draft_tree import CycleTree
from draftsmith.runtime.verify.tree import TreeSpec


@dataclass
class MtpState:
    """Per module m: its cache, the positions it has cached per row, and its input features [k, H] at
    positions cached[m][b] .. + k - 1 (module 0's from the target, module m's from module m-1)."""

    caches: list[KVCache]
    cached: list[list[int]]
    feats: list[list[torch.Tensor]]
    draft_start: list[int | None]


class MtpSteps:
    slots = None  # commit drops every draft slot

    def __init__(self, head: MtpHead, target: Target, max_depth: int, recursive: bool = False):
        modules = head.config.num_modules
        if max_depth > modules and not recursive:
            raise BadInputError(
                "--tree",
                f"depth {max_depth}",
                f"depth <= {modules} (the MTP modules this head has)",
                "or let the last module recurse: --draft mtp:DIR#recursive",
            )
        self.head, self.model, self.device, self.recursive = head, target, target.device, recursive
        self.capture_layers = (target.num_layers - 1,)  # the last decoder output, normed by the head
        self.forwards = 0
        self.sessions: dict = {}  # graphed steps by shape (the static path), captured once

    def start(self, prompts, features=None, static_slots: int | None = None) -> None:
        if features is None or len(features) != len(prompts):
            raise ValueError("the MTP drafter needs the target's prompt features (capture_layers)")
        modules, batch = self.head.config.num_modules, len(prompts)
        if static_slots:
            graphed = mtp_steps(self.head, self.model, batch, static_slots, self.sessions)
            self.run, caches = self._graphed(graphed), [graphed.caches[m] for m in range(modules)]
        else:
            self.run = self._eager
            caches = [self.head.new_cache(batch, max(map(len, prompts)) + 64) for _ in range(modules)]
        empty = [f.new_zeros(0, self.head.config.hidden_size, dtype=self.model.dtype) for f in features]
        feats = [[self._target_feature(f) for f in features]] + [list(empty) for _ in range(modules - 1)]
        self.state = MtpState(caches, [[0] * batch for _ in range(modules)], feats, [None] * modules)

    def _eager(self, module, ids, feature, positions, valid=None, mask=None) -> torch.Tensor:
        cache = self.state.caches[module]
        if mask is None:
            return self.head(module, self.model.embed(ids), feature, positions, cache, valid)
        return self.head(module, self.model.embed(ids), feature, positions, cache, tree_mask=mask)

    def _graphed(self, steps):
        def run(module, ids, feature, positions, valid=None, mask=None) -> torch.Tensor:
            valid = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid
            mask = causal(*ids.shape, self.device) if mask is None else mask
            return steps(module, ids, feature, positions, valid=valid, tree_mask=mask).clone()

        return run

    def _target_feature(self, feature: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.head.target_feature(self.model, feature.to(self.model.device))

    def _catch_up(self, module: int, contexts: list[list[int]]) -> tuple[torch.Tensor | None, list[int]]:
        """Forward module m on the committed positions it has not cached (t <= n-1-m) -> its outputs
        [B, W, H] (None when there is nothing to do; they feed module m+1) and each row's count."""
        state = self.state
        seen_m, cache = state.cached[module], state.caches[module]
        counts = [max(0, len(ctx) - 1 - module - seen) for ctx, seen in zip(contexts, seen_m, strict=True)]
        state.draft_start[module] = cache.length + max(counts)
        if max(counts) == 0:
            return None, counts
        rows = [
            ctx[seen + module + 1 : seen + module + 1 + n] for ctx, seen, n in zip(contexts, seen_m, counts)
        ]
        ids, positions, valid = pending_inputs(rows, seen_m, self.device)  # tokens t+m+1 at positions t
        feats = torch.zeros(
            *ids.shape, self.head.config.hidden_size, dtype=self.model.dtype, device=self.device
        )
        for b, n in enumerate(counts):
            feats[b, :n] = state.feats[module][b][:n]
            state.feats[module][b] = state.feats[module][b][n:]
        h = self.run(module, ids, feats, positions, valid)
        self.forwards += 1
        if module + 1 < len(state.caches):
            for b, n in enumerate(counts):
                state.feats[module + 1][b] = torch.cat([state.feats[module + 1][b], h[b, :n]])
        state.cached[module] = [seen + n for seen, n in zip(seen_m, counts, strict=True)]
        return h, counts

    def pending(self, contexts: list[list[int]], tree: TreeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        h, counts = self._catch_up(0, contexts)  # every row has >= 1 new pair (the root's)
        last = to_device(counts, self.device) - 1
        self.root_hidden = h[torch.arange(len(contexts), device=self.device), last]  # [B, H] = h_1 at n-1
        # every other module the levels reach catches up now, so its host-built inputs (a copy that waits
        # for the queued kernels) never enter the drafting loop
        for module in range(1, min(tree.max_depth, len(self.state.caches))):
            self._catch_up(module, contexts)
        roots = to_device([len(ctx) - 2 for ctx in contexts], self.device)[:, None]  # n - 1
        return self.head.logits(self.model, 0, self.root_hidden), roots

    def level(self, cycle: CycleTree, level: Level) -> torch.Tensor:
        """Depth d's frontier through module min(d, M-1), fed its parents' outputs -> logits [B, F, V].
        Its mask covers this module's draft slots: a node sees its ancestors this module forwarded this
        cycle (only when recursing) and itself; committed slots come from the cache."""
        module = min(level.depth, len(self.state.caches) - 1)
        feature = cycle.parent_features(level.nodes, self.root_hidden)  # [B, F, H]
        positions = level.positions - module  # [B, F]: module m runs m positions before its token
        mask = level_mask(cycle, level, module, 0, False)  # [B, F, D + F] over this module's draft slots
        h = self.run(module, level.ids, feature, positions, mask=mask)
        self.forwards += 1
        cycle.keep_features(level.nodes, h)
        return self.head.logits(self.model, module, h)

    def commit(self, accepted, features=None, fetched=None) -> None:
        for module, cache in enumerate(self.state.caches):  # drop every draft slot
            if self.state.draft_start[module] is not None:
                cache.crop(self.state.draft_start[module])
        self.state.feats[0] = [self._target_feature(f) for f in features]

    def skip(self, features=None) -> None:
        new = [self._target_feature(f) for f in features]
        self.state.feats[0] = [torch.cat([old, f]) for old, f in zip(self.state.feats[0], new, strict=True)]

    def retain(self, rows: list[int]) -> None:
        index, state = torch.tensor(rows, device=self.device), self.state
        for cache in state.caches:
            cache.retain(index)
        state.cached = [[c[r] for r in rows] for c in state.cached]
        state.feats = [[f[r] for r in rows] for f in state.feats]


def mtp_drafter(
    head: MtpHead, target: Target, tree: TreeSpec, recursive: bool = False, children: str = "auto"
) -> ModelDrafter:
    """The drafter, its cost one module's own weights plus the target's LM head it drafts through (MTP
    shares it), over the target's parameters."""
    steps = MtpSteps(head, target, tree.max_depth, recursive)
    return ModelDrafter(steps, tree, "mtp", module_cost(head, target), children)


def module_cost(head: MtpHead, target: Target) -> float:
    lm_head = target.model.get_output_embeddings().weight.numel()
    return param_ratio(head, target) / head.config.num_modules + lm_head / count_params(target.model)
