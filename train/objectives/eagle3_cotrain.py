"""EAGLE-3 against a co-trained target: the target (LoRA adapters or every weight) trains with the head.

    draftsmith train --config configs/eagle3-cotrain-lora-smollm2-135m.yaml
    model, peft_model = cotrain_model(cfg, target, ttt_model, aux_layers)   # (train/objectives/heads.py
    Eagle3Kind) loss, correct, counted = model(**cotrain_batch(rows, device))          # L_next + w * L_eagle3
    head = save_cotrained(head, target, peft_model, "runs/x/final", original_hash)  # final/target + binding

The step runs the target's own forward with gradients on a right-padded batch (online only: captured
features come from a frozen target), keeping the outputs of the aux layers (forward hooks), the residual
stream entering the final norm and the normed last state. The loss is

    L = L_next + w * L_eagle3        w = head.cotrain_weight (MTP's lambda, 0.3 by default)

L_next is the target's CE on the data's next token (train/objectives/mtp_objective.next_token_loss, as MTP
co-training), L_eagle3 the frozen-target objective's TTT loss (train/objectives/heads.TTTModel with the same
loss, schedule and noise options) on the current target's features and distributions.

Which gradients reach the target. The head's teacher, the target's distribution over token t+k+2, is
always detached (ttt_loss computes it under no_grad): the head's loss must not pull the target's own
distribution towards the head's guess, which would trade the target's quality for acceptance directly.
(ModelOpt's co-training, `eagle_freeze_base_model=False`, leaves its teacher logits attached and detaches
the aux hidden states instead.) The features F_t are not detached by default: the head's loss reaches the
target through them, so the target may shape the states the head reads, as Medusa-2's heads' loss reaches
the backbone through its last hidden state (Cai et al. 2024, arXiv:2401.10774 section 2.3.2) and DeepSeek-V3's
MTP loss its trunk ("pre-plan its representations", arXiv:2412.19437 section 2.2); EAGLE-3 itself (Li et
al. 2025, arXiv:2503.01840) only trains against a frozen target. `head.cotrain_detach_features=true`
stops the head's loss at the features: the target then trains on L_next alone and the head follows it.
The drift report (train/objectives/cotrain.drift_sums, train/loop/trainer.py) keeps a faster but worse target
from shipping unnoticed. Tests: tests/train/test_eagle3_cotrain.py.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from draftsmith.train.objectives.cotrain import make_trainable, save_cotrained_target, target_hidden
from draftsmith.train.objectives.mtp_objective import next_token_loss, teacher_positions

log = logging.getLogger("draftsmith")


def target_states(target, input_ids: torch.Tensor, valid: torch.Tensor, aux_layers) -> tuple:
    """The target's own forward (with gradients when enabled) on a right-padded batch -> (features
    [B, T, A*H]: aux layers' outputs in aux-layer order, last [B, T, H]: the residual stream entering the
    final norm, h [B, T, H]: after it). Layer i's output is what `Target.forward(capture_layers=(i,))`
    and the offline capture store."""
    kept: dict[int, torch.Tensor] = {}

    def keep(index):
        def hook(_module, _args, out):
            kept[index] = out[0] if isinstance(out, tuple) else out  # older transformers return tuples

        return hook

    layers = target.decoder.layers
    hooks = [layers[i].register_forward_hook(keep(i)) for i in aux_layers]
    try:
        h, last = target_hidden(target, input_ids, valid, with_pre_norm=True)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([kept[i] for i in aux_layers], dim=-1), last, h


class Eagle3CotrainModel(nn.Module):
    """The head's objective (a TTTModel) on the co-trained target's states, plus the target's own loss.
    The head is `head` and the target's model `target_model` (both trained: DDP and DeepSpeed must see
    them; the state dict keeps the frozen objective's `head.*` names). The TTTModel is hidden in a list
    and follows train()/eval() by hand."""

    def __init__(self, ttt_model, target, aux_layers, weight: float, detach_features: bool = False):
        super().__init__()
        self.head, self.target_model = ttt_model.head, target.model
        self._ttt, self._target = [ttt_model], [target]
        self.aux, self.weight, self.detach_features = tuple(aux_layers), weight, detach_features
        self.parts: tuple[torch.Tensor, torch.Tensor] | None = None  # (L_next, L_eagle3) of the last call

    @property
    def active_steps(self) -> int:  # the TTT schedule's stage (train/objectives/heads.Eagle3Kind.begin_step)
        return self._ttt[0].active_steps

    @active_steps.setter
    def active_steps(self, steps: int) -> None:
        self._ttt[0].active_steps = steps

    def train(self, mode: bool = True):
        self._ttt[0].train(mode)
        return super().train(mode)

    def forward(self, input_ids, loss_mask, valid):
        """-> (L_next + w * L_eagle3, correct [K], counted [K]); the target runs here."""
        target = self._target[0]
        features, last, h = target_states(target, input_ids, valid, self.aux)  # [B, T, A*H], [B, T, H] x2
        sel = teacher_positions(loss_mask, valid)  # [B, T]: positions whose next token is supervised
        l_next = next_token_loss(target.lm_head(h[sel]), input_ids, sel)  # the logits: [N, V]
        if self.detach_features:
            features = features.detach()
        features = features.to(torch.promote_types(features.dtype, torch.float32))  # as make_batch; f64 kept
        # the teacher (target logits from `last`) is computed under no_grad inside ttt_loss: detached
        l_eagle3, correct, counted = self._ttt[0](input_ids, features, last.detach(), loss_mask, valid)
        self.parts = (l_next, l_eagle3)  # with their graphs (tests back-propagate each alone)
        return l_next + self.weight * l_eagle3, correct, counted


def cotrain_model(cfg, target, ttt_model, aux_layers):
    """Make `target` trainable as `cfg.cotrain` says (after the head took its initial weights from it)
    -> (Eagle3CotrainModel, peft model or None). The original's weights hash is kept for save_cotrained."""
    original_hash = target.weights_hash()
    peft_model = make_trainable(target, cfg.cotrain)
    h = cfg.head  # the co-training weight and detach_features are the head section's (eagle3_kind.py)
    model = Eagle3CotrainModel(ttt_model, target, aux_layers, h.cotrain_weight, h.cotrain_detach_features)
    model.original_hash = original_hash
    how = "stops at the features" if h.cotrain_detach_features else "reaches the target through its features"
    log.info("EAGLE-3 co-training: L_next + %g * L_eagle3; the head's loss %s", h.cotrain_weight, how)
    return model, peft_model


