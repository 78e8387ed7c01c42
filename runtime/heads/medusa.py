"""Medusa heads (Cai et al. 2024, arXiv:2401.10774): K light heads on the target's last hidden state.

    config = MedusaConfig.for_target(target, num_heads=3)          # original_lm_head=True: shared LM head
    heads = MedusaHeads(config).init_from_target(target)
    h = target.final_norm(last_hidden)                             # [B, H] the state AFTER the final norm
    logits = heads.logits(target, heads(h))                        # [K, B, V]: head k -> token t+k+2
    heads.save_pretrained("runs/medusa/final"); MedusaHeads.from_pretrained("runs/medusa/final", target)

The target's hidden state h_t at position t gives token t+1 through its own LM head (the root of a draft
tree); head k (0-based) predicts token t+k+2 from the same h_t (the paper's "Medusa heads", with
1-based k: the k-th head predicts token t+k+1). A head is L residual blocks and an LM head:

    x = h;  x = x + SiLU(W_j x + b_j) for j < L;  logits_k = W2_k x

W_j starts at zero (b_j too), so every head starts as the target's next-token predictor (the paper's
init; FasterDecoding zeroes only W). The LM head is either the head's own (`lm_heads.{k}`, copied from
the target's) or the target's own, shared (`original_lm_head`, vLLM's name: 0.33M parameters per head
on SmolLM2-135M instead of 28.6M; the target's weight is read, never stored). An optional reduced
vocabulary maps draft ids to target ids through EAGLE-3's `d2t` offsets (target id = d + d2t[d]); a
shared head's draft rows are sliced once and kept while the weight and the token map are unchanged
(`draft_rows`; tests/runtime/test_medusa_rows.py, scripts/medusa_rows_timing.py).

Tensor names are vLLM's (vllm/model_executor/models/medusa.py): `blocks.{k}.layers.{j}.weight` (+ `.bias`
with `fc_bias`), `lm_heads.{k}.weight`; plus `d2t`, `t2d`. Loading is strict and checks the target's
vocabulary, hidden size, layer count, tokenizer and weights hash (runtime/heads/mtp.py's checks): Medusa-2
heads (`cotrained`) name their co-trained target's folder and hash, so the original target is refused.
Run its tests: `python -m pytest tests/runtime/test_medusa.py -q`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from draftsmith.runtime.core.artifacts import save_head_files, tokenizer_hash
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.head_folder import check_head_type, config_from, fill_strict, read_head_folder

MAX_HEADS = 8  # the paper finds five enough; vLLM drafts one token per head


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class MedusaConfig:
    target: str
    vocab_size: int  # the target's vocabulary
    hidden_size: int
    num_heads: int  # K: head k predicts token t+k+2
    tokenizer_hash: str
    target_weights_hash: str  # artifacts.weights_hash of the target the heads read
    num_target_layers: int
    num_layers: int = 1  # L residual blocks per head
    original_lm_head: bool = True  # the target's LM head, shared (vLLM's `original_lm_head`)
    fc_bias: bool = True  # the blocks' linear layers have a bias (FasterDecoding; vLLM's `medusa_fc_bias`)
    draft_vocab_size: int | None = None  # rows of the LM heads (None = the target's vocabulary)
    head_type: str = "medusa"
    # accuracies[k][i]: P(head k's rank-i token is the target's), measured on a calibration split; the
    # sparse tree (runtime/medusa_drafter.sparse_tree) is built from it
    accuracies: list[list[float]] | None = None
    # Medusa-2: the target trained with the heads; `target` names that co-trained folder (the run's
    # final/target) and `target_weights_hash` its weights, so the original target is refused
    cotrained: bool = False

    @classmethod
    def for_target(cls, target, num_heads: int = 3, **options) -> MedusaConfig:
        return cls(
            target=target.name,
            vocab_size=target.vocab_size,
            hidden_size=target.hidden_size,
            num_heads=num_heads,
            tokenizer_hash=tokenizer_hash(target.tokenizer),
            target_weights_hash=target.weights_hash(),
            num_target_layers=target.num_layers,
            **options,
        ).validate()

    @property
    def out_vocab(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    def validate(self) -> MedusaConfig:
        k = self.num_heads
        if not _is_int(k) or not 1 <= k <= MAX_HEADS:
            raise BadInputError("num_heads", k, f"an integer in [1, {MAX_HEADS}] (Medusa heads)")
        if not _is_int(self.num_layers) or self.num_layers < 0:
            raise BadInputError("num_layers", self.num_layers, "an integer >= 0 (residual blocks per head)")
        if self.draft_vocab_size is not None and not (
            _is_int(self.draft_vocab_size) and 0 < self.draft_vocab_size <= self.vocab_size
        ):
            raise BadInputError(
                "draft_vocab_size", self.draft_vocab_size, f"an integer in [1, {self.vocab_size}]"
            )
        if self.head_type != "medusa":
            raise BadInputError("head_type", self.head_type, "medusa")
        if self.accuracies is not None:
            rows = self.accuracies
            if len(rows) != k or any(not row or any(not 0 <= a <= 1 for a in row) for row in rows):
                raise BadInputError("accuracies", rows, f"{k} non-empty rows of probabilities (one per head)")
        return self


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b), W (and b) zero at the start: the identity."""

    def __init__(self, hidden: int, layers: int, bias: bool):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden, bias=bias) for _ in range(layers))
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            if bias:
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + F.silu(layer(x))
        return x


