"""The parts of a target that offline training reads, loaded without its decoder layers.

    parts = TargetParts.load("path/to/Llama-3.3-70B", device="cuda:0")   # embed_tokens, norm, lm_head
    logits = parts.logits(last_hidden)             # [B, T, V] float32, as Target.logits computes it
    parts.weights_hash()                           # artifacts.weights_hash of the whole target
    parts.layer_state(parts.num_layers - 1)        # one decoder layer's tensors (MTP init), not kept

Offline batches (`data capture` shards) need only the embedding, the final norm and the LM head (the
embedding itself when `tie_word_embeddings`), the config and the tokenizer: for Llama-3.3-70B in bf16
about 4.2 GB of 141 GB. They are read through the safetensors index (`model.safetensors.index.json`'s
weight_map, or one `model.safetensors`), opening only the files that hold them, into the module classes
transformers builds for them (nn.Embedding or the family's scaled embedding, its RMSNorm, nn.Linear;
runtime/core/families.py) under the checkpoint's names (`model.embed_tokens.weight`, `model.norm.weight`,
`lm_head.weight`; a vision-language checkpoint's `language_model.model.*`), cast as `Target.load`
casts, so every number equals the whole target's. `weights_hash` and `layer_state` read their tensors
when called and keep none. What needs the decoder layers (`forward`, `new_cache`: a capture) raises
`PartsOnlyError` (the trainer then loads the whole target for the capture alone).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from draftsmith.runtime.core.artifacts import weights_hash_names, weights_hash_of_tensors
from draftsmith.runtime.core.checkpoint_index import INDEX_FILE, SINGLE_FILE, Checkpoint  # noqa: F401 (re-exported)
from draftsmith.runtime.core.families import family_of
from draftsmith.runtime.core.target import TargetPieces, pick_device, pick_dtype
from draftsmith.runtime.core.targets import resolve_target
from draftsmith.runtime.errors import BadInputError, DraftsmithError

log = logging.getLogger(__name__)

EMBED, NORM, LM_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"  # a Llama's names


class PartsOnlyError(DraftsmithError):
    """A call that needs the target's decoder layers, on a TargetParts (which holds none of them)."""


def part_names(config) -> list[str]:
    """The checkpoint tensors offline training reads: embedding, final norm, LM head unless tied, under
    the family's checkpoint names (a vision-language checkpoint nests them: families.py)."""
    prefix = family_of(config).checkpoint_prefix
    names = [f"{prefix}embed_tokens.weight", f"{prefix}norm.weight"]
    return names if getattr(config, "tie_word_embeddings", False) else [*names, LM_HEAD]


def frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def parts_module(config, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """An nn.Module holding only the parts, at transformers' paths (`model.embed_tokens`, `model.norm`,
    `lm_head`), built from the classes transformers builds them from: the family's RMSNorm, and its
    scaled embedding where it has one (Gemma multiplies by sqrt(hidden) inside the embedding's forward)."""
    family = family_of(config)
    text = family.text(config)
    embed_name, norm_name = part_names(config)[:2]
    weight = tensors[embed_name]  # [V, H]
    root, decoder = nn.Module(), nn.Module()
    root.model = decoder  # first, as in transformers: a tied weight is named model.embed_tokens.weight
    scaled = family.embedding_class()
    if scaled is None:
        decoder.embed_tokens = nn.Embedding.from_pretrained(weight, freeze=True)
    else:  # the family's own class and scale (Gemma2Model.__init__: embed_scale = hidden_size**0.5)
        with torch.device("meta"):
            decoder.embed_tokens = scaled(*weight.shape, text.pad_token_id, embed_scale=text.hidden_size**0.5)
        decoder.embed_tokens.embed_scale = torch.tensor(text.hidden_size**0.5, device=weight.device)
        decoder.embed_tokens.weight = frozen(weight)
    decoder.norm = family.rmsnorm_class()(text.hidden_size, eps=text.rms_norm_eps)
    decoder.norm.weight = frozen(tensors[norm_name])
    with torch.device("meta"):  # no random init of a [V, H] matrix only to replace it
        root.lm_head = nn.Linear(text.hidden_size, weight.shape[0], bias=False)
    root.lm_head.weight = decoder.embed_tokens.weight if LM_HEAD not in tensors else frozen(tensors[LM_HEAD])
    return root.eval()


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.2f} MB"


