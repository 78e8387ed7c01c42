"""EAGLE-3 heads in the layouts engines load, and back (docs/architecture.md, 5.5-5.7).

    config, tensors = to_official(head, engine="sglang")  # LlamaForCausalLMEagle3, midlayer.*
    config, tensors = to_speculators(head)                 # vLLM's native layout, layers.0.*
    head = from_layout(config, tensors, target)            # ours / official / speculators -> Eagle3Head
    head = load_eagle3("org/some-eagle3-head", target)     # `--draft eagle3:X` (a folder or a Hub id)

Pure functions over (config dict, state dict); files, model cards and the Hub are `draftsmith.train.export`.
Our tensor names already are the official ones, so the official layout differs from ours only in its
config. The one trap is the aux-layer ids: the same integers mean different tensors in SGLang and in vLLM
(`aux_layers.to_engine_ids` converts; the config also records the ids in both conventions).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from draftsmith.runtime.core.artifacts import load_tensors, tokenizer_hash
from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.aux_layers import (
    AUX_LAYER_CONVENTION,
    default_aux_layers,
    engine_layer_ids,
    from_engine_ids,
    to_engine_ids,
)
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, check_head_matches_target
from draftsmith.runtime.heads.fp8_checkpoint import dequantize_checkpoint
from draftsmith.runtime.heads.head_folder import config_from, fill_strict
from draftsmith.runtime.heads.sglang_versions import check_sglang_version

log = logging.getLogger(__name__)

OFFICIAL_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_VERSION = "0.9.0"  # the speculators config schema these files follow (its tests load them)
# Copied from our layer dict to the Llama config of the draft layer; rope is written both ways below.
LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
LLAMA_KEYS += ("rms_norm_eps", "max_position_embeddings", "hidden_act")


def detect_layout(config: dict) -> str:
    """'draftsmith', 'official' or 'speculators' from a config.json's keys."""
    if config.get("head_type") == "eagle3":
        return "draftsmith"
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        if kind != "eagle3":
            raise BadInputError(
                "speculators_model_type", kind, "eagle3 (the only speculators head read here)"
            )
        return "speculators"
    if any(arch in OFFICIAL_ARCHITECTURES for arch in config.get("architectures") or ()):
        return "official"
    raise BadInputError(
        "config.json",
        f"keys {sorted(config)[:12]}",
        "an EAGLE-3 head: draftsmith (head_type: eagle3), official/SGLang (architectures: "
        "LlamaForCausalLMEagle3) or speculators (speculators_model_type: eagle3)",
    )


# ---- ours -> engines -----------------------------------------------------------------------------------


