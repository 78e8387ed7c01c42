"""One rank of tests/train/test_target_placement.py's tensor-parallel check (run by torchrun, gloo).

    torchrun --nproc_per_node 2 tests/train/tp_check.py TARGET_DIR OUT_DIR TP

Each rank loads its shard of TARGET_DIR (runtime/core/placement.py) and the whole target beside it, and writes
OUT_DIR/rank-R.json: its resident parameter bytes, and the largest differences from the whole target of
a capture, of a KV-cached continuation (a prefill that grows the cache, then two decode steps) and of a
capture the group's rank 0 drives while the others follow; the MTP identity and a layer's state.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from draftsmith.data_recipes.capture import capture_batch
from draftsmith.runtime.core.placement import Layout, driving, follow, resident_bytes
from draftsmith.runtime.core.target import Target


def largest(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def main(folder: str, out: str, tp: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    target = Target.load(folder, device="cpu", dtype="float32", layout=Layout(tp, world, rank))
    whole = Target.load(folder, device="cpu", dtype="float32")
    ids = torch.randint(6, 100, (1, 13), generator=torch.Generator().manual_seed(rank // tp))  # per group
    layers = (0, 1, 2)
    got, want = capture_batch(target, ids, layers), capture_batch(whole, ids, layers)
    cache, whole_cache = target.new_cache(1, 4), whole.new_cache(1, 4)  # capacity 4: the prefill grows it
    steps = []
    for lo, hi in ((0, 9), (9, 10), (10, 13)):
        a = target.forward(ids[:, lo:hi], cache).hidden
        steps.append(largest(a, whole.forward(ids[:, lo:hi], whole_cache).hidden))
    lengths = (5, 9, 13)
    driven = []
    if target.tp_size == 1 or rank % tp == 0:
        with driving(target) if target.tp_size > 1 else torch.no_grad():
            outs = [capture_batch(target, ids[:, :n], layers)["aux_hidden"] for n in lengths]
        driven = [
            largest(o, capture_batch(whole, ids[:, :n], layers)["aux_hidden"]) for o, n in zip(outs, lengths)
        ]
    else:
        follow(target)
    state = {k: torch.equal(v, whole.layer_state(2)[k]) for k, v in target.layer_state(2).items()}
    result = {
        "rank": rank,
        "tp_size": target.tp_size,
        "resident_bytes": resident_bytes(target.model),
        "whole_bytes": resident_bytes(whole.model),
        "local_kv_heads": cache.keys[0].shape[1],
        "capture_aux": largest(got["aux_hidden"], want["aux_hidden"]),
        "capture_last": largest(got["last_hidden"], want["last_hidden"]),
        "scale": float(want["aux_hidden"].abs().max()),
        "cached_steps": steps,
        "driven": driven,
        "weights_hash_equal": target.weights_hash() == whole.weights_hash(),
        "layer_state_equal": all(state.values()) and len(state) == len(whole.layer_state(2)),
    }
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
