"""Multi-token prediction (MTP) modules, DeepSeek-V3 style (arXiv:2412.19437 section 2.2).

    config = MtpConfig.for_target(target, num_modules=1)
    head = MtpHead(config)
    h1 = head(0, target.embed(ids_shifted_by_1), head.target_feature(target, last_hidden), positions)
    logits = head.logits(target, 0, h1)                # [B, T, V] through the target's own LM head

Module m (0-based; DeepSeek's depth k = m + 1) at position t reads the embedding of token t+m+1 and the
hidden state h_m[t] of the previous depth (h_0 = the target's last hidden state after its final norm, as
vLLM and SGLang hand it to DeepSeek's MTP layer), and predicts token t+m+2:

    x = eh_proj([enorm(embed(x[t+m+1])); hnorm(h_m[t])])     # 2H -> H
    h_{m+1}[t] = DecoderLayer(x)                             # one Llama block (the target's own class)
    logits = target.lm_head(shared_head.norm(h_{m+1}[t]))    # the target's LM head, shared

The embedding and LM head are the target's (never copied; `logits` and the callers take the target).
Module m >= 1 attends to positions s <= t - m and to itself: the draft runtime runs module m at the
root's position while its cache holds only positions whose input token is committed (t + m + 1 <= n),
so training uses that very mask (`module_mask`) and drafting matches it exactly.

Tensor names follow DeepSeek-V3's `model.layers.{L+m}.*` with the prefix `layers.{m}.`: `enorm`,
`hnorm`, `eh_proj`, `input_layernorm`, `self_attn.{q,k,v,o}_proj`, `post_attention_layernorm`,
`mlp.{gate,up,down}_proj`, `shared_head.norm` (DeepSeek's `embed_tokens` and `shared_head.head` are the
target's and are not stored).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from draftsmith.runtime.artifacts import check_tensors, save_head_files, tokenizer_hash, weights_hash
from draftsmith.runtime.eagle3 import LAYER_KEYS
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.kv_cache import KVCache
from draftsmith.runtime.masks import attention_mask

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
MAX_MODULES = 4
FEATURES = ("final_norm", "pre_norm")


@dataclass
class MtpConfig:
    target: str
    vocab_size: int
    num_modules: int  # depth M: module m predicts token t+m+2
    tokenizer_hash: str
    target_weights_hash: str  # artifacts.weights_hash of the target the modules were trained with
    num_target_layers: int
    layer: dict = field(default_factory=dict)  # Llama fields of each module's block (eagle3.LAYER_KEYS)
    head_type: str = "mtp"
    cotrained: bool = False  # the target trained too: it ships in `target/` next to the modules
    # h_0, the target state module 0 reads: "final_norm" = after the target's final norm (what vLLM and
    # SGLang hand DeepSeek's MTP layer), or "pre_norm" = the residual stream before it (what vLLM's
    # MiMo model returns, so `export --format mtp-mimo` is exact only for such modules).
    feature: str = "final_norm"
    # Zero the token embedding at position 0, as vLLM's MTP layers do (deepseek_mtp.py, mimo_mtp.py).
    mask_first_position: bool = False

    @classmethod
    def for_target(cls, target, num_modules: int = 1, cotrained: bool = False, **options) -> MtpConfig:
        cfg = target.config.to_dict()
        layer = {k: cfg[k] for k in LAYER_KEYS if cfg.get(k) is not None}
        layer.setdefault("head_dim", target.hidden_size // cfg["num_attention_heads"])
        return cls(
            target=target.name,
            vocab_size=target.vocab_size,
            num_modules=num_modules,
            tokenizer_hash=tokenizer_hash(target.tokenizer),
            target_weights_hash=weights_hash(target.model),
            num_target_layers=target.num_layers,
            layer=layer,
            cotrained=cotrained,
            **options,
        ).validate()

    @property
    def hidden_size(self) -> int:
        return self.layer["hidden_size"]

    def validate(self) -> MtpConfig:
        m = self.num_modules
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_MODULES:
            raise BadInputError("num_modules", m, f"an integer in [1, {MAX_MODULES}]")
        missing = [
            k for k in ("hidden_size", "intermediate_size", "num_attention_heads") if k not in self.layer
        ]
        if missing:
            raise BadInputError("layer", sorted(self.layer), f"the Llama fields {missing} too")
        if self.feature not in FEATURES:
            raise BadInputError("feature", self.feature, f"one of {', '.join(FEATURES)}")
        return self

    def llama_config(self) -> LlamaConfig:
        llama = LlamaConfig(**self.layer, num_hidden_layers=1, vocab_size=self.vocab_size)
        llama._attn_implementation = "sdpa"  # boolean masks (tree and module masks) need SDPA, not eager
        return llama


class SharedHead(nn.Module):
    """DeepSeek's `shared_head`: its own RMSNorm; the LM head itself is the target's."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.norm = LlamaRMSNorm(hidden, eps)


