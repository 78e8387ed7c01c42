"""The drafter protocol and the registry that turns a `--draft` spec into a drafter.

A drafter proposes, once per speculative cycle and for every row of the batch, a tree of candidate
tokens rooted at the last committed token, together with the distribution each token was drawn from:

    drafter = build_drafter("self:layers=24", target, parse_tree_spec("chain:4"))
    drafter.start(prompts, params, generators)     # a new batch (its own caches, its own random streams)
    drafts = drafter.propose(contexts)             # contexts[i] = committed tokens of row i, root last
    drafter.commit(accepted)                       # accepted[i] = node ids the target accepted in row i
    drafter.retain(rows)                           # rows still running, after some finished

`commit` rolls the drafter back to the accepted path (its caches keep exactly the committed tokens
they have already computed); the tokens it has not seen yet, including the recovered or bonus token,
reach it as the head of the next `contexts`. Draft specs (docs/architecture.md, section 4):

    none            plain decoding
    ngram           prompt lookup in the context (no model)
    self:layers=N   the target's first N layers + its final norm and LM head (self-speculation)
    model:TARGET    a standalone draft LM sharing the target's tokenizer (alias, folder, Hub id, .gguf)
    eagle3:DIR      an EAGLE-3 head (runtime/eagle3.py): our folder, or the official/SGLang or speculators
                    layout, from a folder or a Hub id (runtime/layouts.py; `#ids=input|output` says how a
                    foreign head's aux-layer ids read)
    mtp:DIR         MTP modules (runtime/mtp.py); depth <= modules, or `mtp:DIR#recursive` to let the
                    last module recurse past them

This registry is the only place that switches on a drafter's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.sampling import SamplingParams
from draftsmith.runtime.tree import Tree, TreeSpec, chain


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
    # graphs (the model drafters: runtime/static_draft.py); drafters without a model (n-gram) ignore it
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


DRAFT_SPECS = ("none", "ngram", "self:layers=N", "model:TARGET", "eagle3:DIR", "mtp:DIR[#recursive]")
DEFAULT_DEPTH = 2  # the default tree, chain:2, suits CPUs (BENCHMARKS.md); shallower for a shallower head


def default_depth(spec: str) -> int:
    """The default chain depth for a `--draft` spec (generate's chain:2, bench's chain:2 and auto:2): 2,
    or an MTP head's module count when it has fewer (without #recursive a module drafts one position)."""
    kind, _, arg = spec.partition(":")
    folder, _, option = arg.partition("#")
    if kind == "mtp" and folder and option != "recursive" and Path(folder).is_dir():
        from draftsmith.runtime.mtp import num_modules

        return min(DEFAULT_DEPTH, num_modules(folder))
    return DEFAULT_DEPTH


def default_trees(spec: str) -> list[str]:
    """bench's trees for a draft given without @TREE or --tree: a fixed and a load-aware chain."""
    depth = default_depth(spec)
    return [f"chain:{depth}", f"auto:{depth}"]


def build_drafter(
    spec: str, target, tree: TreeSpec | None, device: str = "auto", dtype: str = "auto"
) -> Drafter | None:
    """`--draft` spec -> a drafter for this target and tree (None for `none`). `tree=None` is the default,
    made to fit the drafter: chain:2, or chain:M for an MTP head of M < 2 modules (without #recursive)."""
    kind, sep, arg = spec.partition(":")
    if spec == "none":
        return None
    if tree is None:  # an explicit tree deeper than the drafter is still refused, naming --tree
        tree = chain(default_depth(spec))
    if spec == "ngram":
        from draftsmith.runtime.ngram import NgramDrafter

        return NgramDrafter(tree)  # step_cost 0: a lookup, no model
    if kind == "self" and sep:
        from draftsmith.runtime.lm_drafter import LMDrafter

        drafter = LMDrafter(target, tree, num_layers=_self_layers(spec, arg, target.num_layers))
        drafter.step_cost = drafter.num_layers / target.num_layers
        return drafter
    if kind == "model" and arg:
        from draftsmith.runtime.lm_drafter import LMDrafter, load_draft_model

        drafter = LMDrafter(load_draft_model(arg, target, device, dtype), tree)
        drafter.step_cost = _param_ratio(drafter.model.model, target)
        return drafter
    if kind == "eagle3" and arg:
        from draftsmith.runtime.eagle3_drafter import Eagle3Drafter
        from draftsmith.runtime.layouts import load_eagle3

        head = load_eagle3(arg, target).to(device=target.device, dtype=target.dtype)
        drafter = Eagle3Drafter(head, target, tree)
        drafter.step_cost = _param_ratio(head, target)
        return drafter
    if kind == "mtp" and arg:
        from draftsmith.runtime.mtp import load_head as load_mtp
        from draftsmith.runtime.mtp_drafter import MtpDrafter

        folder, _, option = arg.partition("#")
        if option not in ("", "recursive"):
            raise BadInputError("--draft", spec, "mtp:DIR or mtp:DIR#recursive")
        head = load_mtp(folder, target).to(device=target.device, dtype=target.dtype)
        drafter = MtpDrafter(head, target, tree, recursive=option == "recursive")
        # a module's own weights, plus the target's LM head it drafts through (MTP shares it)
        lm_head = target.model.get_output_embeddings().weight.numel()
        drafter.step_cost = _param_ratio(head, target) / head.config.num_modules + lm_head / _count(
            target.model
        )
        return drafter
    raise BadInputError("--draft", spec, f"one of {', '.join(DRAFT_SPECS)}")


def _self_layers(spec: str, arg: str, num_layers: int) -> int:
    key, _, value = arg.partition("=")
    expected = (
        f"self:layers=N with an integer N in [1, {num_layers - 1}] (the target has {num_layers} layers)"
    )
    if key != "layers" or not value.isdigit() or not 1 <= int(value) <= num_layers - 1:
        raise BadInputError("--draft", spec, expected)
    return int(value)


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in {p.data_ptr(): p for p in module.parameters()}.values())


def _param_ratio(module: torch.nn.Module, target) -> float:
    """Parameters a draft step reads over the target's (each counted once): a cost proxy for decoding,
    which reads every weight once per step."""
    return _count(module) / _count(target.model)
