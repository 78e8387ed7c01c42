"""The drafter protocol: what every drafter implements each cycle, and the helpers they share.

A drafter proposes, once per speculative cycle and for every row of the batch, a tree of candidate
tokens rooted at the last committed token, with the law each token was drawn from, as one `DraftBatch`
on the device (runtime/verify/draft_batch.py):

    drafter.start(prompts, params, generators, features, static_slots=None)  # a new batch
    batch = drafter.propose(contexts, tree)      # contexts[i] = committed tokens of row i, root last;
                                                 # tree = this cycle's budget (the drafter's own `tree`,
                                                 # or the load-aware policy's chain)
    drafter.commit(accepted, features, fetched)  # accepted[i] = node ids the target accepted in row i
    drafter.ended(rows)                          # rows that just finished (they may stay in the batch)
    drafter.retain(rows)                         # the rows kept, after some finished

`commit` rolls the drafter back to the accepted path (its caches keep exactly the committed tokens
they have already computed); the tokens it has not seen yet, including the recovered or bonus token,
reach it as the head of the next `contexts`. `fetched[i]` is row i of the batch's `fetched` columns,
which the engine brings to the host with the cycle's one transfer. `static_slots` (the engine's static
path) asks model drafters to draft on a preallocated cache with CUDA graphs
(runtime/drafters/static_steps.py).
The model drafters are one `ModelDrafter` (runtime/drafters/grower.py) over a step model each; n-gram,
suffix and SSD build host `Draft`s. Drafters import this module, never runtime/drafters/drafting.py
(which builds them from `--draft` specs and so imports them).
"""

from __future__ import annotations

import copy

import torch

from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import TreeSpec


class Drafter:
    """The protocol's no-op parts. Every drafter adds `propose(contexts, tree) -> DraftBatch` (the module
    docstring); none derives from another drafter."""

    name = "drafter"
    capture_layers: tuple[int, ...] = ()  # target layers whose hidden states the drafter reads
    step_cost = 0.0  # one drafted level's cost relative to a 1-token target forward
    gives_survival = (
        False  # proposals carry DraftBatch.survival (a confidence head): adaptive:K's per-row cut
    )
    tree: TreeSpec  # the drafter's own budget (each cycle's is passed to `propose`)

    def __init__(self) -> None:
        self.forwards = 0  # draft model forwards so far (each covers the whole batch)

    def start(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        generators: list[torch.Generator] | None,
        features: list[torch.Tensor] | None = None,  # per row [len(prompt), A*H] when capture_layers
        static_slots: int | None = None,
    ) -> None:
        self.params, self.generators = params, generators

    def commit(
        self,
        accepted: list[list[int]],
        features: list[torch.Tensor] | None = None,
        fetched: list[list[int]] | None = None,
    ) -> None:
        """accepted[i]: node ids the target accepted in row i; features[i]: the target's features at the
        root and those nodes [1 + len(accepted[i]), A*H] (feature heads only); fetched[i]: row i of
        the proposal's `fetched` columns."""

    def skip(self, features: list[torch.Tensor] | None = None) -> None:
        """A cycle ran without a draft (a load-aware plain step): its committed token (and the target's
        features there) reach the drafter at the next `propose`. Drafters that read only `contexts` need
        nothing; feature heads keep the features."""

    def ended(self, rows: list[int]) -> None:
        """Rows that just finished (EOS or budget). They may stay in the batch until it compacts (fixed
        shapes), drafting nothing, their contexts running past their end: drafters that learn from
        responses (suffix's global trie) stop reading them here. Told once per row."""

    def retain(self, rows: list[int]) -> None:
        if self.generators is not None:
            self.generators = [self.generators[r] for r in rows]

    # what `state` leaves out: the budget, the sampling parameters and streams, counters, constants
    shared = frozenset({"tree", "params", "generators", "forwards", "device", "options", "spec", "name"})

    def state(self) -> object:
        """The per-batch state, live (SSD deep-copies it to fork a branch, drafters/ssd.py)."""
        return {k: v for k, v in vars(self).items() if k not in self.shared}

    def restore(self, state: object) -> None:
        """Continue from `state` (taken, not copied)."""
        vars(self).update(state)

    def fork(self, tree: TreeSpec) -> Drafter:
        """A drafter sharing this one's weights, with its own budget, counters and (after `start`) state."""
        new = copy.copy(self)
        new.tree, new.forwards = tree, 0
        return new


def on_target(module: torch.nn.Module, target) -> torch.nn.Module:
    """The module on the target's device and dtype; one already there is left alone (a loaded int8 head's
    scales stay bf16: `.to(dtype)` would cast them)."""
    weight = next(module.parameters(), None)  # None: every linear quantized (buffers only)
    if weight is None or (weight.device == torch.device(target.device) and weight.dtype == target.dtype):
        return module
    return module.to(device=target.device, dtype=target.dtype)


def count_params(module: torch.nn.Module) -> int:
    params = sum(p.numel() for p in {p.data_ptr(): p for p in module.parameters()}.values())
    # weight-only quantized linears (runtime/core/quantize.py) hold their weights in buffers
    return params + sum(getattr(m, "weights_in_buffers", 0) for m in module.modules())


def param_ratio(module: torch.nn.Module, target) -> float:
    """Parameters a draft step reads over the target's (each counted once): a cost proxy for decoding,
    which reads every weight once per step."""
    return count_params(module) / count_params(target.model)
