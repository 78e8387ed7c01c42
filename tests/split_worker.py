"""The runtime on a split target, run under torchrun by tests/runtime/test_split_runtime.py.

    torchrun --nproc-per-node 2 tests/split_worker.py TARGET_DIR tp 2 greedy OUT.json
    torchrun --nproc-per-node 2 tests/split_worker.py TARGET_DIR ep 2 laws OUT.json

Rank 0 drives the group (runtime/core/split_run.py) and writes OUT.json; the other ranks follow.
- `greedy`: plain greedy decoding and every drafter kind (ngram, suffix, model, self, eagle3 chain, static
  and dynamic trees, mtp, medusa, peagle, dflash, SSD, the drafter process, load-aware auto:K) at batch 2,
  the tokens of each and the collectives counted per cycle; the test holds them against one process.
- `follower dies`: rank 1 exits mid-decode; rank 0 writes the error it ended with.
- `laws`: sampled speculation's first tokens against the split target's exact law (chi-square) for a
  chain, a static tree and a dynamic tree, and the negative control (a drafter that reports a wrong q),
  which must fail.
Heads are random (seeded): what is checked is the engine on a split target, not a head's quality.
"""

import contextlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from dflash_heads import random_head as random_dflash  # noqa: E402
from engine_checks import chi_square, exact_law  # noqa: E402
from medusa_heads import random_heads as random_medusa  # noqa: E402
from peagle_heads import random_head as random_peagle  # noqa: E402
from tiny_models import random_prompts, tiny_model, tiny_tokenizer  # noqa: E402

from draftsmith.runtime.core import placement  # noqa: E402
from draftsmith.runtime.core.collectives import CollectiveCounter, per_cycle  # noqa: E402
from draftsmith.runtime.core.engine import generate_plain  # noqa: E402
from draftsmith.runtime.core.speculative import generate_speculative  # noqa: E402
from draftsmith.runtime.core.split_run import Split, run_split  # noqa: E402
from draftsmith.runtime.core.target import Target  # noqa: E402
from draftsmith.runtime.drafters.dflash_drafter import dflash_drafter  # noqa: E402
from draftsmith.runtime.drafters.draft_process import DraftConfig, RemoteDrafter  # noqa: E402
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter  # noqa: E402
from draftsmith.runtime.drafters.lm_drafter import lm_drafter  # noqa: E402
from draftsmith.runtime.drafters.medusa_drafter import medusa_drafter  # noqa: E402
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter  # noqa: E402
from draftsmith.runtime.drafters.ngram import NgramDrafter  # noqa: E402
from draftsmith.runtime.drafters.peagle_drafter import peagle_drafter  # noqa: E402
from draftsmith.runtime.drafters.ssd import SsdDrafter, clone_factory  # noqa: E402
from draftsmith.runtime.drafters.suffix import SuffixDrafter  # noqa: E402
from draftsmith.runtime.errors import DraftsmithError  # noqa: E402
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head  # noqa: E402
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead  # noqa: E402
from draftsmith.runtime.verify import batch_accept  # noqa: E402
from draftsmith.runtime.verify.load_aware import LoadAwareDepth, measure_verify_costs  # noqa: E402
from draftsmith.runtime.verify.sampling import SamplingParams  # noqa: E402
from draftsmith.runtime.verify.tree import parse_tree_spec as tree  # noqa: E402

PROMPTS = random_prompts(4, seed=4)
NEW_TOKENS = 16
LAW_PARAMS, LAW_PROMPT, LAW_ROWS = SamplingParams(temperature=1.0, top_k=3), [11, 12, 13, 11, 12], 2000