def llama_layer_config(cfg: Eagle3Config) -> dict:
    """The draft decoder layer as a Llama config dict (vocab = the target's, as both engines expect)."""
    layer = cfg.layer
    out = {k: layer[k] for k in LLAMA_KEYS if k in layer}
    rope = dict(layer.get("rope_parameters") or {"rope_theta": 10000.0, "rope_type": "default"})
    out["rope_parameters"] = rope
    out["rope_theta"] = rope.get("rope_theta")  # older readers (SGLang, transformers 4.x) read these two
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    out["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    out.update(
        model_type="llama",
        num_hidden_layers=cfg.num_layers,
        vocab_size=cfg.vocab_size,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    return out


def _provenance(cfg: Eagle3Config) -> dict:
    """What only draftsmith reads back: identity checks and the aux ids with their meaning stated."""
    return {
        "target": cfg.target,
        "target_model_type": cfg.target_model_type,
        "tokenizer_hash": cfg.tokenizer_hash,
        "aux_layer_ids": list(cfg.aux_layer_ids),
        "aux_layer_convention": AUX_LAYER_CONVENTION,
        "aux_layer_ids_by_engine": engine_layer_ids(cfg.aux_layer_ids),
        **_binding(cfg),
    }


def _binding(cfg: Eagle3Config) -> dict:
    """A co-trained head's binding (runtime/heads/eagle3_binding.py), only where there is one."""
    return {"target_weights_hash": cfg.target_weights_hash, "cotrained": True} if cfg.cotrained else {}


def _norm_flags(cfg: Eagle3Config, official: bool = False) -> dict:
    """The EAGLE-3.1 flags. The official layout writes `norm_output` only when true: SpecForge
    (a6b6b02, llama3_eagle.py:1690) reads a missing key as True and a false one as "no final norm
    before lm_head", which our head always applies; SGLang and vLLM treat a missing key as false.
    tests/train/test_export_reader_defaults.py checks each reader's defaults against the head."""
    flags = {"fc_norm": cfg.fc_norm, "norm_before_fc": cfg.norm_before_fc, "norm_output": cfg.norm_output}
    if official and not cfg.norm_output:
        del flags["norm_output"]
    return flags


def to_official(
    head: Eagle3Head, engine: str = "sglang", sglang_version: str | None = None
) -> tuple[dict, dict[str, torch.Tensor]]:
    """The official / SGLang EAGLE-3 folder (also what vLLM's `method: eagle3` loads), aux ids written in
    `engine`'s convention. `t2d` is kept (both engines ignore it); no embedding (engines use the target's).
    For SGLang, a head with EAGLE-3.1 options needs `sglang_version` at least the first release that reads
    them (runtime/heads/sglang_versions.py)."""
    cfg = head.config
    if cfg.norm_before_residual:
        raise BadInputError(
            "norm_before_residual",
            True,
            "False for the official layout (SGLang's layer has no such flag)",
            "export --format speculators keeps it",
        )
    if engine == "sglang" and cfg.num_layers > 1:
        # vLLM's loader reads layers.{i} (checked against its source); SGLang's naming of further layers
        # was not verified, so no SGLang folder claims to carry them.
        raise BadInputError(
            "num_layers",
            cfg.num_layers,
            "1 for an SGLang export",
            "export --engine vllm or --format speculators for vLLM",
        )
    if engine == "sglang":
        check_sglang_version(cfg, sglang_version)  # EAGLE-3.1 options: SGLang >= the release reading them
    dtype = head.fc.weight.dtype
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_layer_config(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": to_engine_ids(cfg.aux_layer_ids, engine),
            "use_aux_hidden_state": True,
        },
        **_norm_flags(cfg, official=True),
        "torch_dtype": str(dtype).removeprefix("torch."),
        "draftsmith": {**_provenance(cfg), "aux_ids_written_for": engine},
    }
    return config, _tensors(head)


def to_speculators(
    head: Eagle3Head,
    verifier: str | None = None,
    speculative_tokens: int = 3,
    embed_tokens: torch.Tensor | None = None,  # [V, H] the target's; speculators' own files carry it
    architectures: list[str] | None = None,  # the verifier's (default: read from a local verifier folder)
) -> tuple[dict, dict[str, torch.Tensor]]:
    """vLLM's native speculators layout: `layers.0.*`, `speculators_config` naming the verifier (its
    architectures read from its config.json when it is a local folder), aux ids in vLLM's (input-of-layer)
    convention, `norm_before_residual` written explicitly (vLLM's default is True)."""
    cfg = head.config
    verifier = verifier or cfg.target
    tl_config = llama_layer_config(cfg)
    config = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": to_engine_ids(cfg.aux_layer_ids, "speculators"),
        "norm_before_residual": cfg.norm_before_residual,
        "embed_requires_grad": False,
        **_norm_flags(cfg),
        "transformer_layer_config": tl_config,
        "speculators_config": speculators_config(
            "eagle3",
            speculative_tokens,
            verifier,
            architectures or _architectures(verifier, cfg.target_model_type),
        ),
        "torch_dtype": str(head.fc.weight.dtype).removeprefix("torch."),
        "draftsmith": _provenance(cfg),
    }
    tensors = {_rename(k, "midlayer.", "layers.0."): v for k, v in _tensors(head).items()}
    if embed_tokens is not None:
        if tuple(embed_tokens.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise BadInputError(
                "embed_tokens", list(embed_tokens.shape), f"[{cfg.vocab_size}, {cfg.hidden_size}]"
            )
        tensors["embed_tokens.weight"] = embed_tokens.detach().to(head.fc.weight.dtype).contiguous()
    return config, tensors


def speculators_config(
    algorithm: str, speculative_tokens: int, verifier: str, architectures: list[str]
) -> dict:
    """The `speculators_config` block every speculators layout writes: a greedy proposal of
    `speculative_tokens` and the verifier (its path or Hub id and architectures) the head drafts for."""
    proposal = {"proposal_type": "greedy", "speculative_tokens": speculative_tokens}
    proposal.update(verifier_accept_k=1, accept_tolerance=0.0)
    return {
        "algorithm": algorithm,
        "default_proposal_method": "greedy",
        "proposal_methods": [proposal],
        "verifier": {"name_or_path": verifier, "architectures": architectures},
    }


def _architectures(verifier: str, model_type: str | None = None) -> list[str]:
    """The verifier's own architectures when it is a local folder (what speculators' VerifierConfig
    reads), else the causal-LM class transformers maps the head's target model_type to (Llama's for
    folders written before heads recorded one). A vision-language target records its text model_type
    (gemma3_text: Gemma3ForCausalLM, not Gemma3ForConditionalGeneration): pass --verifier as a folder."""
    config = Path(verifier).expanduser() / "config.json"
    if config.is_file():
        architectures = read_json(config, "--verifier").get("architectures")
        if architectures:
            return list(architectures)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type or "llama", "LlamaForCausalLM")]


