"""One host synchronization per speculative cycle (issue 41): every drafter kind hands the engine a
DraftBatch on the device, verification builds its ids, positions and tree mask there, and the cycle's
only transfer is `batch_accept.fetch` (accepted paths, their tokens, depths, the drafter's columns).
Counted with tests/host_syncs.py over whole batched generations (ragged acceptance, rows finishing at
different cycles, greedy and sampled); the prefill's first token is the one extra transfer per batch.
The control: the per-row host rebuild the engine did before (`to_drafts` each cycle) is counted."""

import pytest
import torch
from dflash_heads import random_head as random_dflash
from host_syncs import host_syncs
from medusa_heads import random_heads as random_medusa
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core import speculative
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.dflash_drafter import dflash_drafter
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.drafters.lm_drafter import lm_drafter
from draftsmith.runtime.drafters.medusa_drafter import medusa_drafter
from draftsmith.runtime.drafters.mtp_drafter import mtp_drafter
from draftsmith.runtime.drafters.ngram import NgramDrafter
from draftsmith.runtime.drafters.suffix import SuffixDrafter
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec

PROMPTS = random_prompts(3, seed=4)
PARAMS = {"greedy": SamplingParams(), "sampled": SamplingParams(temperature=1.0)}


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")


def drafters(target):
    torch.manual_seed(0)
    eagle = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval()
    mtp = MtpHead(MtpConfig.for_target(target, num_modules=2)).eval()
    return {
        "ngram chain": lambda: NgramDrafter(parse_tree_spec("chain:3")),
        "suffix dynamic": lambda: SuffixDrafter(parse_tree_spec("dynamic:depth=3,topk=2,tokens=5")),
        "self static tree": lambda: lm_drafter(target, parse_tree_spec("static:binary-3"), num_layers=1),
        "eagle3 chain": lambda: eagle3_drafter(eagle, target, parse_tree_spec("chain:3")),
        "eagle3 dynamic": lambda: eagle3_drafter(
            eagle, target, parse_tree_spec("dynamic:depth=3,topk=2,tokens=5")
        ),
        "mtp chain": lambda: mtp_drafter(mtp, target, parse_tree_spec("chain:2")),
        "medusa tree": lambda: medusa_drafter(target, random_medusa(target, heads=3), "cartesian:2,2,1"),
        "dflash chain": lambda: dflash_drafter(target, random_dflash(target), "chain:3"),
    }


@pytest.mark.parametrize("params", list(PARAMS), ids=list(PARAMS))
def test_one_host_sync_per_cycle(target, params):
    for name, make in drafters(target).items():
        drafter = make()
        with host_syncs() as syncs:
            results = generate_speculative(target, drafter, PROMPTS, PARAMS[params], 16, batch_size=3)
        cycles = max(len(r.accepted_lengths) for r in results)
        assert cycles > 1, name
        assert sum(syncs.values()) == cycles + 1, (name, dict(syncs), cycles)  # + the first token


def test_host_rebuilt_drafts_are_counted(target, monkeypatch):
    """The control: a drafter whose batch is read back to the host and rebuilt each cycle (the engine's
    old round trip) costs a transfer more per cycle, and the count sees it."""
    real = speculative.propose

    def round_trip(drafter, contexts, depth, device):
        batch = real(drafter, contexts, depth, device)
        return type(batch).from_drafts(batch.to_drafts(), device)

    monkeypatch.setattr(speculative, "propose", round_trip)
    drafter = eagle3_drafter(
        Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2])).eval(),
        target,
        parse_tree_spec("chain:3"),
    )
    with host_syncs() as syncs:
        results = generate_speculative(target, drafter, PROMPTS, SamplingParams(), 16, batch_size=3)
    cycles = max(len(r.accepted_lengths) for r in results)
    assert sum(syncs.values()) == 2 * cycles + 1
