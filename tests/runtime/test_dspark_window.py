"""The sliding-window option of DFlash and DSpark draft attention (`window` in the head config,
speculators#749): the drafter's block over its cached context (after commits with padding holes and a
skipped step) equals a from-scratch forward over only the last `window` context tokens (float64), and
differs from the full-context one (the control); training's anchor mask shows each block exactly the
`window` positions before its anchor; DSpark with a window stays greedy-identical; the speculators export
carries it as sliding-window layers that speculators' DSparkDraftModel reads; z-lab's layout refuses it;
a window below 1 is refused (above the trained context: tests/train/test_dspark_objective.py).

    python -m pytest tests/runtime/test_dspark_window.py -q
"""

import json

import pytest
import torch
from dflash_heads import random_head as dflash_head
from dspark_heads import random_head
from engine_checks import assert_identical
from tiny_models import random_prompts
from tolerances import assert_float64_equal

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.drafters.dflash_drafter import DFlashSteps
from draftsmith.runtime.drafters.dspark_drafter import dspark_drafter
from draftsmith.runtime.drafters.grower import ModelDrafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.dflash import block_mask
from draftsmith.runtime.heads.dspark_layout import load_dspark
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import chain
from draftsmith.train.objectives.dflash_objective import anchor_mask

GREEDY = SamplingParams()
WINDOW = 3


def block_logits(head, target, whole, root, block):
    """One forward of [root, masks] over the context features `whole` [C, A*H] at positions 0..C-1."""
    n = len(whole)
    k, v = head.context_kv(head.fuse(whole[None]), torch.arange(n)[None])
    tokens = torch.full((1, block), head.config.mask_token_id)
    tokens[0, 0] = root
    h = head(
        target.embed(tokens),
        n + torch.arange(block)[None],
        k,
        v,
        block_mask(torch.ones(1, n, dtype=torch.bool), block),
    )
    return head.target_logits(h[0, 1:4])


def windowed_reference(head, target, whole, root, block):
    """The same block over only the last WINDOW context tokens, at their own positions."""
    n = len(whole)
    k, v = head.context_kv(head.fuse(whole[None, n - WINDOW :]), torch.arange(n - WINDOW, n)[None])
    tokens = torch.full((1, block), head.config.mask_token_id)
    tokens[0, 0] = root
    mask = block_mask(torch.ones(1, WINDOW, dtype=torch.bool), block)
    h = head(target.embed(tokens), n + torch.arange(block)[None], k, v, mask)
    return head.target_logits(h[0, 1:4])


def test_cached_windowed_context_equals_the_last_window_tokens(tiny_target):
    head = dflash_head(tiny_target, window=WINDOW).double()
    g = torch.Generator().manual_seed(0)
    width = len(head.config.aux_layer_ids) * tiny_target.hidden_size
    feats = lambda n: torch.randn(n, width, dtype=torch.float64, generator=g)  # noqa: E731
    prompts, context = [[5, 6, 7, 8, 9], [10, 11]], [feats(5), feats(2)]
    drafter = ModelDrafter(DFlashSteps(head, tiny_target, head.config.block_size), chain(3), "dflash")
    drafter.start(prompts, GREEDY, None, context)
    drafter.propose([p + [r] for p, r in zip(prompts, [20, 21])], chain(3))
    committed, skipped = [feats(3), feats(1)], [feats(1), feats(1)]
    drafter.commit([[1, 2], []], committed)  # rows accepting 2 and 0 nodes: padding holes in the cache
    drafter.skip(skipped)
    drafter.propose([[0] * 9 + [30], [0] * 4 + [31]], chain(3))
    got = drafter.steps.block_logits.transpose(0, 1)  # [D, B, V]
    block = drafter.steps.block
    for b, root in enumerate([30, 31]):
        whole = torch.cat([context[b], committed[b], skipped[b]])
        assert_float64_equal(got[:, b], windowed_reference(head, tiny_target, whole, root, block))
        full = block_logits(head, tiny_target, whole, root, block)
        assert (got[:, b] - full).abs().max() > 1e-6  # the control: the window really cuts the context


def test_training_blocks_see_exactly_the_window_before_their_anchor():
    anchors, valid = torch.tensor([[2, 6]]), torch.ones(1, 9, dtype=torch.bool)
    mask = anchor_mask(anchors, valid, 2, window=WINDOW)[0, 0, :, :9]  # [A*S, T] the context part
    assert mask[0].nonzero().flatten().tolist() == [0, 1] and mask[2].nonzero().flatten().tolist() == [
        3,
        4,
        5,
    ]
    full = anchor_mask(anchors, valid, 2)[0, 0, :, :9]
    assert full[2].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]  # the control: no window, all before


@pytest.mark.parametrize("batch_size", [1, 4])
def test_dspark_with_a_window_is_greedy_identical(tiny_target, batch_size):
    prompts = random_prompts(4)
    drafter = dspark_drafter(tiny_target, random_head(tiny_target, window=WINDOW), "chain:3")
    results = generate_speculative(tiny_target, drafter, prompts, GREEDY, 16, batch_size=batch_size)
    assert_identical(results, generate_plain(tiny_target, prompts, GREEDY, 16))


def test_export_carries_the_window_as_sliding_layers(tiny_target, tiny_dir, tmp_path, capsys):
    head = random_head(tiny_target, layers=2, window=WINDOW)
    head.save_pretrained(tmp_path / "head")
    out = tmp_path / "spec"
    argv = [
        "export",
        str(tmp_path / "head"),
        "--format",
        "speculators",
        "--out",
        str(out),
        "--verifier",
        str(tiny_dir),
    ]
    assert main(argv) == 0
    layer = json.loads((out / "config.json").read_text())["transformer_layer_config"]
    assert layer["sliding_window"] == WINDOW and layer["layer_types"] == ["sliding_attention"] * 2
    assert load_dspark(out, tiny_target).config.window == WINDOW
    pytest.importorskip("speculators")
    from speculators.models.dspark import DSparkDraftModel

    model = DSparkDraftModel.from_pretrained(str(out))
    assert model.sliding_window == WINDOW and model.sliding_window_indices == [0, 1]
    dflash = dflash_head(tiny_target, window=WINDOW)
    dflash.save_pretrained(tmp_path / "dflash")
    argv = [
        "export",
        str(tmp_path / "dflash"),
        "--format",
        "dflash",
        "--out",
        str(tmp_path / "z"),
        "--target",
        str(tiny_dir),
    ]
    assert main(argv) == 2 and "sliding window" in capsys.readouterr().err


def test_a_window_below_one_is_refused(tiny_target):
    for bad in (0, -2, True, 2.5):
        with pytest.raises(BadInputError, match="window"):
            random_head(tiny_target, window=bad)
