"""The training objectives of the EAGLE-3 and MTP kinds: what the loop needs per head kind
(train/objectives/registry.py registers them by kind name).

    kind = objective(cfg.head.type)(cfg, target, aux_layers, paths)
    kind.model          # the nn.Module Accelerate prepares: forward(**kind.batch(rows, device)) ->
                        #   (loss, correct [D], counted [D]) with D = kind.depth accuracy slots
    kind.save_final(state_dict, folder)   # the head a `--draft` spec loads (and a co-trained target)

EAGLE-3: the training-time test over `train.ttt_steps` steps (`eagle3_objective`). MTP: `head.num_modules`
modules (`mtp_objective`), the target frozen or co-trained (`cotrain`). The target's embedding (and, for
MTP, its LM head) are used by the objectives but belong to the model only when the target co-trains, so
DDP and DeepSpeed never see frozen weights. Each class also states what the memory preflight reads
(train/preflight/estimate.py): `label`, `steps_label`, `ttt` (the training-time-test unroll: its attention,
checkpointing and aux-layer knobs apply), `steps(cfg)`, `new_head(...)` (the head it trains) and
`memory_terms(shapes, knobs, setup)` (its bytes per rank beyond the resident ones:
train/preflight/eagle3_memory.py, train/preflight/mtp_memory.py).
"""

from __future__ import annotations

from operator import attrgetter

import torch
from torch import nn

from draftsmith.runtime.errors import DraftsmithError
from draftsmith.train.objectives.eagle3_data import offline_batch, online_batch, pad_rows
from draftsmith.train.objectives.eagle3_levers import Levers, pad_steps
from draftsmith.train.objectives.eagle3_objective import TTTBatch, ttt_loss
from draftsmith.train.objectives.head_init import copy_target_output, draft_ids
from draftsmith.train.preflight.eagle3_memory import eagle3_terms
from draftsmith.train.preflight.mtp_memory import mtp_terms


def load_partial(module: nn.Module, state: dict, prefix: str) -> nn.Module:
    """Load the `prefix.*` entries of a gathered state dict into `module` (derived buffers may be absent)."""
    result = module.load_state_dict(
        {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}, strict=False
    )
    missing = [k for k in result.missing_keys if not k.startswith("rotary.")]
    if missing or result.unexpected_keys:
        raise DraftsmithError(f"final head: missing {missing}, unexpected {result.unexpected_keys}")
    return module


# ---- EAGLE-3 ------------------------------------------------------------------------------------------
class TTTModel(nn.Module):
    """The head and its objective as one module, so DDP and DeepSpeed see one forward per micro-batch.
    The target's embedding and logits (final norm + LM head) are used frozen and are deliberately not
    submodules (never trained, sharded or saved). `options`: ttt_loss's keywords (logit_chunk,
    attention, checkpoint_layers, divergence, weights). The levers of train/objectives/eagle3_levers.py:
    `noise_std` on the features in training forwards; `active_steps` (head.ttt_schedule's stage, set per
    optimizer step) TTT steps in training, all `steps` in evaluation; the counts are padded to `steps`."""

    def __init__(
        self, head: nn.Module, embed, target_logits, steps: int, decay: float, noise_std=0.0, **options
    ):
        super().__init__()
        self.head, self.steps, self.decay, self.options = head, steps, decay, options
        self.noise_std, self.active_steps = noise_std, steps
        self._frozen = [embed, target_logits]  # a list hides them from nn.Module registration

    def forward(self, input_ids, features, target_hidden, loss_mask, valid):
        """-> (weighted TTT loss, correct [K], counted [K])"""
        embed, target_logits = self._frozen
        if self.training and self.noise_std > 0:  # EAGLE's feature noise (train/objectives/eagle3_levers.py)
            features = features + self.noise_std * torch.randn_like(features)  # [B, T, A*Ht]
        steps = self.active_steps if self.training else self.steps
        batch = TTTBatch(input_ids, features, target_hidden, loss_mask, valid)
        out = ttt_loss(
            self.head, embed, batch, steps, self.decay, target_logits=target_logits, **self.options
        )
        return out.loss, pad_steps(out.correct, self.steps), pad_steps(out.counted, self.steps)