class MtpLayer(LlamaDecoderLayer):
    """One MTP module: the target family's decoder block plus DeepSeek's input projection and norms."""

    def __init__(self, llama: LlamaConfig):
        super().__init__(llama, layer_idx=0)  # each module owns a one-layer cache
        hidden, eps = llama.hidden_size, llama.rms_norm_eps
        self.enorm = LlamaRMSNorm(hidden, eps)
        self.hnorm = LlamaRMSNorm(hidden, eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.shared_head = SharedHead(hidden, eps)


def module_mask(length: int, module: int, device=None) -> torch.Tensor | None:
    """[T, T] bool for module m: position t sees s <= t - m and itself (None = plain causal, m = 0)."""
    if module == 0:
        return None
    ones = torch.ones(length, length, dtype=torch.bool, device=device)
    return ones.tril(-module) | torch.eye(length, dtype=torch.bool, device=device)


class MtpHead(nn.Module):
    def __init__(self, cfg: MtpConfig):
        super().__init__()
        self.config = cfg.validate()
        llama = cfg.llama_config()
        self.layers = nn.ModuleList(MtpLayer(llama) for _ in range(cfg.num_modules))
        self.rotary = LlamaRotaryEmbedding(llama)
        params = inspect.signature(LlamaDecoderLayer.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def target_feature(self, target, last_hidden: torch.Tensor) -> torch.Tensor:
        """h_0 from the target's last decoder output [.., H] (pre-norm): after its final norm, or as it
        is (`config.feature`)."""
        return last_hidden if self.config.feature == "pre_norm" else target.final_norm(last_hidden)

    def init_from_target(self, target) -> None:
        """Start each block as a copy of the target's last decoder layer and each shared_head norm as its
        final norm (the modules then begin close to 'one more target layer'); eh_proj stays random."""
        last = target.decoder.layers[-1].state_dict()
        with torch.no_grad():
            for layer in self.layers:
                layer.load_state_dict(last, strict=False)
                layer.shared_head.norm.weight.copy_(target.decoder.norm.weight)

    def new_cache(self, batch: int, capacity: int, cache_class: type[KVCache] = KVCache) -> KVCache:
        attn, weight = self.layers[0].self_attn, self.layers[0].eh_proj.weight
        kv_heads = self.config.layer.get("num_key_value_heads", self.config.layer["num_attention_heads"])
        return cache_class(1, batch, kv_heads, attn.head_dim, capacity, weight.dtype, weight.device)

    def forward(
        self,
        module: int,
        embeds: torch.Tensor,  # [B, T, H] the target's embedding of tokens t+m+1
        feature: torch.Tensor,  # [B, T, H] h_m[t]: target_feature (m = 0) or module m-1's output
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None = None,
        token_valid: torch.Tensor | None = None,  # [B, T]
        tree_mask: torch.Tensor | None = None,  # [B?, T, W] over the last W cache slots (masks.py)
        mask: torch.Tensor | None = None,  # without a cache: [T, T] bool (module_mask) or None = causal
    ) -> torch.Tensor:
        """-> h_{m+1} [B, T, H] (pre-norm: the next module's feature; `logits` gives predictions)."""
        if cache is not None:
            batch, new = embeds.shape[:2]
            if token_valid is None:
                token_valid = torch.ones(batch, new, dtype=torch.bool, device=embeds.device)
            cache.reserve(new, token_valid)
            mask = attention_mask(cache.valid[:, : cache.length + new], new, tree_mask)  # [B, 1, T, S]
        elif mask is not None:
            mask = mask[None, None]
        h = self.run_module(module, embeds, feature, position_ids, cache, mask)
        if cache is not None:
            cache.commit()
        return h

    def run_module(
        self,
        module: int,
        embeds: torch.Tensor,  # [B, T, H]
        feature: torch.Tensor,  # [B, T, H]
        position_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None,
        mask: torch.Tensor | None,  # [B?, 1, T, S] True = may attend, or None = causal
    ) -> torch.Tensor:
        """Module m on a prepared mask -> [B, T, H] (the static draft path calls this directly)."""
        layer = self.layers[module]
        if self.config.mask_first_position:
            embeds = embeds.masked_fill(position_ids[..., None] == 0, 0.0)
        x = layer.eh_proj(torch.cat([layer.enorm(embeds), layer.hnorm(feature)], dim=-1))  # [B, T, H]
        rope = self.rotary(x, position_ids=position_ids)
        h = layer(
            x,
            attention_mask=mask,
            position_ids=position_ids,
            position_embeddings=rope,
            **{self._cache_kwarg: cache},
        )
        return h[0] if isinstance(h, tuple) else h  # older transformers return (hidden, ...)

    def logits(self, target, module: int, h: torch.Tensor) -> torch.Tensor:
        """Module m's output [.., H] -> logits [.., V] in float32, through the target's LM head."""
        return target.lm_head(self.layers[module].shared_head.norm(h)).float()


# ---- files --------------------------------------------------------------------------------------------
def save_head(head: MtpHead, folder: str | Path) -> None:
    save_head_files(head, folder, "mtp")


def read_folder(folder: str | Path) -> tuple[MtpConfig, dict[str, torch.Tensor]]:
    """Our folder (config.json + model.safetensors), or a model folder with the modules inside it in
    DeepSeek's or MiMo's layout (runtime/mtp_layout.py) -> (config, our module tensors)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file() or not any(folder.glob("*.safetensors")):
        raise BadInputError("mtp head", str(folder), f"a folder with {CONFIG_FILE} and *.safetensors")
    raw = json.loads((folder / CONFIG_FILE).read_text())
    if "num_nextn_predict_layers" in raw:
        from draftsmith.runtime.mtp_layout import from_deepseek, from_mimo

        files = {}
        for file in sorted(folder.glob("*.safetensors")):
            files.update(load_file(str(file)))
        if "MiMoForCausalLM" in (raw.get("architectures") or ()):
            return from_mimo(raw, files)
        return from_deepseek(raw, files)[:2]
    if raw.get("head_type") != "mtp":
        raise BadInputError("head_type", raw.get("head_type"), "mtp")
    try:
        config = MtpConfig(**raw).validate()
    except TypeError as err:
        raise BadInputError(
            f"{folder / CONFIG_FILE}", sorted(raw), "the MtpConfig fields", str(err)
        ) from None
    return config, load_file(str(folder / WEIGHTS_FILE))


def load_head(folder: str | Path, target=None) -> MtpHead:
    """Strict load (names, shapes, finite values), checked against `target` when given."""
    config, tensors = read_folder(folder)
    if target is not None:
        check_head_matches_target(config, target, folder)
    head = MtpHead(config)
    expected = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    check_tensors(expected, tensors, "MTP")
    head.load_state_dict(tensors, strict=False)
    return head.eval()


def check_head_matches_target(config: MtpConfig, target, folder) -> None:
    """The modules read the target's own hidden states: only the target they were trained with will do."""
    checks = [
        ("vocab_size", config.vocab_size, target.vocab_size),
        ("hidden_size", config.hidden_size, target.hidden_size),
        ("num_target_layers", config.num_target_layers, target.num_layers),
        ("tokenizer_hash", config.tokenizer_hash, tokenizer_hash(target.tokenizer)),
        ("target_weights_hash", config.target_weights_hash, weights_hash(target.model)),
    ]
    hint = (
        f"pass --target {Path(folder) / 'target'} (this head was co-trained with its own target)"
        if config.cotrained
        else f"the target it was trained with ({config.target}, same weights)"
    )
    for name, got, expected in checks:
        if got != expected:
            raise BadInputError(f"mtp head {name}", got, f"{expected} of the target {target.name}", hint)
