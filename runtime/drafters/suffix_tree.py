"""Suffix decoding's data structures (Oliaro et al. 2024, arXiv 2411.04975): depth-bounded suffix tries with
occurrence counts, a bounded cache of earlier responses, and frequency-ranked draft trees. Stdlib only.

    trie = SuffixTrie(max_depth=24)
    trie.extend(prompt_tokens); trie.extend(new_tokens)       # O(max_depth) per token, never rebuilt
    trie.suffix_nodes()                                       # nodes of the last 0, 1, .. tokens (matches)
    cache = ResponseCache(max_depth=24, max_requests=256, max_tokens=65536)
    cache.add(key, response_tokens)                           # oldest responses leave past either bound
    best = speculate([(trie, node, m), ...], SpecLimits(6, 4, 2))  # the most expected tokens: a draft tree

A node stands for one token string s of length <= max_depth (its depth). `counts[node]` is the number
of occurrences of s (start positions, across every sequence added); `cont[node]` the number of those
followed by one more token inside the same sequence and the depth bound, which is the sum of its
children's counts. A child's probability estimate is its count over its parent's `cont` (the paper's
frequency estimate, with occurrences that end the text left out, since they predict nothing).

Why a bounded-depth trie rather than Ukkonen's tree: suffix decoding never matches or drafts past the
depth bound (the paper and vLLM's `suffix_decoding_max_tree_depth`: the bound caps match + draft length),
so every substring of length <= D is a node, and appending token t updates exactly the <= D nodes of the
suffixes ending at the previous end (`_active`) by one child step each: O(D) per token, with the current
match for every length already at hand.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass


class SuffixTrie:
    """Every substring of length <= max_depth of the added sequences, with occurrence counts."""

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        # Most nodes of a deep trie have one child (a substring that occurred once has one continuation),
        # so a lone child is kept inline in flat arrays and a dict is made only at a branch: 3x less memory
        # than a dict per node (measured: 280 -> ~90 bytes per node).
        self.branches: list[dict[int, int] | None] = [None]  # node -> {token: child} from 2 children on
        self.lone_token, self.lone_child = array("q", [-1]), array("q", [0])  # the inline child, -1 = none
        self.counts, self.cont, self.depth = array("q", [0]), array("q", [0]), array("q", [0])
        self._free: list[int] = []  # node ids released by `remove`, reused first
        self._active = [0]  # nodes of the current sequence's suffixes of length 0..D-1, shortest first
        self.length = 0  # tokens of the current (last) sequence

    @property
    def live_nodes(self) -> int:
        return len(self.counts) - len(self._free)

    def child(self, node: int, token: int) -> int | None:
        kids = self.branches[node]
        if kids is not None:
            return kids.get(token)
        return self.lone_child[node] if self.lone_token[node] == token else None

    def items(self, node: int) -> list[tuple[int, int]]:
        """(token, child) of every child of a node."""
        kids = self.branches[node]
        if kids is not None:
            return list(kids.items())
        return [(self.lone_token[node], self.lone_child[node])] if self.lone_token[node] >= 0 else []

    def _link(self, node: int, token: int, child: int) -> None:
        kids = self.branches[node]
        if kids is not None:
            kids[token] = child
        elif self.lone_token[node] < 0:
            self.lone_token[node], self.lone_child[node] = token, child
        else:
            self.branches[node] = {self.lone_token[node]: self.lone_child[node], token: child}
            self.lone_token[node] = -1

    def _unlink(self, node: int, token: int) -> None:
        kids = self.branches[node]
        if kids is None:
            self.lone_token[node] = -1
            return
        del kids[token]
        if len(kids) == 1:
            ((self.lone_token[node], self.lone_child[node]),) = kids.items()
            self.branches[node] = None

    def _new_node(self, depth: int) -> int:
        if self._free:
            node = self._free.pop()
            self.branches[node] = None
            self.lone_token[node], self.counts[node], self.cont[node], self.depth[node] = -1, 0, 0, depth
            return node
        self.branches.append(None)
        self.lone_token.append(-1)
        self.lone_child.append(0)
        self.counts.append(0)
        self.cont.append(0)
        self.depth.append(depth)
        return len(self.counts) - 1

    def extend(self, tokens) -> None:
        """Append tokens to the current sequence: each new end extends every suffix shorter than D."""
        limit = self.max_depth
        for token in tokens:
            nxt = [0]
            for node in self._active:
                child = self.child(node, token)
                if child is None:
                    child = self._new_node(self.depth[node] + 1)
                    self._link(node, token, child)
                self.counts[child] += 1
                self.cont[node] += 1
                if self.depth[child] < limit:
                    nxt.append(child)
            self.counts[0] += 1
            self._active = nxt
            self.length += 1

    def new_sequence(self) -> None:
        """Later tokens start a separate sequence (no substring crosses the boundary)."""
        self._active, self.length = [0], 0

    def suffix_nodes(self) -> list[int]:
        """Nodes of the current sequence's last m tokens for m = 0 .. min(length, D - 1)."""
        return self._active

    def find(self, tokens) -> int | None:
        """The node of a token string, or None when it does not occur."""
        node = 0
        for token in tokens:
            node = self.child(node, token)
            if node is None:
                return None
        return node

    def remove(self, tokens) -> None:
        """Take out one earlier `extend` of exactly these tokens as a separate sequence (counts drop; nodes
        that no occurrence holds any more are released): O(len * D), like adding it."""
        n, limit = len(tokens), self.max_depth
        self.counts[0] -= n
        for start in range(n):
            node, dead = 0, None
            for token in tokens[start : start + limit]:
                child = self.child(node, token)
                self.counts[child] -= 1
                self.cont[node] -= 1
                if dead is None and self.counts[child] == 0:
                    dead = (node, token, child)
                node = child
            if dead is not None:  # counts never grow with depth: the whole subtree is empty now
                parent, token, child = dead
                self._unlink(parent, token)
                self._release(child)

    def _release(self, node: int) -> None:
        stack = [node]
        while stack:
            current = stack.pop()
            stack.extend(child for _, child in self.items(current))
            self.branches[current], self.lone_token[current] = None, -1
            self._free.append(current)

    def ranked_children(self, node: int) -> list[tuple[int, int, float]]:
        """(token, child, count ratio) by count, most frequent first (ties: smaller token id)."""
        total = self.cont[node]
        if total <= 0:
            return []
        ranked = sorted(self.items(node), key=lambda kv: (-self.counts[kv[1]], kv[0]))
        return [(token, child, self.counts[child] / total) for token, child in ranked]