def drafters(target: Target, folder: str) -> dict:
    torch.manual_seed(0)
    eagle = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval()
    mtp = MtpHead(MtpConfig.for_target(target, num_modules=2)).eval()
    draft_lm = Target(tiny_model("llama", seed=1), tiny_tokenizer(), "draft")
    dynamic = "dynamic:depth=3,topk=2,tokens=5"
    return {
        "ngram chain": lambda: NgramDrafter(tree("chain:3")),
        "suffix dynamic": lambda: SuffixDrafter(tree(dynamic)),
        "model chain": lambda: lm_drafter(draft_lm, tree("chain:3"), target=target),
        "self static tree (split drafter)": lambda: lm_drafter(target, tree("static:binary-3"), num_layers=1),
        "eagle3 chain": lambda: eagle3_drafter(eagle, target, tree("chain:3")),
        "eagle3 static tree": lambda: eagle3_drafter(eagle, target, tree("static:binary-3")),
        "eagle3 dynamic": lambda: eagle3_drafter(eagle, target, tree(dynamic)),
        "mtp chain": lambda: mtp_drafter(mtp, target, tree("chain:2")),
        "medusa tree": lambda: medusa_drafter(target, random_medusa(target, heads=3), "cartesian:2,2,1"),
        "peagle chain": lambda: peagle_drafter(random_peagle(target), target, tree("chain:3")),
        "dflash chain": lambda: dflash_drafter(target, random_dflash(target), "chain:3"),
        "ssd over model": lambda: SsdDrafter(
            clone_factory(lm_drafter(draft_lm, tree("chain:3"), target=target)), 3, 4
        ),
        "drafter process (ngram)": lambda: RemoteDrafter(DraftConfig(folder, "ngram", 3)),
    }


def static_drafters(target: Target) -> dict:
    torch.manual_seed(0)
    eagle = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval()
    draft_lm = Target(tiny_model("llama", seed=1), tiny_tokenizer(), "draft")
    return {
        "model chain static": lambda: lm_drafter(draft_lm, tree("chain:3"), target=target),
        "eagle3 dynamic static": lambda: eagle3_drafter(
            eagle, target, tree("dynamic:depth=3,topk=2,tokens=5")
        ),
        "mtp chain static": lambda: mtp_drafter(
            MtpHead(MtpConfig.for_target(target, num_modules=2)).eval(), target, tree("chain:2")
        ),  # fmt: skip
    }


def counted(run) -> tuple[list, dict]:
    counter = CollectiveCounter()
    with counter:
        results = run(counter)
    report = counter.report()
    return results, {**per_cycle(report), "report": report}


def greedy(target: Target, folder: str) -> dict:
    out = {}
    greedy = SamplingParams()
    plain, coll = counted(
        lambda c: generate_plain(target, PROMPTS, greedy, NEW_TOKENS, batch_size=2, collectives=c)
    )
    out["plain"] = {"tokens": [r.token_ids for r in plain], "collectives": coll}
    for name, make in drafters(target, folder).items():
        drafter = make()
        results, coll = counted(
            lambda c, d=drafter: generate_speculative(
                target, d, PROMPTS, SamplingParams(), NEW_TOKENS, batch_size=2, collectives=c
            )
        )
        if hasattr(drafter, "close"):
            drafter.close()
        cycles = sum(len(r.accepted_lengths) for r in results)
        accepted = sum(sum(r.accepted_lengths) for r in results)
        out[name] = {
            "tokens": [r.token_ids for r in results],
            "collectives": coll,
            "tau": 1 + accepted / cycles,
        }
    try:  # SSD copies its drafter's caches: a split drafter's cannot be (placement.uncopyable)
        ssd = SsdDrafter(clone_factory(lm_drafter(target, tree("chain:3"), num_layers=1)), 3, 4)
        generate_speculative(target, ssd, PROMPTS[:2], greedy, NEW_TOKENS)
        out["ssd over self"] = {"error": None}
    except DraftsmithError as err:
        out["ssd over self"] = {"error": str(err)}
    for name, make in static_drafters(target).items():  # the static path: graphs on CUDA, eager here
        results = generate_speculative(target, make(), PROMPTS, greedy, NEW_TOKENS, batch_size=2, static=True)
        out[name] = {"tokens": [r.token_ids for r in results]}
    results = generate_plain(target, PROMPTS, greedy, NEW_TOKENS, batch_size=2, static=True)
    out["plain static"] = {"tokens": [r.token_ids for r in results]}
    try:  # self:layers=N's graphed steps would run the split layers outside the relayed calls
        self_drafter = lm_drafter(target, tree("chain:3"), num_layers=1)
        generate_speculative(target, self_drafter, PROMPTS[:2], greedy, 4, static=True)
        out["self static path"] = {"error": None}
    except DraftsmithError as err:
        out["self static path"] = {"error": str(err)}
    costs = measure_verify_costs(target, [2], max_nodes=4)
    policy = LoadAwareDepth(costs, 3)
    ngram = NgramDrafter(tree("chain:3"))
    results = generate_speculative(target, ngram, PROMPTS, greedy, NEW_TOKENS, batch_size=2, policy=policy)
    out["ngram auto:3"] = {"tokens": [r.token_ids for r in results]}
    return out


