"""DFlash heads for the tests (tests/runtime/test_dflash*.py): random heads (drafts vary, mostly rejected)
and heads briefly trained with the real objective (train/objectives/dflash_objective.py) on the tiny target's
own greedy continuations (drafts accept, partly and fully)."""

import torch

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.heads.dflash import DFlashConfig, DFlashHead
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.train.objectives.dflash_objective import dflash_loss
from draftsmith.train.objectives.eagle3_data import online_batch

AUX = (0, 1, 2)  # every layer of the 3-layer tiny target


def random_head(target, block=8, layers=1, seed=0, **options) -> DFlashHead:
    """Weights ~ N(0, 0.2^2) (the LM head and final norm the target's): drafts differ from the target's."""
    torch.manual_seed(seed)
    config = DFlashConfig.for_target(target, AUX, block_size=block, num_layers=layers, **options)
    head = DFlashHead(config)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.2)
    return head.init_from_target(target).eval()


def trained_head(target, prompts, block=8, steps=120, new_tokens=24, seed=1) -> DFlashHead:
    """A head trained with dflash_loss on the target's greedy continuations of `prompts` (memorized)."""
    head = random_head(target, block, layers=2, seed=seed).train()
    seqs = [
        p + r.token_ids
        for p, r in zip(prompts, generate_plain(target, prompts, SamplingParams(), new_tokens))
    ]
    rows = [
        {"input_ids": s, "loss_mask": [0] * len(p) + [1] * (len(s) - len(p))} for s, p in zip(seqs, prompts)
    ]
    rows = [{**r, "loss_mask": [1] * len(r["input_ids"])} for r in rows]  # every next token: more blocks
    batch = online_batch(target, rows, AUX)
    batch.features = batch.features.float()
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        out = dflash_loss(
            head, target.embed, batch, target_logits=target.logits, max_anchors=64, generator=generator
        )
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    return head.eval()
