"""Suffix decoding (`--draft suffix`, Oliaro et al. 2024, arXiv 2411.04975; vLLM's `suffix` method): draft
trees from the counts of what followed the context's suffixes, in this request and in earlier responses.

    draftsmith generate --draft suffix --tree dynamic:depth=6,topk=2,tokens=6 --prompt "..."
    draftsmith bench --draft 'suffix:depth=24,min_prob=0.1@chain:4' --prompts humaneval

Each request gets a trie of its prompt and output (runtime/drafters/suffix_tree.py), extended as tokens
are committed; finished responses go to one global trie bounded by requests and tokens (it lives as long
as the drafter, so across batches and bench repeats; a prompt served again first drops its earlier
answer). Every cycle, each suffix of the context (m = 1 .. depth-1 tokens) that occurs with a
continuation in either trie grows a draft tree best-first by the product of count ratios, at most
floor(factor * m + offset) levels deep; the tree with the highest sum of probabilities is proposed.

Options (`suffix:KEY=VALUE,...`, vLLM's names in brackets):
    depth=24        the tries' depth bound: match + draft length (suffix_decoding_max_tree_depth)
    requests=256    responses the global trie keeps, 0 = none (suffix_decoding_max_cached_requests)
    tokens=65536    tokens the global trie keeps (a memory bound: it holds up to depth nodes per token)
    factor=1.0      draft depth per matched token (suffix_decoding_max_spec_factor)
    offset=0        draft depth added to it (Arctic Inference's max_spec_offset)
    min_prob=0.1    the least path probability drafted (suffix_decoding_min_token_prob)
The tree spec caps the rest: chain:K drafts one path of <= K tokens, dynamic:depth=D,topk=K,tokens=N a
tree of <= N nodes, D levels and K children per node. Drafts are deterministic: the acceptance rule takes
each node as a point mass (draft_probs None), exact at any temperature.
"""

from __future__ import annotations

import math

import torch

from draftsmith.runtime.drafters.drafter import Drafter
from draftsmith.runtime.drafters.suffix_tree import ResponseCache, SpecLimits, SuffixTrie, speculate
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch, root_only
from draftsmith.runtime.verify.tree import DynamicTree, Tree, TreeSpec

DEFAULTS = {"depth": 24, "requests": 256, "tokens": 65536, "factor": 1.0, "offset": 0.0, "min_prob": 0.1}
MAX_DEPTH = 256
OPTIONS_HELP = (
    "suffix or suffix:KEY=VALUE,... with depth an integer in [2, 256], requests an integer >= 0, tokens an "
    "integer >= 1, factor a number >= 0, offset a number, min_prob a number in [0, 1]"
)


def parse_options(spec: str) -> dict:
    """`suffix[:k=v,...]` -> every option's value (defaults filled in); BadInputError on anything else."""
    _, sep, arg = spec.partition(":")
    options, given = dict(DEFAULTS), set()
    if not sep:
        return options
    for part in arg.split(","):
        key, eq, value = part.partition("=")
        if not eq or key not in DEFAULTS or key in given:
            raise BadInputError("--draft", spec, OPTIONS_HELP)
        given.add(key)
        options[key] = _value(spec, key, value)
    return options


def _value(spec: str, key: str, value: str):
    try:
        number = int(value) if isinstance(DEFAULTS[key], int) else float(value)
    except ValueError:
        raise BadInputError("--draft", spec, OPTIONS_HELP) from None
    ok = {
        "depth": lambda v: 2 <= v <= MAX_DEPTH,
        "requests": lambda v: v >= 0,
        "tokens": lambda v: v >= 1,
        "factor": lambda v: math.isfinite(v) and v >= 0,
        "offset": math.isfinite,
        "min_prob": lambda v: 0 <= v <= 1,
    }[key](number)
    if not ok:
        raise BadInputError("--draft", spec, OPTIONS_HELP)
    return number


