"""A projection, not a measurement: Llama-3.3-70B at TP = 4 on H100s with an EAGLE-3 head, the head at
TP = 1 on rank 0 (the design's configuration) against the head split over the target's 4 GPUs, per cycle,
from the collectives the runtime counts (BENCHMARKS.md, "The bundled runtime on a split target").

    python scripts/studies/split_projection.py            # a markdown table, a few seconds

What each cycle issues is what `draftsmith generate --json` counted on gloo (tests/runtime/
test_split_runtime.py holds it): verification, one message from rank 0 (the candidates; two broadcasts:
length and bytes) and 2 all-reduces per target layer (160 for 80 layers); drafting at TP = 1 nothing; a
split drafter, per draft step, 2 all-reduces per draft layer, a gather of its vocabulary-split logits and,
in draftsmith's engine, one message (its forward is driven like the target's). The costs of each piece come
from scripts/studies/ssd_costs.py (bytes over HBM bandwidth, calibrated on a published SGLang 8B
measurement, every constant cited or labelled an assumption) and the acceptance profile from
ssd_projection.py (EAGLE-3 paper Fig. 7: 0.77 per position, chain). All-reduce latency is the one input
that decides the comparison, so it is shown at two published values: vLLM's custom one-shot all-reduce,
10 us, and NCCL, 17 us (H100, TP = 4, bf16 [32, 8192] = 0.5 MB; vllm-project/vllm#24111, measured inside
a CUDA graph). The message's cost, two small broadcasts, is an assumption (2 x ssd_costs' 15 us p2p).
"""

from __future__ import annotations

from dataclasses import replace

from ssd_costs import BF16, H100_SXM, LLAMA_33_70B, Gpu, allreduce_s, step_s
from ssd_projection import CONTEXT, EAGLE3, draft_chain_s

TP = 4
DRAFT_VOCAB = 32000  # yuhuili/EAGLE3-LLaMA3.3-Instruct-70B's draft_vocab_size
ALLREDUCE_US = {"vLLM custom all-reduce (10 us)": 10e-6, "NCCL (17 us)": 17e-6}  # vllm#24111, H100, TP 4


def message_s(gpu: Gpu) -> float:
    """One driven call: broadcast_object_list's two broadcasts (an assumption: 2 x a small p2p message)."""
    return 2 * gpu.p2p_latency_s


def tokens_per_cycle(alpha: float, depth: int) -> float:
    """Expected tokens a chain of `depth` commits: accepted prefix + the target's own token."""
    return (1 - alpha ** (depth + 1)) / (1 - alpha)


def cycle(gpu: Gpu, depth: int, split_drafter: bool) -> dict:
    verify = step_s(LLAMA_33_70B, gpu, TP, depth + 1, CONTEXT) + message_s(gpu)
    if split_drafter:  # each step: the head's layer split (2 all-reduces) + its logits gathered + a message
        gather = allreduce_s(gpu, TP, DRAFT_VOCAB * BF16)
        draft = draft_chain_s(EAGLE3, gpu, depth, tp=TP) + depth * (gather + message_s(gpu))
        collectives = f"{2 * LLAMA_33_70B.layers + 3 * depth} all-reduce/gather + {1 + depth} messages"
    else:
        draft = draft_chain_s(EAGLE3, gpu, depth, tp=1)
        collectives = f"{2 * LLAMA_33_70B.layers} all-reduce + 1 message"
    tokens = tokens_per_cycle(EAGLE3.alpha, depth)
    return {"draft_ms": draft * 1e3, "verify_ms": verify * 1e3, "tokens": tokens, "collectives": collectives,
            "tokens_s": tokens / (draft + verify)}  # fmt: skip


def plain_tokens_s(gpu: Gpu) -> float:
    return 1 / (step_s(LLAMA_33_70B, gpu, TP, 1, CONTEXT) + message_s(gpu))


def table() -> str:
    lines = [
        "| all-reduce | drafter | K | draft ms | verify ms | tokens/cycle | tok/s | vs plain "
        "| collectives/cycle |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, latency in ALLREDUCE_US.items():
        gpu = replace(H100_SXM, allreduce_latency_s=latency)
        plain = plain_tokens_s(gpu)
        lines.append(
            f"| {label} | plain | - | - | - | 1.00 | {plain:.1f} | 1.00 | 160 all-reduce + 1 message |"
        )
        for depth in (3, 5, 7):
            for split in (False, True):
                c = cycle(gpu, depth, split)
                who = "split over TP 4" if split else "TP 1 (rank 0)"
                times = f"{c['draft_ms']:.2f} | {c['verify_ms']:.2f} | {c['tokens']:.2f}"
                rates = f"{c['tokens_s']:.1f} | {c['tokens_s'] / plain:.2f}"
                lines.append(f"| {label} | {who} | {depth} | {times} | {rates} | {c['collectives']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
