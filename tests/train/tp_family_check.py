"""One rank of tests/train/test_tp_families.py and test_ep_placement.py: a MoE or Gemma target split over 2
gloo ranks (runtime/core/placement.py, `tp` or `ep`) against the same checkpoint whole in this process, both
through draftsmith's forward in fp32.

    torchrun --nproc_per_node 2 tests/train/tp_family_check.py TARGET OUT ok|no-all-reduce BOUND_SUMS tp|ep

Each rank writes OUT_DIR/rank-R.json: the largest logit differences of a prefill (and its captured layer
0), two KV-cached steps and a tree-verification forward, each in units of the fp32 bound of BOUND_SUMS
roundings (the test's rule) at the whole target's scale; the decoder layers' bytes this rank holds
against what the plan leaves it (1/2 of each split tensor) and against train/preflight/families.py's
share; whether the last layer's layer_state (what an MTP block copies) and the weights hash are the
whole one's; and on rank 0, whether greedy speculative decoding with n-gram drafts (a chain, then a
dynamic tree) over the split target, rank 0 driving and rank 1 following, emits the whole target's plain
greedy tokens.
`no-all-reduce` is the negative control: transformers' `all_reduce` expert-parallel implementation replaced
by one that skips the sum, so each rank keeps its own experts' part of the MoE output.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from engine_checks import make_prompts

from draftsmith.runtime.core import placement, placement_moe
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.placement import Layout, driving, follow, local, resident_bytes
from draftsmith.runtime.core.placement_moe import split_param
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import Tree, ancestor_mask, parse_tree_spec, position_ids

TREE = Tree((-1, 0, 1, 1, 2, 3, 4, 5, 6))  # a root and 8 nodes, paths 5 deep (past Gemma's window of 5)
NEW_TOKENS = 24


def miss(got: torch.Tensor, want: torch.Tensor, sums: int) -> float:
    """max |got - want| in units of `sums` fp32 roundings at want's scale (tests/tolerances.py's rule)."""
    bound = sums * torch.finfo(torch.float32).eps * max(1.0, float(want.abs().max()))
    return float((got - want).abs().max()) / bound


@torch.inference_mode()
def forwards(target: Target, ids: torch.Tensor, nodes: torch.Tensor) -> list[torch.Tensor]:
    """Logits [1, T, V] of a prefill of 9, a one-token step, a 3-token step, and TREE's nodes verified in
    one forward after them (positions 13.., the tree mask over its ancestors); layer 0's captured output."""
    cache, out = target.new_cache(1, 4), []  # capacity 4: the prefill grows it
    first = target.forward(ids[:, :9], cache, capture_layers=(0,))
    out += [target.logits(first.hidden), first.aux[0]]
    for lo, hi in ((9, 10), (10, 13)):
        out.append(target.logits(target.forward(ids[:, lo:hi], cache).hidden))
    tree = target.forward(
        nodes, cache, position_ids(TREE, prefix_len=13)[None], tree_mask=ancestor_mask(TREE)
    )
    return [*out, target.logits(tree.hidden)]


def layer_bytes(target: Target) -> int:
    return sum(local(p).numel() * local(p).element_size() for p in target.decoder.layers.parameters())


def planned_layer_bytes(whole: Target, layout: Layout) -> int:
    """What the plan leaves a rank of the whole target's layers: 1/tp of each split tensor, the rest whole."""
    plan, tp = placement.split_plan(whole.model.config, layout), layout.tp
    total = 0
    for name, p in whole.decoder.layers.named_parameters():
        numel = p.numel() // tp if split_param(f"layers.{name}", plan) else p.numel()
        total += numel * p.element_size()
    return total


