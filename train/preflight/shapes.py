"""What the memory preflight knows of a target without its weights: its config.json, and exact parameter
bytes from a meta-device model (train/preflight/estimate.py estimates the rest).

    config, name = read_target_config("meta-llama/Llama-3.3-70B-Instruct")   # configs/targets/, no network
    shapes = TargetShapes.load("path/to/model_or_config.json", torch.bfloat16)
    head_parameters(shapes, knobs)     # the head the trainer would build, counted on the meta device
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftsmith.runtime.core.families import family_of
from draftsmith.runtime.core.forwarding import forwarded
from draftsmith.runtime.errors import BadInputError
from draftsmith.train.preflight.families import TargetArch, meta_model

if TYPE_CHECKING:
    from draftsmith.train.preflight.estimate import Knobs

HUB_ID = r"[A-Za-z0-9][\w.-]*/[\w.-]+"  # owner/name, as runtime/core/targets.py reads a Hub id


def shipped_targets() -> dict[str, Path]:
    """Hub id -> the config.json copy shipped under configs/targets/ (the file name spells / as --)."""
    folder = Path(str(files("draftsmith.configs") / "targets"))
    return {p.stem.replace("--", "/"): p for p in sorted(folder.glob("*.json"))}


def read_target_config(spec: str, resolve: bool = False):
    """A target spec -> (its transformers config, its name), reading no weights: a config.json file, a
    model folder (its config.json), a Hub id shipped under configs/targets/ (else its config.json from
    the Hub cache or the Hub), or a GGUF / alias (its metadata). `resolve`: a local target or an alias
    as a training run finds it next anyway (runtime/core/targets.py resolve_target: the same checks and
    errors, a GGUF converted once); a Hub id still by its config.json (its weights download after)."""
    from transformers import AutoConfig

    from draftsmith.runtime.core.targets import ALIASES, check_gguf, embedded_gguf_path, resolve_target

    path, name = Path(spec).expanduser(), spec
    gguf = spec in ALIASES or (path.is_file() and path.suffix == ".gguf")
    hub_id = not path.exists() and re.fullmatch(HUB_ID, spec) and not spec.startswith((".", "/", "~"))
    if resolve and not hub_id:
        resolved = resolve_target(spec)
        source, name = resolved.path / "config.json", resolved.name
    elif gguf:
        file = embedded_gguf_path(ALIASES[spec]) if spec in ALIASES else path
        check_gguf(file)
        config = AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
        name = ALIASES[spec].hub_name if spec in ALIASES else spec
        return _checked(config, spec), name
    elif path.is_dir() or path.is_file():
        source = path / "config.json" if path.is_dir() else path
    elif spec in shipped_targets():
        source = shipped_targets()[spec]
    elif hub_id:
        source = _hub_config(spec)
    else:
        raise BadInputError(
            "target", spec, "a config.json, a model folder, a .gguf, an alias or a Hub id", "no such path"
        )
    if not source.is_file():
        raise BadInputError("target", spec, "a model folder with a config.json")
    from draftsmith.runtime.errors import read_json

    read_json(source, "target")  # malformed JSON is refused naming the file
    return _checked(AutoConfig.from_pretrained(str(source)), spec), name


def _hub_config(repo_id: str) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, "config.json"))
    except Exception as err:  # no network, a gated or unknown repo: a local config.json will do
        shipped = ", ".join(shipped_targets())
        raise BadInputError(
            "target",
            repo_id,
            f"a Hub id whose config.json can be fetched, a local config.json or a shipped one ({shipped})",
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
        ) from None


def _checked(config, spec):
    """The config of a supported family (runtime/core/families.py), else exit 2 naming the supported ones."""
    model_type = getattr(config, "model_type", None)
    family_of(config, "target", f"{spec} (model_type={model_type!r})")
    return config


# ---- the target and the head, on the meta device ---------------------------------------------------------
@dataclass(frozen=True)
class TargetShapes:
    """A target's sizes: exact parameter bytes from a meta-device model, and the dims the formulas read."""

    name: str
    config: object = field(repr=False)
    dtype_bytes: int  # the compute dtype the trainer loads it in (Target.load's `dtype`)
    params: int  # unique parameters (tied embeddings once)
    param_bytes: int
    buffer_bytes: int  # rotary tables
    part_bytes: int  # embedding + final norm + LM head: what offline training holds (TargetParts)
    embedding_params: int  # embedding + LM head parameters (frozen in co-training by default)
    # MoE / MLA layer shapes and TP shares (train/preflight/families.py); dense formulas when arch.dense
    arch: TargetArch | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, spec: str, dtype: torch.dtype, resolve: bool = False) -> TargetShapes:
        config, name = read_target_config(spec, resolve)
        return cls.from_config(config, name, dtype)

    @classmethod
    def from_config(cls, config, name: str, dtype: torch.dtype) -> TargetShapes:
        model = meta_model(config, name, dtype)
        params = list(model.parameters())  # shared (tied) tensors appear once
        family = family_of(config)
        decoder = model.get_submodule(family.decoder)  # a vision-language model nests its text decoder
        parts = {
            id(p): p for m in (decoder.embed_tokens, decoder.norm, model.lm_head) for p in m.parameters()
        }
        embeds = {id(p): p for m in (decoder.embed_tokens, model.lm_head) for p in m.parameters()}
        return cls(
            name=name,
            config=family.text(config),
            dtype_bytes=torch.empty((), dtype=dtype).element_size(),
            params=sum(p.numel() for p in params),
            param_bytes=sum(p.numel() * p.element_size() for p in params),
            buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
            part_bytes=sum(p.numel() * p.element_size() for p in parts.values()),
            embedding_params=sum(p.numel() for p in embeds.values()),
            arch=TargetArch.of(model, config),
        )

    # the dims the formulas read (properties, not dataclass fields: they carry no annotation)
    hidden = forwarded("config.hidden_size")
    intermediate = forwarded("config.intermediate_size")
    layers = forwarded("config.num_hidden_layers")
    vocab = forwarded("config.vocab_size")
    heads = forwarded("config.num_attention_heads")

    @property
    def kv_heads(self) -> int:
        return getattr(self.config, "num_key_value_heads", None) or self.heads

    @property
    def head_dim(self) -> int:
        return getattr(self.config, "head_dim", None) or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qk_norm(self) -> bool:  # Qwen3 and Gemma 3 normalize q and k per head (runtime/core/families.py)
        return family_of(self.config).qk_norm