def build_eagle3_head(cfg, target, aux_layers, vocab_dir):
    head = Eagle3Kind.new_head(
        target, aux_layers, cfg.head.draft_vocab_size, cfg.train.ttt_steps, False, cfg.head.head_options()
    )
    ids = draft_ids(vocab_dir, target, cfg.head.draft_vocab_size)
    head.set_draft_vocab(ids)
    if cfg.head.init_from_target:
        copy_target_output(head, target, ids)
    return head.float()


def make_batch(target, rows, aux_layers, device) -> dict:
    """The EAGLE-3 model's keyword inputs for one micro-batch (online: the frozen target runs here)."""
    batch = offline_batch(target, rows) if "aux_hidden" in rows[0] else online_batch(target, rows, aux_layers)
    return {
        "input_ids": batch.input_ids.to(device),
        "features": batch.features.to(device, torch.float32),
        "target_hidden": batch.target_hidden.to(device),
        "loss_mask": batch.loss_mask.to(device),
        "valid": batch.valid.to(device),
    }


class Eagle3Kind:
    kind, label, steps_label, ttt = "eagle3", "EAGLE-3", "K={}", True
    memory_terms = staticmethod(eagle3_terms)  # the memory preflight's terms: batch building, the unroll
    steps = staticmethod(attrgetter("train.ttt_steps"))  # steps(cfg): the TTT unroll's K

    @staticmethod
    def new_head(
        target, aux_layers, draft_vocab: int, steps: int, cotrained: bool, options: dict
    ) -> nn.Module:
        """The head this objective trains, for `target` (a Target, or preflight's config-only stand-in)."""
        from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head

        return Eagle3Head(Eagle3Config.for_target(target, aux_layers, draft_vocab, **options))

    def __init__(self, cfg, target, aux_layers, paths):
        self.target, self.aux = target, aux_layers
        self.head = build_eagle3_head(cfg, target, aux_layers, paths.vocab)
        t = cfg.train
        self.levers = lever = Levers.from_config(cfg)  # head.loss, ttt_schedule, ttt_weights, noise_std
        self.model = TTTModel(
            self.head, target.embed, target.logits, t.ttt_steps, t.step_decay, logit_chunk=t.logit_chunk,
            attention=t.ttt_attention, checkpoint_layers=t.activation_checkpointing,
            noise_std=lever.noise_std, divergence=lever.loss, weights=lever.weights,
        )  # fmt: skip
        self.depth = cfg.train.ttt_steps
        self.cotrain, self.peft_model = cfg.cotrain.enabled, None
        # the target trains with the head: L_next + w * L_eagle3 (train/objectives/eagle3_cotrain.py)
        if self.cotrain:
            from draftsmith.train.objectives.eagle3_cotrain import cotrain_model

            self.model, self.peft_model = cotrain_model(cfg, target, self.model, aux_layers)

    def begin_step(self, step: int) -> None:
        """head.ttt_schedule's stage for optimizer step `step` (0-based; a function of the step only)."""
        self.model.active_steps = self.levers.steps_at(step, self.depth)

    def log_fields(self) -> dict:
        return {"ttt_steps": self.model.active_steps}

    def batch(self, rows, device) -> dict:
        if self.cotrain:  # ids and masks only: the co-trained target runs inside the model's forward
            from draftsmith.train.objectives.eagle3_cotrain import cotrain_batch

            return cotrain_batch(rows, device)
        return make_batch(self.target, rows, self.aux, device)

    def save_final(self, state: dict, folder) -> None:
        """The head to `folder`; co-trained, the target (adapters merged) to `folder/target` first and the
        head bound to its weights hash (train/objectives/eagle3_cotrain.py)."""
        from draftsmith.runtime.heads.eagle3 import save_head

        head = load_partial(self.head.__class__(self.head.config), state, "head.")
        if self.cotrain:
            from draftsmith.train.objectives.eagle3_cotrain import save_cotrained

            head = save_cotrained(head, self.target, self.peft_model, folder, self.model.original_hash)
        save_head(head, folder)