def _tensors(head: Eagle3Head) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")}


def _rename(name: str, old: str, new: str) -> str:
    return new + name[len(old) :] if name.startswith(old) else name


# ---- engines -> ours -----------------------------------------------------------------------------------


def from_layout(
    config: dict,
    tensors: dict[str, torch.Tensor],
    target=None,
    ids: str = "auto",
    name: str = "eagle3 head",
    any_target: bool = False,  # a co-trained head with another target (runtime/heads/eagle3_binding.py)
) -> Eagle3Head:
    """Any supported layout -> our head, strictly validated (names, shapes, d2t/t2d, sizes vs target).

    `ids` says how to read a foreign layout's aux ids when it has no draftsmith block: 'auto' (SGLang's
    rule), 'input' or 'output'. The speculators layout is always read as vLLM reads it ('input')."""
    layout = detect_layout(config)
    tensors = dequantize_checkpoint(config, tensors, name)  # FP8 exports: float32 weights (fp8_checkpoint.py)
    if layout == "draftsmith":
        cfg = config_from(config, Eagle3Config, name)
    else:
        cfg = _config_from_engine(config, layout, target, ids)
    if target is not None:
        check_head_matches_target(cfg, target, any_target)
        _check_embedding(tensors.get("embed_tokens.weight"), target)
    tensors = _our_names(tensors, layout, cfg)
    what = f"EAGLE-3 ({layout} layout) {name}"
    return fill_strict(Eagle3Head(cfg), tensors, what, cfg.draft_vocab_size)  # runtime/heads/head_folder.py


