"""How far can the TTT step's attention work take the recipe's online step? An upper bound (issue 21).

    OMP_NUM_THREADS=2 .venv/bin/python scripts/studies/ttt_step_bound.py

Times the EAGLE-3 TTT step (forward + backward, K = 7, the recipe's shapes from
scripts/studies/ttt_step_bench.py: batch 4 x 512, hidden 576, draft vocabulary 8192) three ways, interleaved
after a warm-up, medians of 3:
"before" (dense [T, (k+1)T] mask, full-vocabulary logits), "after" (today's decomposed attention and
chunked logits) and "after" with the attention replaced by a free op (returns q): no attention path can
beat that one. Then the frozen target's forward of the same 4 x 512 tokens (what an online step adds,
fp32, the embedded SmolLM2-135M), so the bound for the whole online step is
(before + target) / (free + target).
"""

import statistics
import sys
import time

import torch

sys.path.insert(0, "scripts/studies")
import ttt_step_bench as b

from draftsmith.train.objectives import eagle3_objective as eo

torch.manual_seed(0)
head, target = b.make_head("smollm2-135m"), b.TargetParts("smollm2-135m")
batch = b.make_batch("smollm2-135m", 4, 512, torch.device("cpu"))
real = eo.ttt_attention
free = lambda q, k0, v0, ks, vs, backend=None: q * 1.0
runs = {
    "before": b.step_fn("before", head, target, batch, 7, 1024),
    "after": b.step_fn("after", head, target, batch, 7, 1024),
}


def timed(name, attn):
    eo.ttt_attention = attn
    t0 = time.perf_counter()
    runs[name]()
    return time.perf_counter() - t0


for n in ("before", "after"):
    timed(n, real)
res = {"before": [], "after": [], "after-free-attention": []}
for _ in range(3):
    res["before"].append(timed("before", real))
    res["after"].append(timed("after", real))
    res["after-free-attention"].append(timed("after", free))
for k, v in res.items():
    print(k, [round(x, 2) for x in v], "median", round(statistics.median(v), 2))
from draftsmith.runtime.core.target import Target  # noqa: E402
from draftsmith.train.objectives.eagle3_data import online_batch  # noqa: E402

full = Target.load("smollm2-135m", device="cpu", dtype="float32")
rows = [{"input_ids": r, "loss_mask": torch.ones(512, dtype=torch.long)} for r in batch.input_ids]
online_batch(full, rows, b.AUX)
fwd = []
for _ in range(3):
    t0 = time.perf_counter()
    online_batch(full, rows, b.AUX)
    fwd.append(time.perf_counter() - t0)
tgt = statistics.median(fwd)
med = {k: statistics.median(v) for k, v in res.items()}
print(
    f"target forward {tgt:.2f} s; online step: after {(med['before'] + tgt) / (med['after'] + tgt):.2f}x, "
    f"bound with free attention {(med['before'] + tgt) / (med['after-free-attention'] + tgt):.2f}x"
)