class ResponseCache:
    """The global trie over earlier responses, bounded by request count and by total tokens. Entries leave
    in insertion order (vLLM's FIFO); adding a key again first removes its earlier response, so a request
    served again never drafts from its own earlier answer. max_requests = 0 disables it."""

    def __init__(self, max_depth: int, max_requests: int, max_tokens: int):
        self.trie = SuffixTrie(max_depth)
        self.max_requests, self.max_tokens = max_requests, max_tokens
        self.entries: OrderedDict[object, list[int]] = OrderedDict()
        self.tokens = 0

    def __contains__(self, key) -> bool:
        return key in self.entries

    def evict(self, key) -> None:
        tokens = self.entries.pop(key, None)
        if tokens is not None:
            self.trie.remove(tokens)
            self.tokens -= len(tokens)

    def add(self, key, tokens: list[int]) -> None:
        self.evict(key)
        if self.max_requests == 0 or not tokens:
            return
        tokens = list(tokens[: self.max_tokens])
        self.entries[key] = tokens
        self.tokens += len(tokens)
        self.trie.new_sequence()
        self.trie.extend(tokens)
        self.trie.new_sequence()
        while len(self.entries) > self.max_requests or self.tokens > self.max_tokens:
            self.evict(next(iter(self.entries)))

    def matches(self, context: list[int]) -> list[tuple[int, int]]:
        """(node, m) for each suffix of the context of length m >= 1 that occurs with a continuation."""
        trie, out = self.trie, []
        for m in range(1, min(len(context), trie.max_depth - 1) + 1):
            node = trie.find(context[-m:])
            if node is None or trie.cont[node] == 0:
                break  # a longer suffix occurs (with a continuation) only where this one does
            out.append((node, m))
        return out


@dataclass(frozen=True)
class SpecLimits:
    """How much to draft: at most `nodes` tokens, `depth` levels and `branches` children per node;
    depth also <= floor(factor * match length + offset) (the paper's adaptive length, vLLM's
    max_spec_factor, Arctic Inference's max_spec_offset); only nodes whose path probability (product of
    count ratios) is >= min_prob."""

    nodes: int
    depth: int
    branches: int
    factor: float = 1.0
    offset: float = 0.0
    min_prob: float = 0.1

    def depth_for(self, match_len: int) -> int:
        return max(0, min(self.depth, math.floor(self.factor * match_len + self.offset)))


@dataclass
class SuffixDraft:
    parents: list[int]  # [N] over drafted nodes, -1 = child of the root
    tokens: list[int]  # [N]
    probs: list[float]  # [N] path probability estimates, non-increasing in creation order
    match_len: int = 0

    @property
    def score(self) -> float:  # the expected number of accepted tokens under the frequency estimate
        return sum(self.probs)


def expand(trie: SuffixTrie, node: int, depth: int, limits: SpecLimits) -> SuffixDraft:
    """Best-first growth from a matched node: the most probable nodes (at most limits.nodes, `depth`
    levels, `branches` per node, each >= min_prob). Probabilities never grow along a path, so the kept
    set is a subtree and creation order is topological, siblings by count."""
    draft = SuffixDraft([], [], [])
    if depth <= 0 or limits.nodes <= 0:
        return draft
    heap: list[tuple[float, int, int, int, int, int]] = []  # (-prob, order, token, node, parent, level)
    order = 0

    def push(parent_node: int, parent_id: int, prob: float, level: int) -> None:
        nonlocal order
        for token, child, ratio in trie.ranked_children(parent_node)[: limits.branches]:
            heapq.heappush(heap, (-prob * ratio, order, token, child, parent_id, level))
            order += 1

    push(node, -1, 1.0, 1)
    while heap and len(draft.tokens) < limits.nodes:
        neg, _, token, child, parent_id, level = heapq.heappop(heap)
        if -neg < limits.min_prob:
            break
        draft.parents.append(parent_id)
        draft.tokens.append(token)
        draft.probs.append(-neg)
        if level < depth:
            push(child, len(draft.tokens) - 1, -neg, level + 1)
    return draft


def speculate(candidates: list[tuple[SuffixTrie, int, int]], limits: SpecLimits) -> SuffixDraft:
    """Of the drafts grown from every candidate match (trie, node, match length), the one with the highest
    score (the paper's selection across match lengths and across the request and global trees); on equal
    scores the longer match (more specific evidence), then the earlier candidate."""
    best = SuffixDraft([], [], [])
    for trie, node, match_len in candidates:
        draft = expand(trie, node, limits.depth_for(match_len), limits)
        draft.match_len = match_len
        if draft.tokens and (draft.score, match_len) > (best.score, best.match_len):
            best = draft
    return best