class SuffixDrafter(Drafter):
    name = "suffix"

    def __init__(self, tree: TreeSpec, spec: str = "suffix", device: torch.device | str = "cpu"):
        super().__init__()
        self.device = device
        if isinstance(tree, Tree) and any(len(tree.children(i)) > 1 for i in range(tree.size)):
            raise BadInputError(
                "--tree", "static tree", "chain:K or dynamic:depth=D,topk=K,tokens=N for suffix"
            )
        self.tree, self.spec = tree, spec
        self.options = parse_options(spec)
        depth = self.options["depth"]
        self.cache = ResponseCache(depth, self.options["requests"], self.options["tokens"])
        self.tries: list[SuffixTrie] = []
        self.prompts: list[list[int]] = []
        self.seen: list[list[int]] = []  # per row the context of the last proposal (the response to cache)
        self.done: list[bool] = []  # per row: ended, its response cached (later contexts run past its end)

    def limits(self, tree: TreeSpec) -> SpecLimits:
        o = self.options  # the budget (the load-aware policy's chain, say) may change between cycles
        if isinstance(tree, DynamicTree):
            nodes, depth, branches = tree.tokens, tree.depth, tree.topk
        else:
            nodes, depth, branches = tree.size - 1, tree.max_depth, 1
        return SpecLimits(nodes, depth, branches, o["factor"], o["offset"], o["min_prob"])

    def start(self, prompts, params, generators, features=None, static_slots=None) -> None:
        super().start(prompts, params, generators, features)
        self._finish(range(len(self.tries)))  # the previous batch's rows not yet cached
        self.prompts = [list(p) for p in prompts]
        self.seen = [list(p) for p in prompts]
        self.done = [False] * len(prompts)
        for prompt in self.prompts:
            self.cache.evict(tuple(prompt))
        self.tries = []
        for prompt in self.prompts:
            trie = SuffixTrie(self.options["depth"])
            trie.extend(prompt)
            self.tries.append(trie)

    def propose(self, contexts: list[list[int]], tree: TreeSpec) -> DraftBatch:
        limits = self.limits(tree)
        self.seen = [
            seen if done else ctx for seen, ctx, done in zip(self.seen, contexts, self.done, strict=True)
        ]
        drafts = [
            root_only(ctx[-1]) if done else self._draft(trie, ctx, limits)
            for trie, ctx, done in zip(self.tries, contexts, self.done, strict=True)
        ]
        return DraftBatch.from_drafts(drafts, self.device)

    def _draft(self, trie: SuffixTrie, ctx: list[int], limits: SpecLimits) -> Draft:
        trie.extend(ctx[trie.length :])  # the tokens committed since the last cycle
        candidates = [(trie, node, m) for m, node in enumerate(trie.suffix_nodes()) if m and trie.cont[node]]
        candidates += [(self.cache.trie, node, m) for node, m in self.cache.matches(ctx)]
        best = speculate(candidates, limits)
        if not best.tokens:
            return root_only(ctx[-1])
        return Draft(Tree((-1, *(p + 1 for p in best.parents))), [ctx[-1], *best.tokens])

    def retain(self, rows: list[int]) -> None:
        super().retain(rows)
        keep = set(rows)
        self._finish([r for r in range(len(self.tries)) if r not in keep])
        self.tries = [self.tries[r] for r in rows]
        self.prompts = [self.prompts[r] for r in rows]
        self.seen = [self.seen[r] for r in rows]
        self.done = [self.done[r] for r in rows]

    def ended(self, rows: list[int]) -> None:
        self._finish(rows)

    def _finish(self, rows) -> None:
        """Finished rows' responses (what the row's trie has seen past the prompt) join the global trie,
        once per row."""
        for r in rows:
            if self.done[r]:
                continue
            self.done[r] = True
            prompt, seen = self.prompts[r], self.seen[r]
            if len(seen) > len(prompt):
                self.cache.add(tuple(prompt), seen[len(prompt) :])
