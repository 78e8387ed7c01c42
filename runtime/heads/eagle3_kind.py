"""The EAGLE-3 head kind: what runtime/heads/head_kinds.py registers for `eagle3` (runtime/heads/head_kind.py
says what a kind declares).

    head, options = KIND.load_draft("runs/eagle3/final", target)   # --draft eagle3:DIR
    KIND.all_layouts()["speculators"].write(head_folder, out, LayoutOptions(verifier="org/model"))

The head is runtime/heads/eagle3.py, its drafter runtime/drafters/eagle3_drafter.py, its engine layouts
(official / SGLang, speculators) runtime/heads/layouts.py; this file ties them together and holds the export
writers and the model card's serve texts. Heavy modules are imported inside the functions that use them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from draftsmith.runtime.core.artifacts import open_tensors
from draftsmith.runtime.errors import read_json
from draftsmith.runtime.heads.eagle3_binding import binding_details, check_export_target
from draftsmith.runtime.heads.head_kind import CotrainSection, HeadKind, Layout, VllmServe
from draftsmith.runtime.heads.kind_parts import lazy_class, lazy_function, serve_speculators, write_checked

if TYPE_CHECKING:  # annotations only
    from draftsmith.runtime.heads.eagle3 import Eagle3Head
    from draftsmith.runtime.heads.head_kind import LayoutOptions, ServeArgs, Written

log = logging.getLogger(__name__)
VLLM = VllmServe(layout="eagle3", method="eagle3")  # the official layout with vLLM's aux ids


@dataclass
class Eagle3Section(CotrainSection):
    """`head:` of an EAGLE-3 train config (configs/eagle3-smollm2-135m.yaml); with `cotrain:`,
    configs/eagle3-cotrain-lora-smollm2-135m.yaml (train/objectives/eagle3_cotrain.py)."""

    type: Literal["eagle3"] = "eagle3"
    fc_norm: bool = False  # EAGLE-3.1: an RMSNorm per aux hidden state before fc
    norm_before_fc: bool = False  # EAGLE-3.1: one RMSNorm over the concatenated aux states before fc
    num_layers: int = 1  # draft decoder layers (the first reads [embedding; feature])
    norm_output: bool = False  # EAGLE-3.1: feed the final-normed output back across TTT steps
    # Training levers (train/objectives/eagle3_levers.py, checked there against train.ttt_steps): the loss per
    # TTT step (train/objectives/draft_losses.py: kl = forward KL as soft cross-entropy, rkl, jsd, tv = 1 -
    # acceptance, lk_hybrid = arXiv:2602.23881's KL/TV blend), TTT steps by training progress ("3,7@0.3": 3
    # steps, then train.ttt_steps=7 from 30% of train.max_steps; "" = always ttt_steps) and one loss weight
    # per TTT step (null: train.step_decay**k)
    loss: Literal["kl", "rkl", "jsd", "tv", "lk_hybrid"] = "kl"
    ttt_schedule: str = ""
    ttt_weights: list[float] | None = None
    # Co-training (cotrain.enabled): L_next + cotrain_weight * L_eagle3 (MTP's lambda; ModelOpt's co-training
    # adds its EAGLE loss with weight 1); cotrain_detach_features: the head's loss stops at the target's
    # aux features (the target then trains on L_next alone); false lets it shape them, as Medusa-2's and
    # DeepSeek-V3's draft losses reach the trunk
    cotrain_weight: float = 0.3
    cotrain_detach_features: bool = False

    def validate(self) -> Eagle3Section:
        super().validate()
        self.check_at_least("num_layers", 1)
        return self

    def head_options(self) -> dict:
        """Eagle3Config.for_target's keywords."""
        return self.keywords("fc_norm", "norm_before_fc", "num_layers", "norm_output")


read_any = lazy_function("draftsmith.runtime.heads.layouts", "load_eagle3")  # any layout, or a Hub id


