"""The registry of `--draft` specs: `build_drafter` turns a spec into a drafter (runtime/drafters/drafter.py
is
the protocol every drafter implements).

    drafter = build_drafter("self:layers=24", target, parse_tree_spec("chain:4"))
    drafter.start(prompts, params, generators)     # then propose / commit / retain each cycle

Draft specs (docs/architecture.md, section 4):

    none            plain decoding
    ngram           prompt lookup in the context (no model)
    suffix[:K=V,..] suffix decoding: frequency-ranked trees from suffix tries of the request and of earlier
                    responses (no model; runtime/drafters/suffix.py lists the options)
    self:layers=N   the target's first N layers + its final norm and LM head (self-speculation)
    model:TARGET    a standalone draft LM sharing the target's tokenizer (alias, folder, Hub id, .gguf)
    KIND:DIR        a trained head of a registered kind (runtime/heads/head_kinds.py), e.g. eagle3:DIR (an
                    EAGLE-3 head in our, the official/SGLang or the speculators layout, a folder or a Hub
                    id; `#ids=input|output` says how a foreign head's aux-layer ids read) or mtp:DIR (MTP
                    modules; depth <= modules, or `mtp:DIR#recursive` to let the last module recurse)

The drafters without a model or head are switched on here; head kinds are looked up in the registry.
`Drafter` is re-exported from runtime/drafters/drafter.py for users' code.
"""

from __future__ import annotations

from draftsmith.runtime.drafters.drafter import Drafter  # noqa: F401 (re-exported)
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.head_kind import DEFAULT_DEPTH  # noqa: F401 (re-exported)
from draftsmith.runtime.verify.tree import TreeSpec, chain

BASIC_SPECS = ("none", "ngram", "suffix[:depth=D,requests=R,...]", "self:layers=N", "model:TARGET")


def draft_specs() -> tuple[str, ...]:
    return BASIC_SPECS + head_kinds.draft_specs()


def default_depth(spec: str) -> int:
    """The default chain depth for a `--draft` spec (generate's chain:2, bench's chain:2 and auto:2): 2,
    or fewer where the head drafts fewer (an MTP head of one module without #recursive: 1)."""
    return head_kinds.default_depth(spec)


def default_trees(spec: str) -> list[str]:
    """bench's trees for a draft given without @TREE or --tree: a fixed and a load-aware chain."""
    depth = default_depth(spec)
    return [f"chain:{depth}", f"auto:{depth}"]


def build_drafter(
    spec: str, target, tree: TreeSpec | None, device: str = "auto", dtype: str = "auto"
) -> Drafter | None:
    """`--draft` spec -> a drafter for this target and tree (None for `none`). `tree=None` is the default,
    made to fit the drafter: chain:2, or the shallower chain a head's kind asks for."""
    kind, sep, arg = spec.partition(":")
    if spec == "none":
        return None
    if tree is None:  # an explicit tree deeper than the drafter is still refused, naming --tree
        tree = chain(default_depth(spec))
    if spec == "ngram":
        from draftsmith.runtime.drafters.ngram import NgramDrafter

        return NgramDrafter(tree, device=target.device)  # step_cost 0: a lookup, no model
    if kind == "suffix":
        from draftsmith.runtime.drafters.suffix import SuffixDrafter

        return SuffixDrafter(tree, spec, target.device)  # step_cost 0: a lookup, no model
    if kind == "self" and sep:
        from draftsmith.runtime.drafters.lm_drafter import lm_drafter

        return lm_drafter(target, tree, num_layers=_self_layers(spec, arg, target.num_layers))
    if kind == "model" and arg:
        from draftsmith.runtime.drafters.lm_drafter import lm_drafter, load_draft_model

        return lm_drafter(load_draft_model(arg, target, device, dtype), tree, target=target)
    found = head_kinds.draft_kind(spec)
    if found is not None:
        head_kind, arg = found
        from draftsmith.runtime.drafters.registry import head_drafter
        from draftsmith.runtime.heads.int8_folder import load_draft_head  # an int8 folder loads as int8

        head, options, _ = load_draft_head(head_kind, arg, target)
        return head_drafter(head_kind.name, head, target, tree, options)
    raise BadInputError("--draft", spec, f"one of {', '.join(draft_specs())}")


def _self_layers(spec: str, arg: str, num_layers: int) -> int:
    key, _, value = arg.partition("=")
    expected = (
        f"self:layers=N with an integer N in [1, {num_layers - 1}] (the target has {num_layers} layers)"
    )
    if key != "layers" or not value.isdigit() or not 1 <= int(value) <= num_layers - 1:
        raise BadInputError("--draft", spec, expected)
    return int(value)
