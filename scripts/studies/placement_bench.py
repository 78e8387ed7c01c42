"""Per-rank memory and forward time of the frozen target's placements (docs/scale.md).

    OMP_NUM_THREADS=1 python scripts/studies/placement_bench.py replicate                      # one process
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/studies/placement_bench.py replicate
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/studies/placement_bench.py tp
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/studies/placement_bench.py fsdp    # the alternative
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/studies/placement_bench.py ep --family qwen3_moe

A random 8-layer Llama (H 512, MLP 1536, 8/4 heads, V 8192, fp32; saved once under --dir) runs
`Target.forward` over 4 rows of 256 tokens per rank (a capture of aux layers 1, 3, 6), best of 5. `tp`
is runtime/core/placement.py (the rows of a TP group are one set); `fsdp` is FSDP2's `fully_shard` over each
layer, the embedding, the final norm and the LM head (every rank its own rows). Each rank prints its
parameter bytes, its host peak RSS over the start, and the forward time.

`--family qwen3_moe` runs a random 8-layer Qwen3-MoE instead (H 512, 16 experts of width 512, top-2, 8/2
heads, V 8192, fp32, --dir default /tmp/draftsmith-placement-bench-moe): `tp` splits its attention over the
ranks and its experts E/n a rank (runtime/core/placement_moe.py), `ep` splits only the experts and keeps the
attention whole on every rank (what `target_placement: ep` does where the heads cannot split: MLA, or
Qwen3-235B-A22B's 4 KV heads over 8 ranks).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


def rss_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_target(folder: Path, family: str) -> None:
    from tiny_models import tiny_tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3MoeConfig

    torch.manual_seed(0)
    common = dict(
        vocab_size=8192, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, eos_token_id=2,
        max_position_embeddings=1024, tie_word_embeddings=False, pad_token_id=1, bos_token_id=3,
    )  # fmt: skip
    if family == "qwen3_moe":
        config = Qwen3MoeConfig(
            **common, num_key_value_heads=2, head_dim=64, intermediate_size=1536, moe_intermediate_size=512,
            num_experts=16, num_experts_per_tok=2, norm_topk_prob=True,
        )  # fmt: skip
    else:
        config = LlamaConfig(**common, intermediate_size=1536, num_key_value_heads=4)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, max_shard_size="50MB")
    tiny_tokenizer().save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("placement", choices=["replicate", "tp", "ep", "fsdp"])
    parser.add_argument("--family", choices=["llama", "qwen3_moe"], default="llama")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    moe = args.family == "qwen3_moe"
    args.dir = args.dir or "/tmp/draftsmith-placement-bench" + ("-moe" if moe else "")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo")
    folder = Path(args.dir)
    if rank == 0 and not (folder / "config.json").is_file():
        make_target(folder, args.family)
    if world > 1:
        dist.barrier()

    import transformers.models.llama.modeling_llama  # noqa: F401  (imports outside the measured memory)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    from draftsmith.data_recipes.capture import capture_batch
    from draftsmith.runtime.core.placement import Layout, resident_bytes
    from draftsmith.runtime.core.target import Target

    start = rss_mb("VmRSS")
    split = {"tp": dict(experts=moe, dense=True), "ep": dict(experts=True, dense=False)}.get(args.placement)
    layout = Layout(world, world, rank, **split) if split and world > 1 else None
    target = Target.load(str(folder), device="cpu", dtype="float32", layout=layout)
    if args.placement == "fsdp":
        from torch.distributed.fsdp import fully_shard

        d = target.decoder
        for module in [*d.layers, d.embed_tokens, d.norm, target.model.lm_head]:
            fully_shard(module, reshard_after_forward=True)
    held = resident_bytes(target.model)
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(6, 100, (1, 256), generator=gen) for _ in range(4)]
    times = []
    for _ in range(5):
        began = time.perf_counter()
        for row in rows:
            capture_batch(target, row, (1, 3, 6))
        times.append(time.perf_counter() - began)
    print(
        f"{args.family} {args.placement} rank {rank}/{world}: weights {held / 2**20:.1f} MB, host peak RSS "
        f"over the start {rss_mb('VmHWM') - start:.0f} MB, 4 rows x 256 tokens {min(times):.3f} s",
        flush=True,
    )
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