# ---- export writers ---------------------------------------------------------------------------------------
def _write(
    head: Eagle3Head, config: dict, tensors: dict, out: Path, what: str, engine: str, quantize: str | None
) -> Written:
    """Write the layout (FP8 with `quantize`), read it back as `--draft eagle3:DIR` does, compare with the
    head (an FP8 export: with the head's dequantized weights, exactly)."""
    expected, precision = None, ""
    if quantize == "fp8":
        from draftsmith.runtime.heads.fp8_checkpoint import precision as fp8_precision
        from draftsmith.runtime.heads.fp8_checkpoint import quantize_eagle3

        layout = "speculators" if what == "speculators" else "official"
        config, tensors, expected = quantize_eagle3(head, config, tensors, layout)
        precision = fp8_precision(head.fc.weight.dtype)
    ids = (
        config.get("eagle_aux_hidden_state_layer_ids")
        or config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    )
    c = head.config
    details = [
        f"aux layers (0-based decoder-layer outputs): {c.aux_layer_ids}; written as {ids} for {engine}",
        f"draft vocabulary: {c.draft_vocab_size} of {c.vocab_size} target tokens (`d2t`)",
        *binding_details(c),  # a co-trained head: which target serves it (runtime/heads/eagle3_binding.py)
    ]
    return write_checked(out, head, (config, tensors), read_any, what, details, expected, precision)


def write_official(folder: Path, out: Path, options: LayoutOptions) -> Written:
    """Official / SGLang layout; `options.engine` picks the aux-id convention."""
    from draftsmith.runtime.heads.eagle3 import load_head
    from draftsmith.runtime.heads.layouts import to_official

    head = load_head(folder)
    check_export_target(head.config, options.target, "--target", options.any_target, folder)
    config, tensors = to_official(head, engine=options.engine, sglang_version=options.sglang_version)
    written = _write(head, config, tensors, out, "eagle3", options.engine, options.quantize)
    written.engine = options.engine
    if options.engine == "sglang":  # which SGLang reads its EAGLE-3.1 options (sglang_versions.py)
        from draftsmith.runtime.heads.sglang_versions import card_line

        written.details.append(card_line(head.config))
    return written


def write_speculators(folder: Path, out: Path, options: LayoutOptions) -> Written:
    """vLLM's native speculators layout (the verifier's embedding and architectures when at hand)."""
    from draftsmith.runtime.heads.eagle3 import load_head
    from draftsmith.runtime.heads.layouts import to_speculators

    head = load_head(folder)
    check_export_target(head.config, options.verifier, "--verifier", options.any_target, folder)
    facts = _verifier_facts(options.verifier or head.config.target)
    config, tensors = to_speculators(head, options.verifier, options.speculative_tokens, **facts)
    return _write(head, config, tensors, out, "speculators", "speculators", options.quantize)


def _verifier_facts(verifier: str) -> dict:
    """speculators writes the verifier's embedding and architectures into its folders; so do we, from the
    target's files when they are here (vLLM then reads the embedding from the head, speculators too)."""
    from draftsmith.runtime.core.targets import local_target_folder

    folder = local_target_folder(verifier)
    if folder is None:
        log.warning("export: speculators folder without embed_tokens (vLLM shares the target's)")
        return {}
    architectures = read_json(folder / "config.json", "--verifier").get("architectures")
    for file in sorted(folder.glob("*.safetensors")):
        with open_tensors(file, "--verifier") as f:
            if "model.embed_tokens.weight" in f.keys():
                return {
                    "embed_tokens": f.get_tensor("model.embed_tokens.weight"),
                    "architectures": architectures,
                }
    return {"architectures": architectures}