def law_check(target: Target, drafter, law: dict) -> dict:
    """The chi-square of the first 3 tokens of LAW_ROWS sampled rows against `law`, and the drafts' tau."""
    prompts = [LAW_PROMPT] * LAW_ROWS
    results = generate_speculative(target, drafter, prompts, LAW_PARAMS, 3, seed=0, batch_size=LAW_ROWS)
    stat, threshold = chi_square(Counter(tuple(r.token_ids[:3]) for r in results), law, LAW_ROWS)
    cycles = sum(len(r.accepted_lengths) for r in results)
    return {
        "stat": stat,
        "threshold": threshold,
        "tau": 1 + sum(sum(r.accepted_lengths) for r in results) / cycles,
    }


def laws(target: Target, folder: str) -> dict:
    law = exact_law(target, LAW_PROMPT, LAW_PARAMS, 3)
    torch.manual_seed(0)
    eagle = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval()
    draft_lm = Target(tiny_model("llama", seed=1), tiny_tokenizer(), "draft")  # another law than the target's
    cases = {  # the oracle (all the target's layers) has its drafts accepted: the accepting paths' law
        "oracle chain (split)": lambda: lm_drafter(target, tree("chain:3")),
        "oracle static tree": lambda: lm_drafter(target, tree("static:binary-3")),
        "oracle dynamic tree": lambda: lm_drafter(target, tree("dynamic:depth=3,topk=2,tokens=5")),
        "self chain": lambda: lm_drafter(target, tree("chain:3"), num_layers=1),
        "eagle3 static tree": lambda: eagle3_drafter(eagle, target, tree("static:binary-3")),
        "eagle3 dynamic": lambda: eagle3_drafter(eagle, target, tree("dynamic:depth=3,topk=2,tokens=5")),
        "model chain": lambda: lm_drafter(draft_lm, tree("chain:3"), target=target),
    }
    out = {name: law_check(target, make(), law) for name, make in cases.items()}
    with always_accept():  # the negative control: the law test must see it
        out["control: always accept (must fail)"] = law_check(target, cases["self chain"](), law)
    return out


@contextlib.contextmanager
def always_accept():
    """Coins of -1: u * q < p holds for every drafted token, even where p = 0 (tests/runtime/
    test_speculative.py's control, here on the split target)."""
    real = batch_accept.uniforms

    def accept_all(*args):
        coins, draws = real(*args)
        return torch.full_like(coins, -1.0), draws

    batch_accept.uniforms = accept_all
    try:
        yield
    finally:
        batch_accept.uniforms = real


def follower_dies(target: Target, folder: str) -> dict:
    """Rank 0 decodes while rank 1 exits at its 5th replayed call (main patches it): rank 0 must end with
    an error that says so, well inside the timeout, not hang."""
    start = time.perf_counter()
    try:
        generate_plain(target, PROMPTS, SamplingParams(), 64, batch_size=2)
    except DraftsmithError as err:
        return {"error": str(err), "seconds": time.perf_counter() - start}
    return {"error": None, "seconds": time.perf_counter() - start}


def die_at(calls: int) -> None:
    """This follower exits (code 3) when it is asked to replay its `calls`-th call."""
    real, seen = placement.replay, [0]

    def replay(*args):
        seen[0] += 1
        if seen[0] == calls:
            os._exit(3)
        return real(*args)

    placement.replay = replay


def main(folder: str, placement_kind: str, size: int, what: str, out: str) -> None:
    sizes = {"tp_size": size} if placement_kind == "tp" else {"ep_size": size}
    split = Split(placement_kind, **sizes, timeout_s=120)
    work = {"greedy": greedy, "laws": laws, "follower dies": follower_dies}[what]
    if what == "follower dies" and os.environ.get("RANK") == "1":
        die_at(5)
    try:
        result = run_split(split, "generate", folder, "cpu", "float32", lambda target: work(target, folder))
    except DraftsmithError as err:  # rank 0's wait on the dead follower ends here
        result = {"error": str(err)}
    if result is not None and os.environ.get("RANK", "0") == "0":
        Path(out).write_text(json.dumps(result))
    sys.stdout.flush()  # gloo may abort in a subgroup's destructor at exit (runtime/cli/main.py exit_with)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