# ---- MTP ----------------------------------------------------------------------------------------------
class MtpModel(nn.Module):
    """MTP modules + objective; the target's model is a submodule only when it co-trains."""

    def __init__(self, head, target, labels: str, decay: float, cotrain_weight: float | None):
        super().__init__()
        self.head, self.labels, self.decay, self.cotrain_weight = head, labels, decay, cotrain_weight
        self._target = [target]
        if cotrain_weight is not None:
            self.target_model = target.model  # trained (full or LoRA): DDP / DeepSpeed must see it

    def forward(self, input_ids, loss_mask, valid, last_hidden=None):
        """-> (loss, correct [M], counted [M]); online runs the target here (with grad when co-training)."""
        from draftsmith.train.objectives.cotrain import target_hidden
        from draftsmith.train.objectives.mtp_objective import mtp_loss, next_token_loss, teacher_positions

        target = self._target[0]
        cotrain = self.cotrain_weight is not None
        with torch.set_grad_enabled(cotrain and torch.is_grad_enabled()):
            if last_hidden is None:  # [B, T, H] after the final norm, and the residual stream before it
                h0, last_hidden = target_hidden(target, input_ids, valid, with_pre_norm=True)
            else:  # offline: the captured pre-norm last hidden state
                h0 = target.final_norm(last_hidden.to(target.dtype))
            feature = last_hidden if self.head.config.feature == "pre_norm" else h0  # module 0 reads it
            sel = teacher_positions(loss_mask, valid)  # [B, T]
            logits = target.lm_head(h0[sel])  # [N, V] only where some loss reads them
        out = mtp_loss(
            self.head, target, input_ids, feature, logits, loss_mask, valid, self.labels, self.decay
        )
        loss = out.loss
        if cotrain:
            loss = next_token_loss(logits, input_ids, sel) + self.cotrain_weight * loss
        return loss, out.correct, out.counted


def mtp_batch(rows: list[dict], device, dtype) -> dict:
    """The MTP model's keyword inputs: right-padded ids, loss mask and validity (+ captured last hidden
    states offline; online the target runs inside the model's forward)."""
    valid = pad_rows([torch.ones(len(r["input_ids"]), dtype=torch.bool) for r in rows], False)
    out = {
        "input_ids": pad_rows([torch.as_tensor(r["input_ids"]).long() for r in rows]).to(device),
        "loss_mask": pad_rows([torch.as_tensor(r["loss_mask"]).long() for r in rows]).to(device),
        "valid": valid.to(device),
    }
    if "last_hidden" in rows[0]:  # offline rows (capture shards)
        out["last_hidden"] = pad_rows([r["last_hidden"] for r in rows]).to(device, dtype)
    return out


class MtpKind:
    kind, label, steps_label, ttt = "mtp", "MTP", "M={} modules", False
    memory_terms = staticmethod(mtp_terms)  # the memory preflight's terms: the modules' blocks, attention
    steps = staticmethod(attrgetter("head.num_modules"))  # steps(cfg): M modules

    @staticmethod
    def new_head(
        target, aux_layers, draft_vocab: int, steps: int, cotrained: bool, options: dict
    ) -> nn.Module:
        from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead

        return MtpHead(MtpConfig.for_target(target, steps, cotrained=cotrained, **options))

    def __init__(self, cfg, target, aux_layers, paths):
        from draftsmith.train.objectives.cotrain import make_trainable

        self.target, self.cfg = target, cfg
        cotrain = cfg.cotrain.enabled
        self.head = self.new_head(
            target,
            aux_layers,
            cfg.head.draft_vocab_size,
            cfg.head.num_modules,
            cotrain,
            cfg.head.head_options(),
        )
        if cfg.head.init_from_target:  # before LoRA wraps the target's layers (a strict copy of the last)
            self.head.init_from_target(target)
        self.peft_model = make_trainable(target, cfg.cotrain) if cotrain else None
        self.head.float()
        weight = cfg.head.cotrain_weight if cotrain else None  # lambda: the head section's (mtp_kind.py)
        self.model = MtpModel(self.head, target, cfg.head.labels, cfg.train.step_decay, weight)
        self.depth = cfg.head.num_modules

    def batch(self, rows, device) -> dict:
        return mtp_batch(rows, device, self.target.dtype)

    def save_final(self, state: dict, folder) -> None:
        """The modules to `folder`; a co-trained target (adapters merged) to `folder/target` first, so
        the head records the weights it must be served with."""
        from pathlib import Path

        from draftsmith.runtime.core.artifacts import weights_hash
        from draftsmith.runtime.heads.mtp import save_head
        from draftsmith.train.objectives.cotrain import save_cotrained_target

        head = load_partial(self.head.__class__(self.head.config), state, "head.")
        if self.cfg.cotrain.enabled:
            merged = save_cotrained_target(self.target, self.peft_model, Path(folder) / "target")
            head.config.target_weights_hash = weights_hash(merged)
            head.config.target = str(Path(folder) / "target")
        save_head(head, folder)