def write_gguf(folder: Path, out: Path, options: LayoutOptions) -> Written:
    """llama.cpp's GGUF (runtime/heads/eagle3_gguf.py), converted from the official folder with vLLM's ids
    (llama.cpp's convention too) by the pinned llama.cpp's converter, the target's tokenizer inside."""
    from draftsmith.runtime.core.targets import local_target_folder
    from draftsmith.runtime.errors import BadInputError
    from draftsmith.runtime.heads.eagle3 import load_head
    from draftsmith.runtime.heads.eagle3_gguf import LLAMACPP_RELEASE, check_gguf_head, llamacpp_ids
    from draftsmith.runtime.heads.eagle3_gguf import write_gguf as convert
    from draftsmith.runtime.heads.head_kind import Written
    from draftsmith.runtime.heads.layouts import to_official

    head = load_head(folder)
    check_gguf_head(head.config)
    check_export_target(head.config, options.target, "--target", options.any_target, folder)
    where = options.target or head.config.target
    target_dir = local_target_folder(where, head.config.target_weights_hash)
    if target_dir is None:
        raise BadInputError(
            "--target", where, "the target's folder on this machine: the GGUF carries its tokenizer"
        )
    config, tensors = to_official(head, engine="vllm")
    convert(head, (config, tensors), target_dir, options.llamacpp, out)
    ids = llamacpp_ids(head.config.aux_layer_ids)
    details = [
        f"aux layers (0-based decoder-layer outputs): {head.config.aux_layer_ids}; written as llama.cpp's "
        f"target_layers {ids} (the inputs of those layers, which llama.cpp extracts)",
        f"read by {LLAMACPP_RELEASE}; weights F32 (the head's values exactly) and the target's tokenizer",
    ]
    return Written.of_head(head.config, tensors, details, precision="float32 (GGUF F32)")


# ---- the model card's serve texts -------------------------------------------------------------------------
def serve_official(args: ServeArgs) -> str:
    k, other = args.speculative_tokens, "vllm" if args.engine == "sglang" else "sglang"
    return (
        "## Serve\n\nThe aux-layer ids in `eagle_config` are written in "
        f"{args.engine}'s convention; export again with `--engine {other}` for {other}.\n\n"
        f"SGLang:\n\n```bash\npython -m sglang.launch_server --model-path {args.target} "
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {args.repo} "
        f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}\n"
        "```\n\n"
        f"vLLM:\n\n{VLLM.serve_command(args)}\n"
        f"draftsmith:\n\n{args.generate}"
    )


def serve_gguf(args: ServeArgs) -> str:
    k = args.speculative_tokens
    return (
        "## Serve\n\nWith llama.cpp (the target as a GGUF of the same weights, e.g. "
        "`bash scripts/setup_llamacpp.sh --gguf F32`):\n\n"
        f"```bash\nllama-server -m TARGET.gguf --spec-draft-model {args.repo}/head.gguf "
        f"--spec-type draft-eagle3 --spec-draft-n-max {k}\n```\n\n"
        f"draftsmith (this head's own folder, not the GGUF):\n\n{args.generate}"
    )


KIND = HeadKind(
    name="eagle3",
    title="EAGLE-3 draft head",
    about="an EAGLE-3 head: our folder, the official/SGLang or speculators layout, or a Hub id; #ids=input|"
    "output says how foreign aux-layer ids read, #any-target pairs a co-trained head with another target",
    module_class=lazy_class("draftsmith.runtime.heads.eagle3", "Eagle3Head"),
    section=Eagle3Section,
    read=read_any,
    cotrain=True,  # the target may train with the head (train/objectives/eagle3_cotrain.py)
    spec="eagle3:DIR",
    layouts={
        "eagle3": Layout(
            write=write_official,
            serve=serve_official,
            about="official / SGLang EAGLE-3 layout (LlamaForCausalLMEagle3, midlayer.*, d2t); vLLM's "
            "`method: eagle3` loads it too. Aux-layer ids mean different tensors in SGLang (output of "
            "layer X) and vLLM (input to layer X): --engine picks whose convention to write",
            fp8="vllm",  # only vLLM's compressed-tensors loader was checked against this layout
        ),
        "speculators": Layout(
            write=write_speculators,
            serve=serve_speculators,
            reads="verifier",
            about="vLLM's native layout (speculators_config, layers.0.*, aux ids in vLLM's convention): "
            "`vllm serve DIR`",
            fp8="any",
        ),
        "gguf": Layout(
            write=write_gguf,
            serve=serve_gguf,
            reads="target",
            about="llama.cpp's GGUF (head.gguf, `--spec-type draft-eagle3`), written by the converter of "
            "llama.cpp in llama-cpp-python 0.3.36 (--llamacpp: scripts/setup_llamacpp.sh) with the target's "
            "tokenizer, checked tensor by tensor",
        ),
    },
    vllm=VLLM,
)
