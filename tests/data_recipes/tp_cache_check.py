"""One rank of tests/data_recipes/test_tp_steps.py's check that a driven cache's changes reach the followers.

    torchrun --nproc_per_node 2 tests/data_recipes/tp_cache_check.py TARGET_DIR OUT_DIR

Each rank loads its tensor-parallel shard of TARGET_DIR (runtime/core/placement.py) and the whole target. The
group's rank 0 drives (`driving`), the other rank follows: (1) a fixed sequence of forwards with the KV
cache changed between them by `compact`, `keep_prefixes`, `retain` and `crop` (each relayed to the
follower's copy, which must stay in step or the next forward's all-reduce mixes other slots), and (2)
a greedy speculative decode with a self-drafter over a dynamic tree (which compacts, crops and retains on
its own). Rank 0 writes OUT_DIR/result.json: the largest difference of (1) from the whole target's, and
whether (2) emitted the whole target's tokens.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from draftsmith.runtime.core.placement import Layout, driving, follow
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec


@torch.inference_mode()  # as the engine changes its caches
def cache_steps(target: Target, ids: torch.Tensor) -> list[torch.Tensor]:
    """Hidden states [2, T, H] of forwards over a cache changed between them outside forward."""
    cache, hidden = target.new_cache(2, 4), []  # capacity 4: the first forward grows it
    step = lambda lo, hi: hidden.append(target.forward(ids[:, lo:hi], cache).hidden)  # noqa: E731
    step(0, 8)
    keep = torch.tensor([[5, 6, 7], [4, 6, 7]])  # [B, 3] slots kept after slot 4 (a tree path)
    cache.compact(4, keep, torch.tensor([[True, True, True], [True, True, False]]))
    step(8, 10)
    cache.keep_prefixes(cache.length - 2, [2, 1])  # row 1 keeps one of the last two slots
    step(10, 12)
    cache.crop(cache.length - 1)
    step(12, 13)
    cache.retain(torch.tensor([1]))  # row 0 leaves the batch
    hidden.append(target.forward(ids[1:, 13:15], cache).hidden)
    return hidden


def main(folder: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    target = Target.load(folder, device="cpu", dtype="float32", layout=Layout(world, world, rank))
    whole = Target.load(folder, device="cpu", dtype="float32")
    ids = torch.randint(6, 100, (2, 15), generator=torch.Generator().manual_seed(0))
    prompts = [ids[0, :7].tolist(), ids[1, :4].tolist()]
    tree, params = parse_tree_spec("dynamic:depth=3,topk=2,tokens=6"), SamplingParams()
    if rank != 0:
        follow(target)
    else:
        with driving(target):
            got = cache_steps(target, ids)
            drafter = build_drafter("self:layers=1", target, tree)
            spec = generate_speculative(target, drafter, prompts, params, max_new_tokens=12, batch_size=2)
        want = cache_steps(whole, ids)
        drafter = build_drafter("self:layers=1", whole, tree)
        plain = generate_speculative(whole, drafter, prompts, params, max_new_tokens=12, batch_size=2)
        result = {
            "steps": [float((a - b).abs().max()) for a, b in zip(got, want, strict=True)],
            "scale": max(float(b.abs().max()) for b in want),
            "tokens": [r.token_ids for r in spec],
            "want_tokens": [r.token_ids for r in plain],
            "cycles": [len(r.accepted_lengths) for r in spec],
        }
        Path(out, "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo may abort in a subgroup's destructor at interpreter exit (runtime/cli/main.py)
