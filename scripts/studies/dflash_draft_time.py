"""Draft time per cycle of a DFlash head (block 16, random weights: the time does not depend on them) on the
embedded SmolLM2-135M, next to the target's 1-token and 16-token forwards at the same context (200 tokens).

    OMP_NUM_THREADS=1 python scripts/studies/dflash_draft_time.py [--layers 1 2] [--cycles 30]

A cycle is what the DFlash drafter's `propose` does: project the 3 features committed since the last
cycle into the context cache, then one forward of the block [root, 15 masks] and the LM head over its 15
positions.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.dflash_drafter import dflash_drafter
from draftsmith.runtime.heads.aux_layers import default_aux_layers
from draftsmith.runtime.heads.dflash import DFlashConfig, DFlashHead
from draftsmith.runtime.verify.sampling import SamplingParams


def median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def draft_times(target, features, prompt, layers: int, cycles: int) -> tuple[float, int]:
    config = DFlashConfig.for_target(target, None, 8192, block_size=16, num_layers=layers)
    head = DFlashHead(config).init_from_target(target).eval()
    drafter = dflash_drafter(target, head, "chain:15")
    drafter.start([prompt], SamplingParams(), None, [features])
    drafter.propose([prompt + [5]], drafter.tree)  # warm-up, and the prompt's context
    times = []
    for _ in range(cycles):
        drafter.commit([[1, 2]], [features[:3]])  # the root and two accepted tokens join the context
        start = time.perf_counter()
        drafter.propose([prompt + [5]], drafter.tree)
        times.append(time.perf_counter() - start)
    return median(times), sum(p.numel() for p in head.parameters())


def target_times(target, ids, cycles: int) -> dict[int, float]:
    cache = target.new_cache(1, 600)
    target.forward(ids, cache)
    out = {}
    for n in (1, 16):
        times = []
        for _ in range(cycles):
            length = cache.length
            start = time.perf_counter()
            target.forward(torch.tensor([[7] * n]), cache)
            times.append(time.perf_counter() - start)
            cache.crop(length)
        out[n] = median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cycles", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    target = Target.load("smollm2-135m", device="cpu", dtype="float32")
    prompt = list(range(100, 300))
    ids = torch.tensor([prompt])
    layers = default_aux_layers(target.num_layers)  # (1, 14, 26): the recipe's taps
    out = target.forward(ids, target.new_cache(1, 512), capture_layers=layers)
    features = torch.cat([out.aux[i] for i in layers], -1)[0]  # [200, 3 x 576]
    for n in args.layers:
        seconds, params = draft_times(target, features, prompt, n, args.cycles)
        print(f"dflash block 16, {n} layer(s), {params / 1e6:.1f}M params: {1e3 * seconds:.1f} ms per cycle")
    forwards = target_times(target, ids, args.cycles // 2)
    print(f"target forward: 1 token {1e3 * forwards[1]:.1f} ms, 16 tokens {1e3 * forwards[16]:.1f} ms")


if __name__ == "__main__":
    main()
