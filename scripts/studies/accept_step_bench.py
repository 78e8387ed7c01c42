"""Time the engine's acceptance step: the per-row walk (runtime/verify/acceptance.py, as the engine ran it
before
the kernels) against the batched call (runtime/verify/batch_accept.py -> draftsmith.kernels), side by side.

    python scripts/studies/accept_step_bench.py                  # CPU: the torch references
    python scripts/studies/accept_step_bench.py --device cuda    # GPU: the Triton kernels

Shapes: the embedded target's vocabulary (49152), batch 1/4/16, chain:2, chain:4 and static:binary-3;
temperature 0 and 1. Both sides get the same logits; each timing is the median of interleaved repeats
after a warm-up, in ms per cycle (device-synchronized).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftsmith.runtime.verify.acceptance import accept_greedy, accept_sampled, generator_coin, generator_draw
from draftsmith.runtime.verify.batch_accept import accept_batch, fetch
from draftsmith.runtime.verify.draft_batch import Draft, DraftBatch
from draftsmith.runtime.verify.sampling import SamplingParams, logits_to_probs, make_generators
from draftsmith.runtime.verify.tree import parse_tree_spec


def drafts_for(tree_spec: str, batch: int, logits: torch.Tensor, sampled: bool) -> list[Draft]:
    """Drafts whose tokens are the target's argmax at the parent half the time (so walks go deep)."""
    tree = parse_tree_spec(tree_spec)
    g = torch.Generator().manual_seed(0)
    vocab = logits.shape[-1]
    best = logits.argmax(-1).cpu()  # [B, N]
    drafts = []
    for b in range(batch):
        tokens = [0]
        for parent in tree.parents[1:]:
            match = torch.rand((), generator=g) < 0.5
            tokens.append(int(best[b, parent]) if match else int(torch.randint(vocab, (), generator=g)))
        q = torch.softmax(logits[b], -1) if sampled else None  # [N, V] a stand-in law
        drafts.append(Draft(tree, tokens, q))
    return drafts


def per_row(drafts, logits, params, gens):
    out = []
    for b, d in enumerate(drafts):
        rows = logits[b, : d.tree.size]
        if params.greedy:
            out.append(accept_greedy(d.tree.parents, d.tokens, rows))
        else:
            probs = logits_to_probs(rows, params)
            g = gens[b]
            out.append(
                accept_sampled(
                    d.tree.parents, d.tokens, probs, d.draft_probs, generator_coin(g), generator_draw(g)
                )
            )
    return out


def timed(fn, device, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    device = torch.device(args.device)
    print("| T | batch | tree | per-row walk ms | batched ms | ratio |\n|---:|---:|---|---:|---:|---:|")
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature)
        for batch in (1, 4, 16):
            for spec in ("chain:2", "chain:4", "static:binary-3"):
                nodes = parse_tree_spec(spec).size
                logits = 3 * torch.randn(batch, nodes, args.vocab, device=device)
                drafts = drafts_for(spec, batch, logits, sampled=temperature > 0)
                gens = None if params.greedy else make_generators(0, list(range(batch)), device)
                case = (drafts, logits, params, gens)
                batch_case = (DraftBatch.from_drafts(drafts, device), logits, params, gens)

                def batched_step(c=batch_case):  # acceptance and the cycle's one host transfer
                    return fetch(c[0], accept_batch(*c))

                per_row(*case), batched_step()  # warm-up
                walk, batched = [], []
                for _ in range(args.repeats):  # interleaved
                    walk += timed(lambda c=case: per_row(*c), device, 1)
                    batched += timed(batched_step, device, 1)
                w, n = statistics.median(walk), statistics.median(batched)
                print(f"| {temperature:g} | {batch} | {spec} | {w:.3f} | {n:.3f} | {n / w:.2f} |")


if __name__ == "__main__":
    main()
