"""What building a fresh head for a run shares across kinds: the draft vocabulary's token ids from the data
steps, and an output side that starts as the target's.

    ids = draft_ids(paths.vocab, target, cfg.head.draft_vocab_size)   # [Vd] target token ids
    head.set_draft_vocab(ids); copy_target_output(head, target, ids)  # EAGLE-3, P-EAGLE
    return finish_head(head, target, vocab, section.init_from_target, vocab_dir)   # Medusa, DFlash
"""

from __future__ import annotations

import torch


def draft_ids(vocab_dir, target, draft_vocab: int) -> torch.Tensor:
    """The target token id of each draft token: the data steps' d2t offsets (data_recipes/vocab.py) plus
    the draft token's own index."""
    from draftsmith.data_recipes.vocab import load_draft_vocab

    d2t, _ = load_draft_vocab(vocab_dir, target.vocab_size, draft_vocab)
    return d2t + torch.arange(len(d2t))


def copy_target_output(head, target, ids: torch.Tensor) -> None:
    """The head's LM head (the rows of draft tokens `ids`) and final norm start as the target's: the head's
    output lives in the target's residual space."""
    with torch.no_grad():
        head.lm_head.weight.copy_(target.model.lm_head.weight[ids].float())
        head.norm.weight.copy_(target.decoder.norm.weight.float())


def finish_head(head, target, vocab: int | None, init_from_target: bool, vocab_dir):
    """A head that has its own `init_from_target` (Medusa, DFlash): the draft vocabulary when `vocab` is
    set (head.reduce_vocab), the target's pieces when asked, in float32 (the trainer's master weights)."""
    if vocab is not None:
        head.set_draft_vocab(draft_ids(vocab_dir, target, vocab))
    if init_from_target:
        head.init_from_target(target)
    return head.float()
