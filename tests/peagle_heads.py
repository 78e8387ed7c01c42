"""P-EAGLE heads for the tests (tests/runtime/test_peagle*.py, tests/train/test_peagle_objective.py): random
heads (drafts rarely accept) and heads fitted with the P-EAGLE objective itself to the tiny target's greedy
continuations (drafts accept, partly and fully), and the objective's batch from a tiny target."""

import torch

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.heads.peagle import PEagleConfig, PEagleHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.train.objectives.eagle3_data import capture_batch
from draftsmith.train.objectives.eagle3_objective import TTTBatch

AUX = [0, 1, 2]  # every layer of the 3-layer tiny target


def random_head(target, block_size=4, seed=0, **options) -> PEagleHead:
    torch.manual_seed(seed)
    config = PEagleConfig.for_target(target, aux_layer_ids=AUX, block_size=block_size, **options)
    return PEagleHead(config).eval()


def target_batch(target, seqs: list[list[int]]) -> TTTBatch:
    """The objective's batch for `seqs` (right-padded), every real token supervised."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    aux, last = [], []
    for b, seq in enumerate(seqs):
        ids[b, : len(seq)], valid[b, : len(seq)] = torch.tensor(seq), True
        with torch.no_grad():
            out = capture_batch(target, torch.tensor([seq]), AUX)
        pad = width - len(seq)
        aux.append(torch.nn.functional.pad(out["aux_hidden"][0], (0, 0, 0, pad)))
        last.append(torch.nn.functional.pad(out["last_hidden"][0], (0, 0, 0, pad)))
    feats, hidden = torch.stack(aux).float(), torch.stack(last)
    return TTTBatch(ids, feats, hidden, valid.long(), valid)


def fitted_head(target, prompts, block_size=4, steps=150, seed=2) -> PEagleHead:
    """A head fitted (memorizing) the target's greedy continuations of `prompts` with peagle_loss."""
    from draftsmith.train.objectives.peagle_objective import peagle_loss

    head = random_head(target, block_size, seed).train()
    seqs = [p + r.token_ids for p, r in zip(prompts, generate_plain(target, prompts, SamplingParams(), 24))]
    batch = target_batch(target, seqs)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the fitted head must not depend on the thread count: the law tests' negative
    try:  # controls need its q to differ from p as it did when they were written (chi2 ~17 vs ~4000 seen)
        for _ in range(steps):
            out = peagle_loss(head, target.embed, batch, target_logits=target.logits)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return head.eval()