def _config_from_engine(config: dict, layout: str, target, ids: str) -> Eagle3Config:
    layer_cfg = config["transformer_layer_config"] if layout == "speculators" else config
    layers = layer_cfg.get("num_hidden_layers", 1)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise BadInputError("num_hidden_layers", layers, "an integer >= 1 (draft decoder layers)")
    if config.get("embed_requires_grad"):
        raise BadInputError(
            "embed_requires_grad", True, "false: draftsmith heads read the target's embedding"
        )
    ours = config.get("draftsmith") or {}
    vocab = layer_cfg.get("vocab_size")
    hidden = layer_cfg["hidden_size"]
    layer = {k: layer_cfg[k] for k in LLAMA_KEYS if layer_cfg.get(k) is not None}
    layer.setdefault("head_dim", hidden // layer_cfg["num_attention_heads"])
    layer["rope_parameters"] = _rope(layer_cfg)
    return Eagle3Config(
        target=ours.get("target") or (target.name if target is not None else "unknown"),
        vocab_size=vocab,
        draft_vocab_size=config.get("draft_vocab_size") or vocab,
        target_hidden_size=config.get("target_hidden_size") or hidden,
        aux_layer_ids=_aux_ids(config, layout, ours, target, ids),
        tokenizer_hash=ours.get("tokenizer_hash") or _borrowed_tokenizer_hash(target),
        target_model_type=ours.get("target_model_type"),
        layer=layer,
        fc_norm=bool(config.get("fc_norm")),
        norm_before_fc=bool(config.get("norm_before_fc")),
        # vLLM reads a missing flag as True (speculators/algos.py); the official layout has no such flag
        norm_before_residual=bool(config.get("norm_before_residual", layout == "speculators")),
        num_layers=layers,
        norm_output=bool(config.get("norm_output")),
        target_weights_hash=ours.get("target_weights_hash"),
        cotrained=bool(ours.get("cotrained", False)),
    )


def _rope(layer_cfg: dict) -> dict:
    if layer_cfg.get("rope_parameters"):
        return dict(layer_cfg["rope_parameters"])
    rope = dict(layer_cfg.get("rope_scaling") or {"rope_type": "default"})
    if "type" in rope:
        rope["rope_type"] = rope.pop("type")
    rope["rope_theta"] = float(layer_cfg.get("rope_theta", 10000.0))
    return rope


def _aux_ids(config: dict, layout: str, ours: dict, target, ids: str) -> list[int]:
    if "aux_layer_ids" in ours:
        return list(ours["aux_layer_ids"])
    written = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    written = config.get("eagle_aux_hidden_state_layer_ids", written)
    if written:
        return from_engine_ids(written, "input" if layout == "speculators" else ids)
    if target is None:
        raise BadInputError("eagle_aux_hidden_state_layer_ids", None, "explicit ids, or a target to default")
    return list(default_aux_layers(target.num_layers))  # both engines' default taps the same tensors


def _check_embedding(embed: torch.Tensor | None, target) -> None:
    """A stored embedding (speculators writes one) must be the target's: the head uses the target's."""
    if embed is None:
        return
    ours = target.decoder.embed_tokens.weight.detach()
    if embed.shape != ours.shape or not torch.allclose(embed.to(ours), ours, rtol=1e-2, atol=1e-3):
        raise BadInputError(
            "embed_tokens.weight", "an embedding other than the target's", f"the embedding of {target.name}"
        )


def _borrowed_tokenizer_hash(target) -> str:
    if target is None:
        return "unknown"
    log.info("the head records no tokenizer identity; trusting the target's (vocab and sizes are checked)")
    return tokenizer_hash(target.tokenizer)


def _our_names(tensors: dict[str, torch.Tensor], layout: str, cfg: Eagle3Config) -> dict:
    out = {_rename(k, "layers.0.", "midlayer."): v for k, v in tensors.items()}
    out.pop("embed_tokens.weight", None)  # the target's embedding is used (speculators stores a copy)
    if "d2t" not in out and cfg.draft_vocab_size == cfg.vocab_size:
        out["d2t"] = torch.zeros(cfg.vocab_size, dtype=torch.int64)
    if "t2d" not in out and "d2t" in out:  # engines ignore t2d; rebuild it from the offsets
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[out["d2t"].long() + torch.arange(len(out["d2t"]))] = True
        out["t2d"] = t2d
    if "d2t" in out:
        out["d2t"] = out["d2t"].to(torch.int64)
    return out


# ---- files and Hub ids ---------------------------------------------------------------------------------


def load_eagle3(source: str, target=None) -> Eagle3Head:
    """`--draft eagle3:SOURCE`: a folder in any supported layout or a Hub id (downloaded with
    huggingface_hub), optionally suffixed `#ids=input|output` to say how a foreign head's aux ids read
    and/or `#any-target` to pair a co-trained head with another target (comma-separated: `#ids=input,
    any-target`; runtime/heads/eagle3_binding.py)."""
    source, _, option = source.partition("#")
    words = [w for w in option.split(",") if w] if option else []
    any_target = "any-target" in words
    rest = [w for w in words if w != "any-target"]
    ids = rest[0].removeprefix("ids=") if rest else "auto"
    if len(rest) > 1 or (rest and (not rest[0].startswith("ids=") or ids not in ("auto", "input", "output"))):
        raise BadInputError(
            "--draft",
            f"eagle3:{source}#{option}",
            "eagle3:DIR, eagle3:DIR#ids=input|output, eagle3:DIR#any-target or both (#ids=input,any-target)",
        )
    folder = _resolve(source)
    config = read_json(folder / "config.json", "eagle3 head")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise BadInputError("eagle3 head", str(folder), "a folder with *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_tensors(file, "eagle3 head"))
    return from_layout(config, tensors, target, ids, name=str(folder), any_target=any_target)


def _resolve(source: str) -> Path:
    folder = Path(source).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise BadInputError("eagle3 head", str(folder), "a folder with config.json and *.safetensors")
        return folder
    if folder.exists() or source.count("/") != 1 or source.startswith((".", "/", "~")):
        raise BadInputError("eagle3 head", source, "a head folder or a Hub id like org/name")
    return download_head(source)


def download_head(repo_id: str) -> Path:
    """A Hub head's config and safetensors (never pickles), cached by huggingface_hub."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["config.json", "*.safetensors", "README.md"]))
    except Exception as err:  # offline, missing repo, gated: one clear line instead of a trace
        raise BadInputError(
            "eagle3 head",
            repo_id,
            "a local folder, or a Hub id reachable from this machine",
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
        ) from None
