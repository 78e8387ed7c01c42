"""The EAGLE-3 TTT step (loss forward + backward) before and after issue 21 item 4, side by side on CPU.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/studies/ttt_step_bench.py --out runs/ttt-step-bench.json
    .venv/bin/python scripts/studies/ttt_step_bench.py --length 128 --repeats 1 --steps 1,2   # a quick look
    python3 scripts/studies/ttt_step_bench.py --device cuda --shape llama-8b --batch 1 --length 2048   # a GPU

"before" is `ttt_loss_ref`: SDPA over the (k+1)T concatenated keys with the [T, (k+1)T] mask, the
target's logits [B, T, V] at every position, one soft cross-entropy over [B, T, Vd] per step. "after" is
`ttt_loss`: causal attention + k diagonal keys merged by log-sum-exp, target logits only where a loss
reads them and a soft cross-entropy over chunks of `--chunk` rows ("after+ckpt" adds activation
checkpointing of the head's layers; "after+flex" runs the causal part on compiled FlexAttention,
train.ttt_attention=flex, the GPU-only path "after"'s default is measured against: CUDA only).

Shapes: the EAGLE-3 recipe's (configs/eagle3-smollm2-135m.yaml): the embedded SmolLM2-135M target's
hidden size 576, 9 query heads / 3 kv heads of 64, intermediate 1536, vocabulary 49152, 3 aux layers,
draft vocabulary 8192; batch 4 x 512 tokens, every row full (the recipe clips rows at 512). A random head
and random target parts (embedding, final norm, LM head, whose draft-vocabulary rows get a +3 bias so
~90% of argmaxes are draft tokens, as the recipe's frequency-chosen vocabulary covers most supervised
tokens); the first quarter of each row is an unsupervised prompt. `--shape llama-8b`: Llama-3.1-8B's
(4096, 32 / 8 heads of 128, intermediate 14336, vocabulary 128256, draft vocabulary 32000), for a GPU;
there the head trains in fp32 under bf16 autocast, as the trainer runs it.

Per configuration (path x K):
- tokens/s: B*T over the step's wall time; a warm-up step first, then `--repeats` interleaved rounds (the
  configurations in a rotated order each round), the median. "x before": the median over rounds of
  before's time / this path's time at the same K, within a round (robust to a load that drifts).
- peak MB: the peak of torch.profiler's memory timeline (profile_memory=True) over one step, every live
  CPU tensor the profiler sees (parameters and inputs included); on CUDA torch.cuda.max_memory_allocated.
- attention MB: the distinct bytes the attention keeps for backward over the K steps (a
  saved_tensors_hooks count around the attention call: concatenated keys, the mask, q/k/v, outputs and
  log-sum-exps), the figure issue 21 asks about at K = 7 over K = 1 (not for after+ckpt, whose layers
  keep only their inputs and recompute the rest in backward).
Prints a Markdown table and the load average before and after (other jobs distort the times).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from draftsmith.runtime.heads import eagle3 as eagle3_module
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.train.objectives import eagle3_objective
from draftsmith.train.objectives.eagle3_objective import TTTBatch, ttt_loss, ttt_loss_ref

SHAPES = {  # hidden, query heads, kv heads, head dim, intermediate, vocabulary, draft vocabulary
    "smollm2-135m": (576, 9, 3, 64, 1536, 49152, 8192),  # the CPU recipe's target
    "llama-8b": (4096, 32, 8, 128, 14336, 128256, 32000),  # Llama-3.1-8B, SpecForge's draft vocabulary
}
AUX = (1, 14, 26)  # three aux layers (their ids only name the head's fc input width)


class TargetParts(nn.Module):
    """Random stand-ins for the target's embedding, final norm and LM head (what a TTT step reads)."""

    def __init__(self, shape: str):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        super().__init__()
        hidden, *_, vocab, draft_vocab = SHAPES[shape]
        self.embedding = nn.Embedding(vocab, hidden)
        self.norm = LlamaRMSNorm(hidden, 1e-5)
        self.lm_head = nn.Linear(hidden, vocab)
        with torch.no_grad():
            self.lm_head.bias.zero_()
            self.lm_head.bias[:draft_vocab] = 3.0  # the draft vocabulary holds most argmaxes
        self.requires_grad_(False)

    def embed(self, ids):
        return self.embedding(ids)

    def logits(self, hidden):  # [..., H] -> [..., V] float32, as Target.logits
        return self.lm_head(self.norm(hidden)).float()


def make_head(shape: str) -> Eagle3Head:
    hidden, heads, kv_heads, head_dim, intermediate, vocab, draft_vocab = SHAPES[shape]
    layer = {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 16384,
        "hidden_act": "silu",
    }
    return Eagle3Head(Eagle3Config("bench", vocab, draft_vocab, hidden, list(AUX), "", layer))


