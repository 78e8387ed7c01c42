"""`--draft mtp:DIR`: drafting with MTP modules on the target's own last hidden state.

    drafter = MtpDrafter(load_head("runs/mtp/final", target), target, parse_tree_spec("chain:3"))
    drafter = MtpDrafter(head, target, parse_tree_spec("chain:5"), recursive=True)   # `mtp:DIR#recursive`

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
(runtime/static/draft.py), with the same tokens, masks and results.
"""

from __future__ import annotations

import torch

from draftsmith.runtime.core.errors import BadInputError
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafter import Drafter, to_device
from draftsmith.runtime.drafters.lm_drafter import Level, LMDrafter
from draftsmith.runtime.heads.mtp import MtpHead
from draftsmith.runtime.static.draft import mtp_steps
from draftsmith.runtime.static.forward import causal
from draftsmith.runtime.verify.tree import TreeSpec


class MtpDrafter(LMDrafter):
    def __init__(
        self, head: MtpHead, target: Target, tree: TreeSpec, recursive: bool = False, children: str = "auto"
    ):
        super().__init__(target, tree, children=children)
        modules = head.config.num_modules
        if tree.max_depth > modules and not recursive:
            raise BadInputError(
                "--tree",
                f"depth {tree.max_depth}",
                f"depth <= {modules} (the MTP modules this head has)",
                "or let the last module recurse: --draft mtp:DIR#recursive",
            )
        self.head, self.recursive = head, recursive
        self.name = "mtp"
        self.capture_layers = (target.num_layers - 1,)  # the last decoder output, normed by the head

    def start(self, prompts, params, generators, features=None) -> None:
        Drafter.start(self, prompts, params, generators, features)
        if features is None or len(features) != len(prompts):
            raise ValueError("the MTP drafter needs the target's prompt features (capture_layers)")
        self.sample = self.samples_children(params)
        modules, capacity = self.head.config.num_modules, self.capacity(prompts)
        self.steps = None
        if self.static_slots:
            self.steps = mtp_steps(self.head, self.model, len(prompts), self.static_slots)
            self.caches = [self.steps.caches[m] for m in range(modules)]
        else:
            self.caches = [self.head.new_cache(len(prompts), capacity) for _ in range(modules)]
        self.cached = [[0] * len(prompts) for _ in range(modules)]  # positions each module has cached
        # feats[m][b]: module m's input features [k, H] at positions cached[m][b] .. + k - 1
        self.feats = [[self._target_feature(f) for f in features]] + [
            [f.new_zeros(0, self.head.config.hidden_size, dtype=self.model.dtype) for f in features]
            for _ in range(modules - 1)
        ]

    def _target_feature(self, feature: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.head.target_feature(self.model, feature.to(self.model.device))

    # ---- committed positions --------------------------------------------------------------------------
    def _catch_up(self, module: int, contexts: list[list[int]]) -> torch.Tensor | None:
        """Forward module m on the committed positions it has not cached (t <= n-1-m) -> outputs
        [B, W, H] (None when there is nothing to do); they feed module m+1."""
        roots = [len(ctx) - 1 for ctx in contexts]
        counts = [max(0, n - module - seen) for n, seen in zip(roots, self.cached[module], strict=True)]
        cache, width = self.caches[module], max(counts)
        self.draft_start[module] = cache.length + width
        if width == 0:
            return None
        device, hidden = self.model.device, self.head.config.hidden_size
        ids = torch.zeros(len(contexts), width, dtype=torch.long)
        feats = torch.zeros(len(contexts), width, hidden, dtype=self.model.dtype, device=device)
        valid = torch.zeros(len(contexts), width, dtype=torch.bool)
        for b, (ctx, seen, n) in enumerate(zip(contexts, self.cached[module], counts, strict=True)):
            ids[b, :n] = torch.tensor(ctx[seen + module + 1 : seen + module + 1 + n])  # tokens t+m+1
            feats[b, :n] = self.feats[module][b][:n]
            self.feats[module][b] = self.feats[module][b][n:]
            valid[b, :n] = True
        positions = torch.tensor(self.cached[module])[:, None] + torch.arange(width)  # [B, W]
        ids, positions, valid = to_device(ids, device), to_device(positions, device), to_device(valid, device)
        if self.steps is not None:
            mask = causal(len(contexts), width, device)
            h = self.steps(module, ids, feats, positions, valid=valid, tree_mask=mask).clone()
        else:
            h = self.head(module, self.model.embed(ids), feats, positions, cache, valid)
        self.forwards += 1
        if module + 1 < len(self.caches):
            for b, n in enumerate(counts):
                self.feats[module + 1][b] = torch.cat([self.feats[module + 1][b], h[b, :n]])
        self.cached[module] = [seen + n for seen, n in zip(self.cached[module], counts, strict=True)]
        self.catch_up_counts = counts
        return h

    @torch.inference_mode()
    def _forward_pending(self, contexts: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        modules = len(self.caches)
        self.draft_start = [None] * modules
        h = self._catch_up(0, contexts)  # every row has >= 1 new pair (the root's)
        batch, device = len(contexts), self.model.device
        last = to_device(self.catch_up_counts, device) - 1
        self.root_hidden = h[torch.arange(batch, device=device), last]  # [B, H] = h_1 at n-1
        # every other module the levels reach catches up now, so its host-built inputs (a copy that waits
        # for the queued kernels) never enter the drafting loop
        for module in range(1, min(self.tree.max_depth, modules)):
            self._catch_up(module, contexts)
        root_pos = [len(ctx) - 2 for ctx in contexts]  # n - 1
        return self.head.logits(self.model, 0, self.root_hidden), root_pos

    # ---- draft levels ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def _forward_level(self, level: Level) -> torch.Tensor:
        """Depth d's frontier through module min(d, M-1), fed its parents' outputs -> logits [B, F, V].
        Its mask covers this module's draft slots: a node sees its ancestors this module forwarded this
        cycle (only when recursing) and itself; committed slots come from the cache."""
        module = min(level.depth, len(self.caches) - 1)
        feature = self._parent_outputs(level, self.root_hidden)  # [B, F, H]
        positions = level.positions - module  # [B, F]: module m runs m positions before its token
        mask = self._level_mask(level, module, prefix=0)  # [B, F, D + F] over this module's draft slots
        if self.steps is not None:
            ones = torch.ones_like(level.ids, dtype=torch.bool)
            h = self.steps(module, level.ids, feature, positions, valid=ones, tree_mask=mask)
        else:
            embeds = self.model.embed(level.ids)
            h = self.head(module, embeds, feature, positions, self.caches[module], tree_mask=mask)
        self.forwards += 1
        self._keep_outputs(level, h)
        return self.head.logits(self.model, module, h)

    def commit(self, accepted: list[list[int]], features=None) -> None:
        for module, cache in enumerate(self.caches):  # drop every draft slot
            if self.draft_start[module] is not None:
                cache.crop(self.draft_start[module])
        self.feats[0] = [self._target_feature(f) for f in features]

    def skip(self, features=None) -> None:
        new = [self._target_feature(f) for f in features]
        self.feats[0] = [torch.cat([old, f]) for old, f in zip(self.feats[0], new, strict=True)]

    def retain(self, rows: list[int]) -> None:
        Drafter.retain(self, rows)
        index = torch.tensor(rows, device=self.model.device)
        for cache in self.caches:
            cache.retain(index)
        self.cached = [[c[r] for r in rows] for c in self.cached]
        self.feats = [[f[r] for r in rows] for f in self.feats]
