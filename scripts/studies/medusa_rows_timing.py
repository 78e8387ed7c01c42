"""Draft time per cycle of Medusa heads with a shared, reduced LM head: the draft rows cached
(runtime/heads/medusa.py `draft_rows`) against sliced on every call (what draft_logits did before).

    OMP_NUM_THREADS=1 python scripts/studies/medusa_rows_timing.py [--repeats 300] [--threads 1]

The embedded target (SmolLM2-135M, fp32, CPU), 3 heads of one block, a draft vocabulary of 8192 random
ids, batch 1: one cycle is `heads.logits(target, heads(h))`, what MedusaSteps.pending runs. The two
variants alternate in blocks of cycles (the machine's load falls on both alike); prints medians and
p10/p90 per cycle.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads


def quantiles(times: list[float]) -> str:
    ms = sorted(1e3 * t for t in times)
    p10, p90 = ms[len(ms) // 10], ms[9 * len(ms) // 10]
    return f"median {statistics.median(ms):.2f} ms (p10 {p10:.2f}, p90 {p90:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--blocks", type=int, default=10, help="alternating blocks per variant")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = Target.load("smollm2-135m", device="cpu", dtype="float32")
    heads = MedusaHeads(MedusaConfig.for_target(target, 3, draft_vocab_size=args.draft_vocab))
    g = torch.Generator().manual_seed(0)
    heads.set_draft_vocab(torch.randperm(target.vocab_size, generator=g)[: args.draft_vocab].sort().values)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.02, generator=g)
    hidden = torch.randn(1, target.hidden_size, generator=g)  # [B=1, H]

    def sliced(weight):  # what draft_logits did before the cache: slice on every call, free after
        return weight.index_select(0, heads.draft_ids().to(weight.device))

    times: dict[str, list[float]] = {"cached": [], "sliced every call": []}
    with torch.inference_mode():
        want = heads.logits(target, heads(hidden))
        for block in range(2 * args.blocks):  # ABAB blocks of cycles: load and caches fall on both alike
            name = list(times)[block % 2]
            if name == "cached":
                vars(heads).pop("draft_rows", None)  # the method again
            else:
                heads.draft_rows = sliced  # an instance attribute shadows the method
            for i in range(args.repeats // args.blocks + 5):
                t0 = time.perf_counter()
                out = heads.logits(target, heads(hidden))  # [3, 1, V]
                if i >= 5:  # warm-up after each switch
                    times[name].append(time.perf_counter() - t0)
                assert torch.equal(out, want)
    print(f"SmolLM2-135M fp32 CPU, 3 heads, Vd={args.draft_vocab}, B=1, {args.threads} thread(s), "
          f"{args.repeats} cycles each")  # fmt: skip
    for name, ts in times.items():
        print(f"  {name:>18}: {quantiles(ts)}")
    ratio = statistics.median(times["sliced every call"]) / statistics.median(times["cached"])
    print(f"  speedup of the draft step: {ratio:.2f}x")


if __name__ == "__main__":
    main()