class SlicedRows:
    """The shared LM head's draft-vocabulary rows (`MedusaHeads.draft_rows`) and what they were sliced
    from. Not state: a copy or a pickle of the heads starts empty (`__reduce__`)."""

    def __init__(self):
        self.key, self.weight, self.rows = None, None, None  # rows [Vd, H]; weight: a weakref

    def __reduce__(self):
        return (SlicedRows, ())


def _version_key(weight: torch.Tensor, d2t: torch.Tensor) -> tuple | None:
    """What the rows depend on: the weight's and the token map's storage and version counters (bumped by
    every in-place write: an optimizer step, copy_, load_state_dict), and inference mode (its tensors
    cannot be saved for backward); None for inference tensors, which keep no version counter."""
    if weight.is_inference() or d2t.is_inference():
        return None
    inference = torch.is_inference_mode_enabled()
    return (weight.data_ptr(), weight._version, weight.dtype, d2t.data_ptr(), d2t._version, inference)


class MedusaHeads(nn.Module):
    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        self.config = cfg.validate()
        hidden, k = cfg.hidden_size, cfg.num_heads
        self.blocks = nn.ModuleList(ResidualBlock(hidden, cfg.num_layers, cfg.fc_bias) for _ in range(k))
        if not cfg.original_lm_head:
            self.lm_heads = nn.ModuleList(nn.Linear(hidden, cfg.out_vocab, bias=False) for _ in range(k))
        self.register_buffer("d2t", torch.zeros(cfg.out_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.set_draft_vocab(torch.arange(cfg.out_vocab))
        self._draft_rows = SlicedRows()

    # ---- vocabulary and initialization --------------------------------------------------------------
    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Draft id i stands for target id target_ids[i] (ascending, unique): EAGLE-3's d2t / t2d."""
        target_ids = target_ids.to(self.d2t.device)
        self.d2t.copy_(target_ids - torch.arange(len(target_ids), device=self.d2t.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    @property
    def reduced(self) -> bool:
        return self.config.out_vocab < self.config.vocab_size

    def draft_ids(self) -> torch.Tensor:
        """[Vd] the target id of every draft id."""
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    def init_from_target(self, target) -> MedusaHeads:
        """Own LM heads start as the target's (its draft-vocabulary rows); blocks are already zero."""
        check_matches_target(self.config, target, "(the target being initialized from)")
        if not self.config.original_lm_head:
            weight = target.model.lm_head.weight
            with torch.no_grad():
                for head in self.lm_heads:
                    head.weight.copy_(weight[self.draft_ids().to(weight.device)].to(head.weight.dtype))
        return self

    # ---- compute ------------------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """hidden [..., H], the target's last state after its final norm -> [k, ..., H] block outputs of
        the first `heads` heads (all by default)."""
        weight = next(self.blocks.parameters(), None)  # none with zero blocks and a shared LM head
        hidden = hidden.to(self.d2t.device, hidden.dtype if weight is None else weight.dtype)
        count = self.config.num_heads if heads is None else heads
        return torch.stack([block(hidden) for block in self.blocks[:count]])

    def draft_logits(self, target, head: int, x: torch.Tensor) -> torch.Tensor:
        """Head `head`'s block output x [..., H] -> logits over the draft vocabulary [..., Vd] (fp32)."""
        if not self.config.original_lm_head:
            out = self.lm_heads[head](x)
        elif not self.reduced:
            out = target.lm_head(x.to(target.dtype))
        else:  # vLLM slices the shared head by its token map: the same rows here
            rows = self.draft_rows(target.model.lm_head.weight)  # [Vd, H]
            out = F.linear(x.to(rows.dtype), rows)
        return out.to(torch.promote_types(out.dtype, torch.float32))

    def draft_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """The shared LM head `weight` [V, H]'s draft-vocabulary rows [Vd, H], sliced once and reused
        while neither the weight nor the token map changes (slicing on every call copied Vd x H per head
        per draft cycle). A weight that trains through them (it requires grad under autograd: a
        co-trained target) is sliced in the graph on every call, so its gradient is the uncached one."""
        ids = self.d2t
        key = None if weight.requires_grad and torch.is_grad_enabled() else _version_key(weight, ids)
        if key is None:
            return weight.index_select(0, self.draft_ids().to(weight.device))
        cache = self._draft_rows
        if cache.rows is None or cache.key != key or cache.weight() is not weight:
            cache.rows = None  # the old rows go before the new ones are made
            cache.rows = weight.index_select(0, self.draft_ids().to(weight.device))
            cache.key, cache.weight = key, weakref.ref(weight)
        return cache.rows

    def logits(self, target, blocks: torch.Tensor) -> torch.Tensor:
        """blocks [k, ..., H] (forward's output) -> logits [k, ..., V] over the target's vocabulary, -inf
        outside the draft vocabulary (what vLLM's compute_logits does with a token map)."""
        out = torch.stack([self.draft_logits(target, k, x) for k, x in enumerate(blocks)])
        if not self.reduced:
            return out
        full = out.new_full((*out.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.scatter(-1, self.draft_ids().to(out.device).expand_as(out), out)

    # ---- files (transformers' names) ----------------------------------------------------------------
    def save_pretrained(self, folder: str | Path) -> None:
        """config.json + model.safetensors, each written atomically (the shared LM head is not stored)."""
        save_head_files(self, folder, "medusa")

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> MedusaHeads:
        """Our folder, strict (names, shapes, finite values, a valid token map), checked against `target`
        when given (runtime/heads/head_folder.py). vLLM's and FasterDecoding's layouts:
        runtime/medusa_layout.load_medusa."""
        config, tensors = read_head_folder(folder, "medusa", MedusaConfig)
        return build_heads(config.validate(), tensors, target, target_hint(config))


def target_hint(config: MedusaConfig) -> str:
    """What a mismatch error suggests: the co-trained target's folder for Medusa-2 heads."""
    if config.cotrained:
        return f"pass --target {config.target}: Medusa-2 heads, co-trained with that target"
    return f"the target it was trained with ({config.target})"


def config_from_dict(raw: dict, where: str) -> MedusaConfig:
    check_head_type(raw, "medusa")
    return config_from(raw, MedusaConfig, where).validate()


def build_heads(config: MedusaConfig, tensors: dict[str, torch.Tensor], target, hint: str) -> MedusaHeads:
    """Heads from a config and their tensors (our names), strict; checked against `target` if given."""
    if target is not None:
        check_matches_target(config, target, hint)
    return fill_strict(MedusaHeads(config), tensors, "Medusa", config.out_vocab)


def check_matches_target(config: MedusaConfig, target, hint: str) -> None:
    """The heads read the target's own hidden states (and, shared, its LM head): only the target they
    were trained with will do."""
    checks = [
        ("vocab_size", config.vocab_size, target.vocab_size),
        ("hidden_size", config.hidden_size, target.hidden_size),
        ("num_target_layers", config.num_target_layers, target.num_layers),
        ("tokenizer_hash", config.tokenizer_hash, tokenizer_hash(target.tokenizer)),
        ("target_weights_hash", config.target_weights_hash, target.weights_hash()),
    ]
    for name, got, expected in checks:
        if got != expected:
            raise BadInputError(f"medusa head {name}", got, f"{expected} of the target {target.name}", hint)


def count_parameters(heads: MedusaHeads, target) -> tuple[int, int]:
    """(parameters the heads own, parameters one drafting forward reads, the shared LM head included)."""
    own = sum(p.numel() for p in heads.parameters())
    shared = target.model.lm_head.weight.numel() if heads.config.original_lm_head else 0
    return own, own + shared


def with_accuracies(heads: MedusaHeads, accuracies: list[list[float]]) -> MedusaHeads:
    """The same heads with calibration accuracies [K][topk] recorded (the sparse tree reads them)."""
    out = MedusaHeads(replace(heads.config, accuracies=[[float(a) for a in row] for row in accuracies]))
    out.load_state_dict(heads.state_dict())
    return out.to(heads.d2t.device).eval()


# ---- calibration (the sparse tree's accuracies) -------------------------------------------------------
def rank_hits(draft_logits: torch.Tensor, ids: torch.Tensor, truth: torch.Tensor, topk: int) -> torch.Tensor:
    """draft_logits [n, Vd] of one head, ids [Vd] their target ids, truth [n] the target's token ->
    [topk] how often the rank-i token is the truth (ranks past the vocabulary never hit)."""
    k = min(topk, draft_logits.shape[-1])
    top = ids[torch.topk(draft_logits, k, dim=-1).indices]  # [n, k] target ids by rank
    hits = (top == truth[:, None]).sum(0).double()
    return torch.cat([hits, hits.new_zeros(topk - k)])


@torch.inference_mode()
def calibrate(heads: MedusaHeads, target, sequences: list[list[int]], topk: int = 10) -> list[list[float]]:
    """accuracies[k][i]: how often head k's rank-i token equals the target's greedy token t+k+2 (its
    argmax at t+k+1, what a greedy verifier accepts), over every position of `sequences`."""
    count = heads.config.num_heads
    hits = torch.zeros(count, topk, dtype=torch.float64)
    seen = torch.zeros(count, dtype=torch.float64)
    ids = heads.draft_ids()
    for seq in sequences:
        tokens = torch.tensor([seq], device=target.device)
        h = target.decoder(input_ids=tokens).last_hidden_state[0]  # [T, H] after the final norm
        truth = target.lm_head(h).argmax(-1)  # [T]: the target's token t+1 after each position t
        blocks = heads(h)  # [K, T, H]
        for k in range(count):
            n = len(seq) - k - 1  # positions t with a truth at t+k+1
            if n <= 0:
                continue
            logits = heads.draft_logits(target, k, blocks[k, :n])  # [n, Vd]
            hits[k] += rank_hits(logits, ids.to(logits.device), truth[k + 1 :].to(logits.device), topk).cpu()
            seen[k] += n
    return (hits / seen.clamp(min=1)[:, None]).tolist()
