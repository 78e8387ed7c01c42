"""Teacher-forced acceptance at T = 0: `draftsmith eval`'s fast path. The target's greedy continuation of a
set is decoded once and its features taken in one prefill; then each draft runs the drafter protocol alone
against that continuation, with no target forward per cycle.

    tf = TeacherForced.decode(target, prompt_ids, max_new_tokens, lookahead=K, batch_size=16,
                              capture_layers=(1, 14, 26))
    results = replay(drafter, tree, tf, batch_size=16)   # GenerationResults, as generate_speculative's

Why it is the runtime's acceptance. At T = 0 the runtime's verify accepts a drafted child while its token is
the target's argmax at its parent (runtime/verify/acceptance.py accept_greedy); speculation is lossless, so
every argmax along the committed path is the next token of the target's greedy continuation. The replay
therefore walks each draft tree along that continuation, commits what the runtime would commit (the
accepted nodes, then the continuation's next token), hands the drafter the target's features at the root
and the accepted nodes (from the prefill, where the runtime takes them from the verify forward), and
mirrors the runtime's batch: the same batches, the same first token, finished rows riding along until half
the batch has finished (runtime/core/speculative.py `compacts`), the drafter told when rows end. A last
cycle's path may run past a row's EOS or budget, so the continuation runs `lookahead` tokens past them
(decoded ignoring EOS). What can differ is floating point only: a prefill's and a tree verify's reduction
orders differ, as a batch of 4 and of 1 do, so a near-tie in a draft's logits could fall the other way;
`tests/runtime/test_eval_replay.py` holds the replay equal to `generate` for every drafter kind.

Not replayed (eval runs them through the engine): T > 0 (the sampled continuation depends on the draft's
coins), and `auto:K` / `adaptive:K` (their depth reads measured times).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from draftsmith.runtime.core.engine import GenerationResult, check_prompts, prefill_features, token_budgets
from draftsmith.runtime.core.speculative import Rows, compacts, record_cycle, tell_ended
from draftsmith.runtime.verify.acceptance import children_lists
from draftsmith.runtime.verify.sampling import SamplingParams

GREEDY = SamplingParams()


@dataclass
class TeacherForced:
    """Per prompt: the prompt, the target's greedy continuation (`lookahead` tokens past its budget, EOS
    not stopping it), the row's budget, the target's features over both ([len, A*H], None without capture
    layers) and the stop tokens."""

    prompts: list[list[int]]
    sequences: list[list[int]]  # prompt + continuation
    budgets: list[int]
    features: list[torch.Tensor] | None
    max_new_tokens: int
    eos: set[int]
    capture_layers: tuple[int, ...] = ()

    @staticmethod
    def decode(target, prompts, max_new_tokens, lookahead, batch_size, capture_layers=()) -> TeacherForced:
        check_prompts(target, prompts, max_new_tokens)  # as the engine does
        budgets = token_budgets(target, prompts, max_new_tokens)
        steps = [
            min(b + lookahead, target.max_context - len(p)) for b, p in zip(budgets, prompts, strict=True)
        ]
        sequences, features = [], []
        for start in range(0, len(prompts), batch_size):
            rows = prompts[start : start + batch_size]
            seqs, feats = greedy_continuation(
                target, rows, max(steps[start : start + batch_size]), capture_layers
            )
            sequences += [s[: len(p) + n] for s, p, n in zip(seqs, rows, steps[start:], strict=False)]
            features += [f[: len(s)] for f, s in zip(feats, sequences[start:], strict=False)]
        eos = set(target.eos_token_ids)
        layers = tuple(capture_layers)
        return TeacherForced(prompts, sequences, budgets, features or None, max_new_tokens, eos, layers)

    def with_features(self, target, capture_layers: tuple[int, ...], batch_size: int) -> TeacherForced:
        """The target's features at every position, one prefill per batch (the cache dropped after)."""
        if capture_layers == self.capture_layers:
            return self
        if not capture_layers:
            return replace(self, features=None, capture_layers=())
        features = []
        with torch.inference_mode():
            for start in range(0, len(self.sequences), batch_size):
                rows = self.sequences[start : start + batch_size]
                features += prefill_features(target, rows, 0, capture_layers)[2]
        return TeacherForced(
            self.prompts,
            self.sequences,
            self.budgets,
            features,
            self.max_new_tokens,
            self.eos,
            capture_layers,
        )