class TargetParts(TargetPieces):
    """What offline training calls on a target (runtime/core/target.py's names), from its parts alone."""

    def __init__(
        self,
        config,
        tokenizer,
        name: str,
        checkpoint: Checkpoint,
        tensors: dict[str, torch.Tensor],  # HF name -> the part, in the target's dtype and device
        read_bytes: int = 0,  # what reading them took from disk (for the log)
    ):
        self.family = family_of(config)  # exit 2 naming the supported families
        self.family.check(config)
        self.model_config = config  # the checkpoint's (a vision-language one nests the text config)
        self.config, self.tokenizer, self.name = self.family.text(config), tokenizer, name
        self.softcap = self.family.softcap(config)
        self.checkpoint = checkpoint
        self.path = str(checkpoint.folder)
        self.model = parts_module(config, tensors)
        self.decoder = self.model.model  # embed_tokens, norm (no layers, no rotary_emb)
        self.read_files = sorted({checkpoint.weight_map[n] for n in tensors})
        self.read_bytes = read_bytes
        self._weights_hash: str | None = None

    @classmethod
    def load(cls, spec: str = "smollm2-135m", device: str = "auto", dtype: str = "auto") -> TargetParts:
        from transformers import AutoConfig, AutoTokenizer

        resolved = resolve_target(spec)  # a GGUF is converted once to a safetensors folder: read that
        dev = pick_device(device)
        torch_dtype = pick_dtype(dtype, dev)
        config = AutoConfig.from_pretrained(resolved.path)
        checkpoint = Checkpoint.open(resolved.path)
        stored = checkpoint.read(part_names(config))
        tensors = {n: t.to(dev, torch_dtype) for n, t in stored.items()}  # Target.load's cast
        tokenizer = AutoTokenizer.from_pretrained(resolved.path)
        read = sum(t.numel() * t.element_size() for t in stored.values())
        return cls(config, tokenizer, resolved.name, checkpoint, tensors, read)

    def description(self) -> str:
        """Which parts were read and how much of the checkpoint that is (for the log)."""
        names = [n.split(".")[-2] for n in part_names(self.model_config)]
        tied = "" if LM_HEAD in part_names(self.model_config) else "; lm_head tied to embed_tokens"
        c = self.checkpoint
        return (
            f"loaded {len(names)} of {len(c.weight_map)} target tensors ({', '.join(names)}{tied}) from "
            f"{len(self.read_files)} of {len(c.files)} file(s), {gigabytes(self.read_bytes)} of "
            f"{gigabytes(c.total_bytes())}"
        )

    # ---- read when asked, never kept ------------------------------------------------------------------
    def _read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Tensors as the whole target holds them: floats cast to its dtype, on its device."""
        tensors = self.checkpoint.read(names)
        log.info(
            "target parts: read %d more tensor(s) (%s), not kept",
            len(tensors),
            gigabytes(sum(t.numel() * t.element_size() for t in tensors.values())),
        )
        fp32 = self.family.keep_in_fp32()  # as transformers loads them: DeepSeek-V3's router stays fp32
        return {
            n: t.to(self.device, torch.float32 if kept(n, fp32) else self.dtype)
            if t.is_floating_point()
            else t
            for n, t in tensors.items()
        }

    def weights_hash(self) -> str:
        """artifacts.weights_hash of the whole target, from the tensors it hashes (read once, in the
        target's dtype, so it equals the loaded target's in every dtype)."""
        if self._weights_hash is None:
            tensors = self._read(weights_hash_names(self.num_layers, self.model_config))
            self._weights_hash = weights_hash_of_tensors(tensors, self.num_layers, self.model_config)
        return self._weights_hash

    def layer_state(self, index: int) -> dict[str, torch.Tensor]:
        """Decoder layer `index`'s tensors under the layer's own names (`self_attn.q_proj.weight`, ...):
        what `Target.layer_state` returns (MTP blocks start as a copy of the last layer). An MoE family's
        checkpoint stores each expert apart (`mlp.experts.0.gate_proj.weight`; Mixtral's under
        `block_sparse_moe.experts.0.w1`) where transformers' module holds them fused
        (`mlp.experts.gate_up_proj` [E, 2 I, H]): those are read as the TP loader reads them."""
        prefix = f"{self.family.checkpoint_prefix}layers.{index % self.num_layers}."
        # old checkpoints also store each layer's rotary inv_freq, which transformers drops on load
        names = [n for n in self.checkpoint.weight_map if n.startswith(prefix) and "rotary_emb" not in n]
        if not names:
            raise BadInputError(
                "--target",
                f"{self.checkpoint.folder / self.checkpoint.source} without {prefix}*",
                "its tensors",
            )
        if self.family.moe:
            from draftsmith.runtime.core.placement_moe import whole_layer_state

            with torch.device("meta"):  # the module's names and expert count only, no memory
                layer = self.family.layer_class()(self.config, index % self.num_layers)
            return whole_layer_state(self, index, layer)
        return {n.removeprefix(prefix): t for n, t in self._read(names).items()}

    # ---- what needs the decoder layers -----------------------------------------------------------------
    def _refuse(self, what: str):
        raise PartsOnlyError(
            f"{what} runs the target's decoder layers, and only its embedding, final norm and LM head are"
            f" loaded ({self.name}, offline training): load the whole target (Target.load)"
        )

    def new_cache(self, *args, **kwargs):
        self._refuse("a KV cache")

    def forward(self, *args, **kwargs):
        self._refuse("a forward")

    def run_layers(self, *args, **kwargs):
        self._refuse("a forward")


def kept(name: str, patterns: tuple[str, ...]) -> bool:
    """`name` ends in one of transformers' keep-in-fp32 module patterns (`...mlp.gate.weight`)."""
    return any(f".{name}".endswith(f".{p}") or f".{p}." in f".{name}." for p in patterns)
