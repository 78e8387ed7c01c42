"""The drafter protocol: what every drafter implements, and the `Draft` it returns each cycle.

A drafter proposes, once per speculative cycle and for every row of the batch, a tree of candidate
tokens rooted at the last committed token, together with the distribution each token was drawn from:

    drafter.start(prompts, params, generators)     # a new batch (its own caches, its own random streams)
    drafts = drafter.propose(contexts)             # contexts[i] = committed tokens of row i, root last
    drafter.commit(accepted)                       # accepted[i] = node ids the target accepted in row i
    drafter.retain(rows)                           # rows still running, after some finished

`commit` rolls the drafter back to the accepted path (its caches keep exactly the committed tokens
they have already computed); the tokens it has not seen yet, including the recovered or bonus token,
reach it as the head of the next `contexts`. Drafters import this module, never runtime/drafters/drafting.py
(which builds them from `--draft` specs and so imports them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import Tree


@dataclass
class Draft:
    tree: Tree
    tokens: list[int]  # [N]; tokens[0] is the root (the last committed token)
    draft_probs: torch.Tensor | None = None  # [N, V] law each token was drawn from; None = deterministic

    def __post_init__(self) -> None:
        if len(self.tokens) != self.tree.size:
            raise ValueError(f"draft has {len(self.tokens)} tokens for a tree of {self.tree.size} nodes")


def to_device(data, device: torch.device | str) -> torch.Tensor:
    """A host-built tensor (or nested list) on `device` without waiting for the kernels already queued
    there: on CUDA through pinned memory and an asynchronous copy (a plain copy synchronizes the stream,
    so the host would idle until the GPU drains), elsewhere an ordinary `.to`."""
    tensor = data if isinstance(data, torch.Tensor) else torch.tensor(data)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def root_only(root: int) -> Draft:
    """An empty draft: the cycle is one plain decoding step."""
    return Draft(Tree((-1,)), [root])


class Drafter:
    """Base class: the no-op parts of the protocol. Subclasses implement `propose`."""

    name = "drafter"
    capture_layers: tuple[
        int, ...
    ] = ()  # target layers whose hidden states the drafter reads (feature heads)
    step_cost = 0.0  # one drafted level's cost relative to a 1-token target forward (build_drafter sets it)
    # set by the engine on its static path: draft on a preallocated cache of this many slots, with CUDA
    # graphs (the model drafters: runtime/static/draft.py); drafters without a model (n-gram) ignore it
    static_slots: int | None = None

    def __init__(self) -> None:
        self.forwards = 0  # draft model forwards so far (each covers the whole batch)

    def start(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        generators: list[torch.Generator] | None,
        features: list[torch.Tensor] | None = None,  # per row [len(prompt), A*H] when capture_layers
    ) -> None:
        self.params, self.generators = params, generators

    def propose(self, contexts: list[list[int]]) -> list[Draft]:
        raise NotImplementedError

    def commit(self, accepted: list[list[int]], features: list[torch.Tensor] | None = None) -> None:
        """accepted[i]: node ids the target accepted in row i; features[i]: the target's features at the
        root and those nodes [1 + len(accepted[i]), A*H] (feature heads only)."""

    def skip(self, features: list[torch.Tensor] | None = None) -> None:
        """A cycle ran without a draft (a load-aware plain step): its committed token (and the target's
        features there) reach the drafter at the next `propose`. Drafters that read only `contexts` need
        nothing; feature heads keep the features."""

    def retain(self, rows: list[int]) -> None:
        if self.generators is not None:
            self.generators = [self.generators[r] for r in rows]


def count_params(module: torch.nn.Module) -> int:
    params = sum(p.numel() for p in {p.data_ptr(): p for p in module.parameters()}.values())
    # weight-only quantized linears (runtime/core/quantize.py) hold their weights in buffers
    return params + sum(getattr(m, "weights_in_buffers", 0) for m in module.modules())


def param_ratio(module: torch.nn.Module, target) -> float:
    """Parameters a draft step reads over the target's (each counted once): a cost proxy for decoding,
    which reads every weight once per step."""
    return count_params(module) / count_params(target.model)