def cotrain_batch(rows: list[dict], device) -> dict:
    """The co-trained model's inputs: right-padded ids, loss mask and validity (the target runs inside;
    MTP's online inputs, train/objectives/heads.mtp_batch)."""
    from draftsmith.train.objectives.eagle3_data import pad_rows

    valid = pad_rows([torch.ones(len(r["input_ids"]), dtype=torch.bool) for r in rows], False)
    return {
        "input_ids": pad_rows([torch.as_tensor(r["input_ids"]).long() for r in rows]).to(device),
        "loss_mask": pad_rows([torch.as_tensor(r["loss_mask"]).long() for r in rows]).to(device),
        "valid": valid.to(device),
    }


def bind_head(head: nn.Module, merged_model, folder) -> nn.Module:
    """The same head with its config naming the co-trained target in `folder` and its weights hash
    (runtime/heads/eagle3_binding.py refuses other targets unless told)."""
    from draftsmith.runtime.core.artifacts import weights_hash

    config = replace(
        head.config, target=str(Path(folder)), target_weights_hash=weights_hash(merged_model), cotrained=True
    )
    out = type(head)(config)
    out.load_state_dict(head.state_dict())
    return out


def save_cotrained(head: nn.Module, target, peft_model, folder, original_hash: str | None) -> nn.Module:
    """The co-trained target (adapters merged) to `folder/target`, then the head bound to it."""
    where = Path(folder) / "target"
    merged = save_cotrained_target(target, peft_model, where)
    bound = bind_head(head, merged, where)
    if bound.config.target_weights_hash == original_hash:  # the hash reads a few tensors (artifacts.py)
        log.warning(
            "co-trained target: its weights hash equals the original's (%s): the tensors it reads did not "
            "change (cotrain.lora_target_modules?), so the original target will not be refused",
            original_hash,
        )
    return bound