@torch.inference_mode()
def greedy_continuation(target, prompts, steps: int, capture_layers=()) -> tuple[list, list]:
    """Plain greedy decoding of `steps` tokens per row, EOS not stopping it (plain decoding's own
    prefill and one-token steps), and the target's features at every position when asked -> per row the
    prompt + continuation, and [len, A*H] features ([] without capture layers)."""
    cache, logits, features = prefill_features(target, prompts, steps, capture_layers)
    positions = torch.tensor([[len(p)] for p in prompts], device=target.device)  # [B, 1]
    chosen, aux = [], []
    for step in range(steps):
        chosen.append(logits.argmax(dim=-1))  # [B]; first index on ties, as plain greedy decoding
        if step == steps - 1 and not capture_layers:
            break  # the last token's features are not needed without capture layers
        out = target.forward(chosen[-1][:, None], cache, positions + step, capture_layers=capture_layers)
        logits = target.logits(out.hidden[:, -1])
        if capture_layers:
            aux.append(torch.cat([out.aux[i] for i in capture_layers], dim=-1))  # [B, 1, A*H]
    tokens = torch.stack(chosen, dim=1).tolist()  # [B, steps]
    seqs = [p + t for p, t in zip(prompts, tokens, strict=True)]
    if capture_layers:
        later = torch.cat(aux, dim=1)  # [B, steps, A*H]
        features = [torch.cat([f, later[i]]) for i, f in enumerate(features)]
    return seqs, features


def replay(drafter, tree, tf: TeacherForced, batch_size: int, calibration=None) -> list[GenerationResult]:
    """Every prompt through `drafter` on `tree` against the teacher-forced continuation, in the runtime's
    batches -> what generate_speculative returns at T = 0 (no times). `calibration` (a SurvivalTally or
    SurvivalPairs) is handed each cycle's verified drafts and accepted nodes, as generate_speculative's."""
    results = []
    for start in range(0, len(tf.prompts), batch_size):
        index = list(range(start, min(start + batch_size, len(tf.prompts))))
        results += replay_batch(drafter, tree, tf, index, calibration)
    return results


@torch.inference_mode()
def replay_batch(
    drafter, tree, tf: TeacherForced, index: list[int], calibration=None
) -> list[GenerationResult]:
    prompts = [tf.prompts[i] for i in index]
    seqs = [tf.sequences[i] for i in index]
    feats = None if tf.features is None else [tf.features[i] for i in index]
    rows = Rows([GenerationResult(p, [], "", 1, 0.0) for p in prompts], [tf.budgets[i] for i in index],
                [[] for _ in prompts], tf.max_new_tokens, tf.eos)  # fmt: skip
    for r, (prompt, seq) in enumerate(zip(prompts, seqs, strict=True)):
        rows.emit(r, [seq[len(prompt)]])  # the prefill's argmax: the continuation's first token
    start_features = None if feats is None else [f[: len(p)] for f, p in zip(feats, prompts, strict=True)]
    drafter.start(prompts, GREEDY, None, start_features)
    active, told = list(range(len(prompts))), set()
    while running := rows.running(active):
        tell_ended(drafter, rows, active, told)
        if compacts(len(running), len(active), static=False):
            drafter.retain(running)
            active, running = [active[i] for i in running], list(range(len(running)))
        contexts, before = rows.contexts(active), drafter.forwards
        batch = drafter.propose(contexts, tree).only_roots(
            [i for i in range(len(active)) if i not in running]
        )
        accepted, tokens, features = walk(
            batch, contexts, [seqs[r] for r in active], feats and [feats[r] for r in active]
        )
        if calibration is not None:
            calibration.add(batch, accepted)
        drafter.commit(accepted, features, None if batch.fetched is None else batch.fetched.tolist())
        depths = batch.depths.max(dim=1).values.tolist()
        for i, r in enumerate(active):
            if not rows.results[r].finish_reason:
                record_cycle(rows.results[r], depths[i], len(accepted[i]), drafter.forwards - before)
            rows.emit(r, tokens[i])
    return rows.results


def walk(batch, contexts, seqs, feats) -> tuple[list[list[int]], list[list[int]], list[torch.Tensor] | None]:
    """Per row: the nodes the greedy rule accepts along the continuation, the tokens committed (those, then
    the continuation's next), and the target's features at the root and the accepted nodes. A row that
    has run past its continuation (finished, riding along: drafts cut to the root) commits a filler."""
    table = torch.cat([batch.tokens, batch.parents], dim=1).tolist()  # one transfer
    width, accepted, tokens, features = batch.tokens.shape[1], [], [], [] if feats is not None else None
    for b, (row, n) in enumerate(zip(table, batch.sizes, strict=True)):
        ids, parents, seq, at = row[:n], row[width : width + n], seqs[b], len(contexts[b])
        children, node, path = children_lists(parents), 0, []
        while at + len(path) < len(seq):  # the target's argmax at `node` is seq[at + len(path)]
            match = next((c for c in children[node] if ids[c] == seq[at + len(path)]), None)
            if match is None:
                break
            path.append(match)
            node = match
        end = at + len(path)
        accepted.append(path)
        tokens.append(seq[at:end] + [seq[end] if end < len(seq) else seq[-1]])
        if features is not None:
            f = feats[b][at - 1 : end]  # the root (position at - 1) and the accepted nodes
            features.append(f if len(f) == len(path) + 1 else feats[b][-1:].expand(len(path) + 1, -1))
    return accepted, tokens, features
