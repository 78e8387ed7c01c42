"""Online and offline EAGLE-3 batches: the same rows give identical TTT losses whether the frozen target
runs inside the step or its hidden states come from `data capture` shards (float32 storage)."""

import json

import torch

from draftsmith.data_recipes.capture import capture
from draftsmith.data_recipes.capture_reader import CaptureFolder
from draftsmith.data_recipes.prepare import prepare
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.train.objectives.eagle3_data import offline_batch, online_batch
from draftsmith.train.objectives.eagle3_objective import ttt_loss

CONVERSATIONS = [
    [{"role": "user", "content": "w1 w2 w3"}, {"role": "assistant", "content": "w4 w5 w6 w7 w8"}],
    [
        {"role": "user", "content": "w7 w8"},
        {"role": "assistant", "content": "w9 w10 w11"},
        {"role": "user", "content": "w12"},
        {"role": "assistant", "content": "w13 w14 w15 w16"},
    ],
    [{"role": "user", "content": "w20"}, {"role": "assistant", "content": "w21 w22 w23 w24 w25 w26"}],
]


def test_online_and_offline_losses_are_identical(tiny_target, tmp_path):
    source = tmp_path / "conv.jsonl"
    source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    prepare(
        tiny_target, str(source), tmp_path / "data", max_length=64, validation_fraction=0.0, progress=False
    )
    layers = [0, 1, 2]
    capture(tiny_target, tmp_path / "data", tmp_path / "cap", layers, "float32", "train", progress=False)
    folder = CaptureFolder(tmp_path / "cap")
    rows = [folder[i] for i in range(len(folder))]
    assert len(rows) >= 2
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(tiny_target, aux_layer_ids=layers))
    offline = offline_batch(tiny_target, rows)
    online = online_batch(
        tiny_target, [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in rows], layers
    )
    for name in ("input_ids", "features", "target_hidden", "loss_mask", "valid"):
        assert torch.equal(getattr(online, name), getattr(offline, name)), name
    a, b = (
        ttt_loss(head, tiny_target.embed, online, steps=3, target_logits=tiny_target.logits),
        ttt_loss(head, tiny_target.embed, offline, steps=3, target_logits=tiny_target.logits),
    )
    assert torch.equal(a.loss, b.loss) and torch.equal(a.step_losses, b.step_losses)
    assert int(a.counted[0]) > 0
