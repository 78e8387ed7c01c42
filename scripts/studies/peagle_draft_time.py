"""Draft time per cycle on SmolLM2-135M: P-EAGLE (K=4, one head forward) vs EAGLE-3 (the same head shape,
one forward per depth), with the target's 5-token verification for scale.

    OMP_NUM_THREADS=1 python scripts/studies/peagle_draft_time.py [THREADS]

Random heads (the time does not depend on the weights), draft vocabulary 8192, prompts of 96 random
tokens, each cycle one new (token, feature) pair as in steady decoding with nothing accepted; the methods
are interleaved round-robin over 40 cycles (3 warm-up), medians and minima in ms.
"""

import statistics
import sys
import time

import torch

from draftsmith.runtime.core.engine import prefill_features
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.drafters.peagle_drafter import peagle_drafter
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.peagle import PEagleConfig, PEagleHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
t = Target.load("smollm2-135m", device="cpu", dtype="float32")
aux = (1, 14, 26)
torch.manual_seed(0)
e3 = Eagle3Head(Eagle3Config.for_target(t, aux, 8192)).eval()
pe = PEagleHead(PEagleConfig.for_target(t, aux, 8192, block_size=4)).eval()
g = torch.Generator().manual_seed(0)
DYN = "dynamic:depth=4,topk=4,tokens=16"
METHODS = [
    ("eagle3", "chain:4"),
    ("peagle", "chain:4"),
    ("eagle3", "chain:2"),
    ("peagle", "chain:2"),
    ("eagle3", DYN),
    ("peagle", DYN),
    ("target", "verify 5 tokens"),
]


@torch.inference_mode()
def bench(batch, rounds=40):
    prompts = [torch.randint(100, 40000, (96,), generator=g).tolist() for _ in range(batch)]
    cache0, _, feats = prefill_features(t, prompts, 400, aux)
    state = {}
    for kind, spec in METHODS:
        if kind == "target":
            continue
        d = (
            eagle3_drafter(e3, t, parse_tree_spec(spec))
            if kind == "eagle3"
            else peagle_drafter(pe, t, parse_tree_spec(spec))
        )
        d.start(prompts, SamplingParams(), None, feats)
        state[kind, spec] = [d, [p + [5] for p in prompts], []]
    verify = []
    for r in range(rounds + 3):
        for key, (d, ctx, times) in state.items():
            t0 = time.perf_counter()
            d.propose(ctx, d.tree)
            dt = time.perf_counter() - t0
            if r >= 3:
                times.append(dt)
            d.commit([[] for _ in prompts], [torch.randn(1, feats[0].shape[-1]) for _ in prompts])
            state[key][1] = [x + [7] for x in ctx]
        ids = torch.randint(100, 40000, (batch, 5), generator=g)
        pos = torch.arange(96, 101)[None].expand(batch, -1)
        t0 = time.perf_counter()
        t.forward(ids, cache0, pos)
        dt = time.perf_counter() - t0
        cache0.crop(96)
        if r >= 3:
            verify.append(dt)
    out = {k: v[2] for k, v in state.items()}
    out["target", "verify 5 tokens"] = verify
    for (kind, spec), times in out.items():
        median, least = statistics.median(times) * 1e3, min(times) * 1e3
        print(f"batch {batch}  {kind:6s} {spec:34s} median {median:6.2f} ms  min {least:6.2f} ms", flush=True)


if __name__ == "__main__":
    for b in (1, 4):
        bench(b)