def make_batch(shape: str, batch: int, length: int, device) -> TTTBatch:
    hidden, vocab = SHAPES[shape][0], SHAPES[shape][5]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    features = torch.randn(batch, length, len(AUX) * hidden, generator=g)
    last = torch.randn(batch, length, hidden, generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, : length // 4] = 0  # a prompt
    valid = torch.ones(batch, length, dtype=torch.bool)
    return TTTBatch(*(t.to(device) for t in (ids, features, last, mask, valid)))


def step_fn(path: str, head, target, batch, steps: int, chunk: int):
    """One TTT step, forward + backward -> the loss (the head's gradients are zeroed first)."""
    cuda = batch.input_ids.device.type == "cuda"

    def run():
        head.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16, enabled=cuda):
            if path == "before":
                out = ttt_loss_ref(head, target.embed, batch, steps, target_logits=target.logits)
            else:
                out = ttt_loss(
                    head, target.embed, batch, steps, target_logits=target.logits, logit_chunk=chunk,
                    checkpoint_layers=path == "after+ckpt",
                    attention="flex" if path == "after+flex" else "decomposed",
                )  # fmt: skip
        out.loss.backward()
        if cuda:
            torch.cuda.synchronize()
        return out

    return run


@contextmanager
def attention_saved_bytes(counter: dict):
    """Count the distinct storages the attention calls save for backward (both paths' attention)."""
    seen: set[int] = set()

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            counter["bytes"] += storage.nbytes()
        return t

    def hooked(fn):
        def call(*args, **kwargs):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                return fn(*args, **kwargs)

        return call

    sdpa, decomposed = eagle3_module.F.scaled_dot_product_attention, eagle3_objective.ttt_attention
    eagle3_module.F.scaled_dot_product_attention = hooked(sdpa)
    eagle3_objective.ttt_attention = hooked(decomposed)
    try:
        yield
    finally:
        eagle3_module.F.scaled_dot_product_attention = sdpa
        eagle3_objective.ttt_attention = decomposed


def attention_mb(run) -> float:
    counter = {"bytes": 0}
    with attention_saved_bytes(counter):
        run()
    return counter["bytes"] / 2**20


def peak_mb(run, device: torch.device) -> float:
    """The peak of torch.profiler's CPU memory timeline over one call of run (CUDA: the allocator's)."""
    from torch.profiler import ProfilerActivity, profile

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        run()
        return torch.cuda.max_memory_allocated() / 2**20
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    activities = [ProfilerActivity.CPU]
    with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        run()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return max(sum(row) for row in sizes) / 2**20


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", default="1,7", help="comma-separated K values")
    parser.add_argument("--paths", default="before,after,after+ckpt")
    parser.add_argument("--chunk", type=int, default=1024, help="train.logit_chunk")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device(args.device)
    head, target = make_head(args.shape).to(device), TargetParts(args.shape).to(device)
    if device.type == "cuda":
        target.to(torch.bfloat16)  # the frozen target in bf16, the head fp32 under autocast (the trainer's)
    batch = make_batch(args.shape, args.batch, args.length, device)
    configs = [(p, int(k)) for k in args.steps.split(",") for p in args.paths.split(",")]
    runs = {c: step_fn(c[0], head, target, batch, c[1], args.chunk) for c in configs}
    load_before = os.getloadavg()
    results = {c: {"loss": float(runs[c]().loss.detach())} for c in configs}  # warm-up; the losses agree
    times = {c: [] for c in configs}
    for r in range(args.repeats):
        for c in configs[r % len(configs) :] + configs[: r % len(configs)]:  # rotated each round
            start = time.perf_counter()
            runs[c]()
            times[c].append(time.perf_counter() - start)
    tokens = args.batch * args.length
    for c in configs:
        results[c]["tokens_per_s"] = tokens / statistics.median(times[c])
        results[c]["seconds"] = times[c]
        if ("before", c[1]) in times:  # per round (the runs seconds apart, under the same load), median
            pairs = zip(times["before", c[1]], times[c])
            results[c]["speedup"] = statistics.median(before / t for before, t in pairs)
        # with checkpointing the attention saves nothing in forward (recomputed in backward): not counted
        results[c]["attention_mb"] = None if c[0] == "after+ckpt" else attention_mb(runs[c])
        results[c]["peak_mb"] = peak_mb(runs[c], device)
    load_after = os.getloadavg()
    report = {
        "machine": torch.cuda.get_device_name() if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "shape": {"name": args.shape, "batch": args.batch, "length": args.length, "chunk": args.chunk},
        "load_average": {"before": load_before, "after": load_after},
        "rows": [{"path": p, "K": k, **results[p, k]} for p, k in configs],
    }
    print_table(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def print_table(report: dict) -> None:
    shape = report["shape"]
    print(f"TTT step, {shape['name']} B={shape['batch']} T={shape['length']}, {report['machine']}")
    print(f"{report['threads']} threads, torch {report['torch']}")
    print(f"load average before {report['load_average']['before']}, after {report['load_average']['after']}")
    print("| path | K | tokens/s | x before | peak MB | attention MB | loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in report["rows"]:
        attention = "-" if r["attention_mb"] is None else f"{r['attention_mb']:.1f}"
        print(
            f"| {r['path']} | {r['K']} | {r['tokens_per_s']:.0f} | {r.get('speedup', float('nan')):.2f} | "
            f"{r['peak_mb']:.0f} | {attention} | "
            f"{r['loss']:.6f} |"
        )


if __name__ == "__main__":
    main()
