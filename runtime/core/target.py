"""The target adapter: one object that exposes what drafting and verification need from a causal LM.

    target = Target.load("smollm2-135m")                        # or a folder, a Hub id, a .gguf
    ids = target.encode("What is 2+2?")                          # chat-templated prompt ids
    cache = target.new_cache(batch=1, capacity=256)
    out = target.forward(torch.tensor([ids]), cache, capture_layers=(1, 14, 27))
    logits = target.logits(out.hidden[:, -1])                    # [B, V]

`forward` drives the model's own decoder layers (no copied modeling code) over our KV cache, with
explicit position ids per token and an optional tree mask, so verification of a whole draft tree is one
call. `capture_layers` returns the hidden state after those decoder layers (0-based: layer i's output,
which is `hidden_states[i + 1]` in transformers' `output_hidden_states` tuple, except that transformers
applies the final norm to its last entry and we never do). `num_layers=N` runs only
the first N layers (self-speculation). What a family's own forward adds around its layers (Gemma's
embedding scale and logit soft-cap, per-layer sliding windows and rope, a vision-language model's nested
text decoder) comes from its entry in runtime/core/families.py, applied here and in layer_inputs.py.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import weights_hash, weights_hash_names, weights_hash_of_tensors
from draftsmith.runtime.core.block_fp8 import block_fp8_of, load_block_fp8_model, split_load_error
from draftsmith.runtime.core.chat_template import thinking_kwargs
from draftsmith.runtime.core.families import family_of, find_family
from draftsmith.runtime.core.forwarding import forwarded
from draftsmith.runtime.core.kv_cache import KVCache
from draftsmith.runtime.core.layer_inputs import layer_masks, layer_ropes, needs_mask
from draftsmith.runtime.core.masks import attention_mask, is_plain_causal
from draftsmith.runtime.core.mla import cache_dims
from draftsmith.runtime.core.targets import resolve_target
from draftsmith.runtime.errors import BadInputError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TargetOutput:
    hidden: torch.Tensor  # [B, T, H] output of the last layer run, before the final norm
    aux: dict[int, torch.Tensor] = field(default_factory=dict)  # layer id -> [B, T, H]


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise BadInputError("--device", device, "auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BadInputError("--device", device, "auto or cpu", "no CUDA device is available here")
    return dev


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise BadInputError("--dtype", dtype, f"one of {['auto', *DTYPES]}")
    return DTYPES[dtype]


def context_limit(config) -> int:
    """Longest sequence we serve: the trained context, capped by a sliding window that every layer has
    and we do not mask (Mistral, Qwen2); per-layer windows (Gemma) are masked (layer_inputs.py)."""
    family = find_family(config)
    if family is not None:
        config = family.text(config)  # a vision-language config nests the text model's
    limit = config.max_position_embeddings
    window = getattr(config, "sliding_window", None)
    per_layer = family is not None and family.windows == "per_layer"
    if window and getattr(config, "use_sliding_window", True) and not per_layer:
        limit = min(limit, window)
    return limit


class TargetPieces:
    """The shape facts and the pieces heads reuse (embedding, final norm, LM head), shared by the whole
    `Target` and offline training's `TargetParts` (runtime/core/target_parts.py). Needs `config` (the text
    model's), `model` (with `lm_head`), `decoder` (with `embed_tokens` and `norm`), `family`
    (runtime/core/families.py) and `softcap` (its final logit soft-cap, or None)."""

    device = forwarded("decoder.embed_tokens.weight.device")  # torch.device
    dtype = forwarded("decoder.embed_tokens.weight.dtype")  # torch.dtype
    num_layers = forwarded("config.num_hidden_layers")
    hidden_size = forwarded("config.hidden_size")

    @property
    def vocab_size(self) -> int:
        return self.decoder.embed_tokens.weight.shape[0]

    @property
    def max_context(self) -> int:
        return context_limit(self.config)

    # ---- pieces heads reuse ------------------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(input_ids)  # [B, T] -> [B, T, H]

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.norm(hidden)

    def lm_head(self, normed: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V]: the LM head, then the final soft-cap where the model's forward applies one
        (Gemma 2: c * tanh(logits / c), in that order), so verification, teachers and MTP heads all read
        the model's own logits."""
        logits = self.model.lm_head(normed)
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden [..., H] -> logits [..., V] in float32."""
        return self.lm_head(self.final_norm(hidden)).float()


class Target(TargetPieces):
    def __init__(self, model, tokenizer, name: str):
        self.family = family_of(model.config)  # exit 2 naming the supported families
        self.family.check(model.config)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.path: str | None = None  # the local folder it was loaded from (Target.load sets it)
        self.thinking: bool | None = None  # enable_thinking of prompts (core/chat_template.py)
        self.config = self.family.text(model.config)  # a vision-language target's text config
        self.decoder = model.get_submodule(self.family.decoder)  # embed_tokens, layers, norm, rotary_emb
        self.layer_types = self.family.layer_types(self.config)  # full or sliding attention, per layer
        self.softcap = self.family.softcap(self.config)
        # transformers renamed the layers' cache argument (past_key_values -> cache) during 5.x.
        params = inspect.signature(type(self.decoder.layers[0]).forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # split over a group (runtime/core/placement.py, tp or ep): this rank holds its shard of the layers,
        # the group's tp_size ranks run every forward together, the KV heads split over kv_split of them
        # (1 where attention is whole: ep with MLA); `driver` is set while this rank drives the others
        self.tp_size, self.kv_split, self.tp_group, self.driver = 1, 1, None, None
        # weight-only quantization (runtime/core/quantize.py): what runs, and the checkpoint's weights_hash
        self.quantization: str | None = None
        self.source_weights_hash: str | None = None
        # the static engine path's graphed forwards by shape (runtime/core/static_forward.py,
        # `static_session`): captured once per shape, like a server at start-up; dropped when the
        # attention function changes
        self.graph_sessions: dict = {}

    @classmethod
    def load(
        cls, spec: str = "smollm2-135m", device: str = "auto", dtype: str = "auto", layout=None
    ) -> Target:
        """`layout` (runtime/core/placement.py, inside a process group): with layout.tp > 1 this rank loads
        only its tensor-parallel shard of each layer (every rank of its group must load too)."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        resolved = resolve_target(spec)
        dev = pick_device(device)
        torch_dtype = pick_dtype(dtype, dev)
        tp = layout.tp if layout is not None else 1
        hf_logging.disable_progress_bar()  # loading a local safetensors folder takes seconds
        try:
            config = AutoConfig.from_pretrained(resolved.path)
            family = family_of(config, "--target")
            if tp > 1:
                if block_fp8_of(config) is not None:  # transformers would dequantize it, wrongly: convert
                    raise split_load_error(resolved.path)
                from draftsmith.runtime.core.placement import load_tensor_parallel

                model = load_tensor_parallel(resolved.path, config, layout, torch_dtype, dev)
            elif block_fp8_of(config) is not None:  # DeepSeek-V3/R1's FP8 as published: read dequantized
                from draftsmith.runtime.core.checkpoint_index import Checkpoint

                checkpoint = Checkpoint.open(resolved.path)
                model = load_block_fp8_model(checkpoint, config, torch_dtype, family.attention).to(dev)
            else:
                model = AutoModelForCausalLM.from_pretrained(
                    resolved.path, dtype=torch_dtype, attn_implementation=family.attention
                ).to(dev)
            tokenizer = AutoTokenizer.from_pretrained(resolved.path)
        finally:
            hf_logging.enable_progress_bar()
        target = cls(model, tokenizer, resolved.name)
        target.path = str(resolved.path)
        if tp > 1:
            target.tp_size, target.tp_group = tp, model._device_mesh["tp"].get_group()
            target.kv_split = layout.kv_split
        return target

    # ---- shape facts (TargetPieces has the ones parts-only targets share) -------------------------------
    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.eos_token_ids[0]

    # ---- text ----------------------------------------------------------------------------------------
    def encode(self, text: str, chat: bool = True) -> list[int]:
        """Prompt ids: chat-templated (one user turn + the assistant header) unless chat=False."""
        if chat and self.tokenizer.chat_template:
            return self.encode_chat([{"role": "user", "content": text}])
        return self.tokenizer(text)["input_ids"]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """A conversation ({"role", "content"} dicts, ending with a user turn) + the assistant header."""
        if not self.tokenizer.chat_template:
            raise BadInputError("target chat template", None, "a tokenizer with a chat template (multi-turn)")
        kwargs = thinking_kwargs(self.thinking)  # the mode use_thinking set (runtime/core/chat_template.py)
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- pieces heads reuse ------------------------------------------------------------------------
    def layer_state(self, index: int) -> dict[str, torch.Tensor]:
        """Decoder layer `index`'s tensors under the layer's own names (MTP blocks start as a copy)."""
        if self.tp_size > 1:  # this rank holds shards of them: read the whole ones from the checkpoint
            from draftsmith.runtime.core.placement_moe import whole_layer_state

            return whole_layer_state(self, index)  # MoE: the checkpoint's experts, fused
        return self.decoder.layers[index].state_dict()

    def weights_hash(self) -> str:
        """artifacts.weights_hash of these weights (what an MTP head records; TargetParts gives the same).
        A quantized target answers its checkpoint's: heads bind to the weights they were trained with."""
        if self.source_weights_hash is not None:
            return self.source_weights_hash
        if self.tp_size > 1:
            names = weights_hash_names(self.num_layers, self.model.config)
            return weights_hash_of_tensors(self._read(names), self.num_layers, self.model.config)
        return weights_hash(self.model)

    def _read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Whole tensors of a tensor-parallel target from its checkpoint, cast as loading casts them."""
        from draftsmith.runtime.core.checkpoint_index import Checkpoint

        tensors = Checkpoint.open(Path(self.path)).read(names)
        return {n: t.to(self.device, self.dtype) if t.is_floating_point() else t for n, t in tensors.items()}

    def new_cache(
        self, batch: int, capacity: int, num_layers: int | None = None, cache_class: type = KVCache
    ) -> KVCache:
        """A cache shaped for this target (`cache_class`: KVCache, or StaticKVCache for the graphed path)."""
        # tensor parallel: this rank's heads only; MLA: one latent and one rope key (runtime/core/mla.py)
        heads, key_dim, value_dim = cache_dims(self.config, self.kv_split, self.decoder.layers[0].self_attn)
        layers = num_layers or self.num_layers
        cache = cache_class(layers, batch, heads, key_dim, capacity, self.dtype, self.device, value_dim)
        if self.driver is not None:  # the TP group's other ranks make the same cache (placement.follow)
            self.driver.mirror(cache, (batch, capacity, num_layers, cache_class))  # its changes and end too
        return cache

    # ---- the forward -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        cache: KVCache,
        position_ids: torch.Tensor | None = None,  # [B, T]; default: continue after the cache
        token_valid: torch.Tensor | None = None,  # [B, T] bool; False = padding
        tree_mask: torch.Tensor | None = None,  # [B?, T, W] bool over the last W >= T slots (masks.py)
        num_layers: int | None = None,
        capture_layers: tuple[int, ...] = (),
    ) -> TargetOutput:
        if self.driver is not None:  # the TP group's other ranks run this forward with us
            options = dict(position_ids=position_ids, token_valid=token_valid, tree_mask=tree_mask)
            options.update(num_layers=num_layers, capture_layers=capture_layers)
            self.driver.send("forward", id(cache), cache.length, (input_ids,), options)
        batch, new = input_ids.shape
        num_layers = num_layers or self.num_layers
        if any(not 0 <= i < num_layers for i in capture_layers):
            raise BadInputError("capture_layers", capture_layers, f"layer ids in [0, {num_layers})")
        dense = token_valid is None
        if token_valid is None:
            token_valid = torch.ones(batch, new, dtype=torch.bool, device=input_ids.device)
        if position_ids is None:
            past = cache.valid[:, : cache.length].sum(dim=1, keepdim=True)  # [B, 1]
            position_ids = past + torch.arange(new, device=input_ids.device)
        cache.reserve(new, token_valid, dense)
        valid = cache.valid[:, : cache.length + new]  # [B, S]
        plain = is_plain_causal(valid.shape[1], new, tree_mask, cache.holes) and not needs_mask(
            self.family, self.config, valid.shape[1]
        )
        mask = None if plain else attention_mask(valid, new, tree_mask)
        hidden, aux = self.run_layers(input_ids, position_ids, mask, cache, num_layers, capture_layers)
        cache.commit()
        return TargetOutput(hidden=hidden, aux=aux)

    def run_layers(
        self,
        input_ids: torch.Tensor,  # [B, T]
        position_ids: torch.Tensor,  # [B, T]
        mask: torch.Tensor | None,  # [B, 1, T, S] bool, or None for SDPA's own causal mask
        cache,  # writes K/V through cache.update (KVCache, or StaticKVCache for the graphed path)
        num_layers: int,
        capture_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Embedding, rotary and the first `num_layers` decoder layers -> (hidden [B, T, H], aux). Each
        layer gets the mask and rotary embedding of its type (layer_inputs.py: sliding windows, Gemma 3's
        local rope, eager attention's additive masks); an MoE layer's router logits are not kept."""
        hidden = self.embed(input_ids)
        ropes = layer_ropes(self.family, self.config, self.decoder.rotary_emb, hidden, position_ids)
        masks = layer_masks(self.family, self.config, mask, hidden.dtype)  # {layer type: mask}
        aux = {}
        for i, layer in enumerate(self.decoder.layers[:num_layers]):
            kind = self.layer_types[i]
            hidden = layer(
                hidden,
                attention_mask=masks[kind],
                position_ids=position_ids,
                position_embeddings=ropes[kind],
                **{self._cache_kwarg: cache},
            )
            if isinstance(hidden, tuple):  # older transformers return (hidden, ...)
                hidden = hidden[0]
            if i in capture_layers:
                aux[i] = hidden
        return hidden, aux
