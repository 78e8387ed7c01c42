"""Prompt-lookup drafting (`--draft ngram`): propose what followed the last n-gram earlier in the context.

Saxena 2023 ("prompt lookup decoding", transformers' `prompt_lookup_num_tokens`): match the last
n tokens (n = 3, then 2, then 1) against earlier positions of the prompt and the generated text and
propose the tokens that followed. No model, no cache; every proposal is a deterministic choice, so the
acceptance rule treats each as a point mass (exact at any temperature).

    chain:K                          the continuation of the most recent match, up to K tokens
    dynamic:depth=D,topk=K,tokens=N  up to K distinct continuations (most recent matches first), merged
                                     into a trie of at most N nodes and depth D

Static trees of other shapes need per-node alternatives n-gram lookup does not rank, so they are refused.
"""

from __future__ import annotations

from draftsmith.runtime.drafters.drafter import Drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch, root_only
from draftsmith.runtime.verify.tree import DynamicTree, Tree, TreeSpec


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, tree: TreeSpec, max_ngram: int = 3, min_ngram: int = 1, device="cpu"):
        super().__init__()
        self.device = device  # where its DraftBatch goes (the target's)
        if isinstance(tree, Tree) and any(len(tree.children(i)) > 1 for i in range(tree.size)):
            raise BadInputError(
                "--tree", "static tree", "chain:K or dynamic:depth=D,topk=K,tokens=N for ngram"
            )
        self.tree = tree
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, contexts: list[list[int]], tree: TreeSpec) -> DraftBatch:
        return DraftBatch.from_drafts([self.draft(ctx, tree) for ctx in contexts], self.device)

    def draft(self, ctx: list[int], tree: TreeSpec) -> Draft:
        if isinstance(tree, DynamicTree):
            depth, branches, budget = tree.depth, tree.topk, tree.tokens
        else:
            depth, branches, budget = tree.max_depth, 1, tree.size - 1
        continuations = lookup(ctx, depth, branches, self.max_ngram, self.min_ngram)
        return trie_draft(ctx[-1], continuations, budget)


def lookup(ctx: list[int], length: int, count: int, max_ngram: int, min_ngram: int) -> list[list[int]]:
    """Up to `count` distinct continuations (each up to `length` tokens) of the context's last n-gram,
    longest n first, then most recent match first."""
    found: list[list[int]] = []
    for n in range(min(max_ngram, len(ctx) - 1), min_ngram - 1, -1):
        pattern = ctx[-n:]
        for start in range(len(ctx) - n - 1, -1, -1):  # the match at the very end is the pattern itself
            if ctx[start : start + n] == pattern:
                cont = ctx[start + n : start + n + length]
                if cont and cont not in found:
                    found.append(cont)
                    if len(found) == count:
                        return found
        if found:
            return found  # shorter n-grams only when the longer ones found nothing
    return found


def trie_draft(root: int, continuations: list[list[int]], budget: int) -> Draft:
    """Merge token sequences into a tree under the root, keeping at most `budget` drafted nodes."""
    if not continuations:
        return root_only(root)
    parents, tokens = [-1], [root]
    child_of: dict[tuple[int, int], int] = {}
    for cont in continuations:
        node = 0
        for token in cont:
            if (node, token) not in child_of:
                if len(tokens) - 1 == budget:
                    break
                child_of[(node, token)] = len(tokens)
                parents.append(node)
                tokens.append(token)
            node = child_of[(node, token)]
    return Draft(Tree(tuple(parents)), tokens)