class _ConfigOnly:
    """A target known by its config alone, as the heads' `for_target` read one: shapes and a name; no
    tokenizer or weights, so identity hashes come out empty (the head built from it only counts)."""

    class _NoVocab:
        bos_token_id = eos_token_id = pad_token_id = None

        def get_vocab(self) -> dict:
            return {}

    def __init__(self, shapes: TargetShapes):
        self.config, self.name = shapes.config, shapes.name
        self.num_layers, self.hidden_size, self.vocab_size = shapes.layers, shapes.hidden, shapes.vocab
        self.tokenizer = self._NoVocab()

    def weights_hash(self) -> str:
        return ""


def head_parameters(shapes: TargetShapes, knobs: Knobs) -> int:
    """The trainable parameters of the head the trainer would build, counted on a meta-device head."""
    from draftsmith.train.objectives.registry import objective

    target = _ConfigOnly(shapes)
    with torch.device("meta"):
        head = objective(knobs.head).new_head(
            target, knobs.aux_layers, knobs.draft_vocab, knobs.steps, knobs.cotrain is not None, knobs.options
        )
    return sum(p.numel() for p in head.parameters())


def lora_parameters(shapes: TargetShapes, rank: int, modules: tuple[str, ...]) -> int:
    """LoRA adapters (r x (in + out) per adapted Linear) on every decoder layer."""
    s = shapes
    sizes = {
        "q_proj": (s.hidden, s.q_width),
        "k_proj": (s.hidden, s.kv_width),
        "v_proj": (s.hidden, s.kv_width),
        "o_proj": (s.q_width, s.hidden),
        "gate_proj": (s.hidden, s.intermediate),
        "up_proj": (s.hidden, s.intermediate),
        "down_proj": (s.intermediate, s.hidden),
    }
    return s.layers * sum(rank * sum(sizes[m]) for m in modules if m in sizes)