def states_equal(target: Target, whole: Target, index: int) -> bool:
    """The split target's layer_state (read whole from the checkpoint, experts fused) is the whole one's."""
    got, want = target.layer_state(index), whole.layer_state(index)
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def preflight_bytes(folder: str, whole: Target, layout: Layout) -> float:
    """train/preflight/families.py's weights per rank for this target (a meta-device model of its config)."""
    from draftsmith.train.preflight.families import TargetArch, meta_model

    config = whole.model.config
    arch = TargetArch.of(meta_model(config, folder, torch.float32), config)
    return arch.weights_per_rank(resident_bytes(whole.model), layout.tp, dense=layout.dense)


def skip_the_experts_sum() -> None:
    """The negative control: an EP implementation that runs this rank's experts and never sums the ranks'
    partial outputs (transformers' AllReduceEP without its all-reduce)."""
    from transformers.distributed.expert_parallel import AllReduceEP, EPImplementationInterface

    class LocalExpertsOnly(AllReduceEP):
        def __call__(self, hidden_states, top_k_index, top_k_weights):
            off_rank = (top_k_index // self.num_local_experts) != self.ep_mesh.get_local_rank()
            index = torch.where(off_rank, self.num_local_experts, top_k_index % self.num_local_experts)
            return self.experts_forward(hidden_states, index, top_k_weights.masked_fill(off_rank, 0.0))

    EPImplementationInterface.register("local-experts-only", LocalExpertsOnly)
    placement_moe.EP_IMPLEMENTATION = "local-experts-only"


def main(folder: str, out: str, mode: str, sums: int, where: str) -> None:
    from transformers import AutoConfig

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "no-all-reduce":
        skip_the_experts_sum()
    layout = placement.check_placement(AutoConfig.from_pretrained(folder), where, None, world, rank)
    target = Target.load(folder, device="cpu", dtype="float32", layout=layout)
    whole = Target.load(folder, device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(0)  # the same ids on every rank
    ids, nodes = (
        torch.randint(6, 100, (1, 13), generator=g),
        torch.randint(6, 100, (1, TREE.size), generator=g),
    )
    got, want = forwards(target, ids, nodes), forwards(whole, ids, nodes)
    result = {
        "rank": rank,
        "misses": [miss(a, b, sums) for a, b in zip(got, want)],  # prefill, layer 0, step 1, step 3, tree
        "local_kv_heads": target.new_cache(1, 1).keys[0].shape[1],
        "layer_bytes": layer_bytes(target),
        "planned_layer_bytes": planned_layer_bytes(whole, layout),
        "whole_layer_bytes": layer_bytes(whole),
        "resident_bytes": resident_bytes(target.model),
        "preflight_bytes": preflight_bytes(folder, whole, layout),
        "share": placement.placement_shard_fraction(whole.model.config, world, where),
        "whole_bytes": resident_bytes(whole.model),
        "layer_state_equal": states_equal(target, whole, whole.num_layers - 1),
        "weights_hash_equal": target.weights_hash() == whole.weights_hash(),  # read from the checkpoint
    }
    if mode == "ok":
        prompts = make_prompts(4)  # each repeats a 4-gram: the n-gram drafter finds matches
        greedy, spec = SamplingParams(), []
        if rank == 0:
            with driving(target):  # a chain, then a dynamic tree (compacts and crops the cache)
                for tree in ("chain:3", "dynamic:depth=3,topk=2,tokens=6"):
                    drafter = NgramDrafter(parse_tree_spec(tree))
                    spec += generate_speculative(target, drafter, prompts, greedy, NEW_TOKENS, batch_size=2)
            plain = generate_plain(whole, prompts, greedy, max_new_tokens=NEW_TOKENS) * 2
            result["identical"] = [a.token_ids == b.token_ids for a, b in zip(spec, plain)]
            result["accepted"] = sum(sum(r.accepted_lengths) for r in spec)
        else:
            follow(target)
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "tp")
    # The results are on disk and the group destroyed: skip the interpreter's teardown, where a gloo thread
    # still being joined aborted a rank now and then ("terminate called without an active exception",
    # gemma2 on 2026-12-06) and failed a run whose checks had all passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
