"""DSpark heads for the tests (tests/runtime/test_dspark*.py): random heads (drafts vary, mostly rejected;
a Markov bias large enough to change the drafts) and heads on a trained DFlash backbone
(tests/dflash_heads.py) whose drafts are accepted."""

import torch
from dflash_heads import AUX

from draftsmith.runtime.heads.dspark import DSparkConfig, DSparkHead


def random_head(target, block=8, layers=1, seed=0, rank=16, markov="vanilla", **options) -> DSparkHead:
    """Weights ~ N(0, 0.2^2) (the LM head and final norm the target's); markov_w1, markov_w2 ~ N(0, 1),
    so the Markov bias moves the drafts (a test that it is applied at the right position can fail)."""
    torch.manual_seed(seed)
    config = DSparkConfig.for_target(
        target, AUX, block_size=block, num_layers=layers, markov_rank=rank, markov_head_type=markov, **options
    )
    head = DSparkHead(config)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.2)
        head.markov_head.markov_w1.weight.normal_(0, 1.0)
        head.markov_head.markov_w2.weight.normal_(0, 1.0)
    return head.init_from_target(target).eval()


def on_backbone(backbone, rank=16, markov="vanilla", scale=0.05, seed=0) -> DSparkHead:
    """A DSpark head around a (trained) DFlash head, its Markov bias small: the backbone's drafts mostly."""
    torch.manual_seed(seed)
    fields = {**backbone.config.__dict__, "head_type": "dspark"}
    head = DSparkHead(DSparkConfig(**fields, markov_rank=rank, markov_head_type=markov))
    head.backbone.load_state_dict(backbone.state_dict())
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.startswith("backbone."):
                p.normal_(0, scale)
    return head.eval()
