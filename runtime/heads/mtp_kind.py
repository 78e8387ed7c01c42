"""The MTP head kind: what runtime/heads/head_kinds.py registers for `mtp` (runtime/heads/head_kind.py says
what a kind declares).

    head, options = KIND.load_draft("runs/mtp/final#recursive", target)   # --draft mtp:DIR#recursive
    KIND.all_layouts()["mtp-mimo"].write(head_folder, out, LayoutOptions())

The modules are runtime/heads/mtp.py, their drafter runtime/drafters/mtp_drafter.py, DeepSeek's and MiMo's
layouts runtime/heads/mtp_layout.py, speculators' runtime/heads/mtp_speculators.py; this file ties them
together and holds the export writers (the target's files with the modules appended, written shard by
shard by runtime/heads/mtp_stream.py; speculators' one module alone) and the model card's serve texts.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from draftsmith.runtime.core.artifacts import parameter_summary
from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.head_kind import (
    DEFAULT_DEPTH,
    CotrainSection,
    HeadKind,
    Layout,
    VllmServe,
    Written,
)
from draftsmith.runtime.heads.kind_parts import lazy_class, lazy_function
from draftsmith.runtime.heads.mtp_config import MAX_MODULES

if TYPE_CHECKING:  # the layout functions' annotations
    from draftsmith.runtime.heads.head_kind import LayoutOptions, ServeArgs

log = logging.getLogger(__name__)
VLLM = VllmServe(layout="mtp-mimo", method="mtp", in_target=True)  # the target written with the module
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


@dataclass
class MtpSection(CotrainSection):
    """`head:` of an MTP train config (configs/mtp-*.yaml); the target may co-train (`cotrain:`)."""

    type: Literal["mtp"] = "mtp"
    num_modules: int = 1  # depth M: module m predicts token t+m+2 (1..4)
    labels: Literal["target", "data"] = "target"  # the target's distributions, or the data's tokens
    # Input conventions (runtime/heads/mtp.py): h_0 after the target's final norm (DeepSeek) or before it
    # (pre_norm: what vLLM's MiMo model feeds, for `export --format mtp-mimo`), and vLLM's zeroed
    # embedding at position 0.
    mtp_feature: Literal["final_norm", "pre_norm"] = "final_norm"
    mtp_mask_first_position: bool = False
    # An MoE target's blocks with a dense MLP instead of its last layer's experts
    # (runtime/heads/mtp_block.py); refused for a target whose last layer is dense
    mtp_dense_block: bool = False
    cotrain_weight: float = 0.3  # co-training: L_next + lambda * L_mtp, lambda = 0.3 (DeepSeek-V3, early)

    def validate(self) -> MtpSection:
        super().validate()
        if not 1 <= self.num_modules <= MAX_MODULES:
            raise BadInputError("head.num_modules", self.num_modules, f"an integer in [1, {MAX_MODULES}]")
        return self

    def head_options(self) -> dict:
        """MtpConfig.for_target's keywords besides the module count (trainer and preflight alike)."""
        return dict(
            feature=self.mtp_feature,
            mask_first_position=self.mtp_mask_first_position,
            dense_block=self.mtp_dense_block,
        )


def draft_arg(arg: str) -> tuple[str, dict]:
    """`DIR` or `DIR#recursive` -> (DIR, the drafter's {"recursive": ...}: the last module may recurse)."""
    folder, _, option = arg.partition("#")
    if option not in ("", "recursive"):
        raise BadInputError("--draft", f"mtp:{arg}", "mtp:DIR or mtp:DIR#recursive")
    return folder, {"recursive": option == "recursive"}


def default_depth(arg: str) -> int | None:
    """Without #recursive a module drafts one position: a head of one module defaults to chain:1."""
    from draftsmith.runtime.heads.mtp import num_modules

    folder, _, option = arg.partition("#")
    if folder and option != "recursive" and Path(folder).is_dir():
        return min(DEFAULT_DEPTH, num_modules(folder))
    return None


# ---- export writers: the target's own files with the modules appended (runtime/heads/mtp_layout.py)
# -------------
def write_deepseek(folder: Path, out: Path, options: LayoutOptions) -> Written:
    """DeepSeek's layout: the modules as layers L..L+M-1, `num_nextn_predict_layers`."""
    return _write(folder, out, options, mimo=False)


def write_mimo(folder: Path, out: Path, options: LayoutOptions) -> Written:
    """MiMo's layout: one module as `model.mtp_layers.0.*`, the target as MiMoForCausalLM (vLLM serves it)."""
    return _write(folder, out, options, mimo=True)


def _write(folder: Path, out: Path, options: LayoutOptions, mimo: bool) -> Written:
    """config.json and the tokenizer's files, then the weights shard by shard (runtime/heads/mtp_stream.py:
    about one target shard in memory at a time), each read back and checked, the index last."""
    from draftsmith.runtime.heads.mtp import load_head
    from draftsmith.runtime.heads.mtp_layout import deepseek_config, mimo_config
    from draftsmith.runtime.heads.mtp_stream import write_shards

    head = load_head(folder)
    target_dir = _target_dir(options, folder, head.config)
    target_config = read_json(target_dir / "config.json", "--target")
    _check_target_weights(target_dir, head.config)
    ours = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    config = (mimo_config if mimo else deepseek_config)(head.config, target_config)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    for name in TOKENIZER_FILES + ("generation_config.json",):
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, out / name)
    write_shards(config, head.config, ours, target_dir, out, mimo)
    c = head.config
    where = (
        "as `model.mtp_layers.0` of a MiMoForCausalLM (the target with zero q/k/v biases)"
        if mimo
        else f"as layers {c.num_target_layers}..{c.num_target_layers + c.num_modules - 1}"
    )
    trained = "co-trained with the modules" if c.cotrained else "unchanged (frozen in training)"
    details = [f"{c.num_modules} MTP module(s) {where}; target {trained}"]
    if mimo:
        details.append(_mimo_exactness(c))
    return Written(c.target, asdict(c), parameter_summary(ours) + " in the modules", details)


def write_speculators(folder: Path, out: Path, options: LayoutOptions) -> Written:
    """speculators' `mtp` layout: module 0 alone, the verifier named (speculators loads the embedding and
    LM head from it), read back and compared; a verifier folder here must hold the modules' target."""
    from draftsmith.runtime.core.targets import local_target_folder
    from draftsmith.runtime.heads.kind_parts import write_checked
    from draftsmith.runtime.heads.mtp import load_head
    from draftsmith.runtime.heads.mtp_speculators import check_carries, exactness, to_speculators

    head = load_head(folder)
    c = head.config
    check_carries(c)
    if c.cotrained and not options.verifier:
        raise BadInputError(
            "--verifier", None, "the co-trained target (folder or Hub id): speculators reads its embedding"
        )
    verifier = options.verifier or c.target
    found = local_target_folder(verifier)
    if found is not None:
        _check_target_weights(found, c, "--verifier")
    layout = to_speculators(head, verifier, options.speculative_tokens)
    details = [*exactness(c, options.speculative_tokens), f"verifier: {verifier}"]
    return write_checked(out, head, layout, read_any, "speculators", details)


def _mimo_exactness(config) -> str:
    """vLLM's MiMo MTP reads the target's pre-norm last state and zeroes the embedding at position 0;
    a module trained otherwise still serves losslessly there, with other (usually lower) acceptance."""
    if config.feature == "pre_norm" and config.mask_first_position:
        return "inputs as vLLM's MiMo MTP computes them (pre-norm target state, position 0 masked): exact"
    log.warning(
        "export: this module reads h_0 %s and %s position 0; vLLM's MiMo MTP feeds the pre-norm state and "
        "masks position 0, so vLLM will draft with other inputs (still lossless, other acceptance). "
        "Train with head.mtp_feature=pre_norm head.mtp_mask_first_position=true for an exact export.",
        "after the final norm" if config.feature == "final_norm" else "before the final norm",
        "masks" if config.mask_first_position else "does not mask",
    )
    return (
        "approximate in vLLM: it feeds the pre-norm target state and masks position 0, this module was "
        f"trained with feature={config.feature}, mask_first_position={config.mask_first_position} "
        "(lossless, other acceptance)"
    )


def _target_dir(options: LayoutOptions, folder: Path, config) -> Path:
    from draftsmith.runtime.core.targets import local_target_folder, resolve_target

    if options.target:
        return resolve_target(options.target).path
    if config.cotrained:
        if not (folder / "target").is_dir():
            raise BadInputError("--target", None, f"the co-trained target (expected it in {folder}/target)")
        return folder / "target"
    found = local_target_folder(config.target, config.target_weights_hash)  # the weights it was trained on
    if found is None:
        raise BadInputError("--target", None, f"a local copy of {config.target} (the modules' target)")
    return found


def _check_target_weights(target_dir: Path, config, flag: str = "--target") -> None:
    """The appended modules only work on the weights they were trained with (artifacts.weights_hash, read
    from the few checkpoint tensors it hashes: the target is never loaded whole)."""
    from draftsmith.runtime.heads.eagle3_binding import folder_weights_hash

    got = folder_weights_hash(target_dir)
    if got != config.target_weights_hash:
        raise BadInputError(
            flag,
            str(target_dir),
            f"the target the modules were trained with (weights {config.target_weights_hash})",
            f"its weights hash is {got}",
        )


# ---- the model card's serve texts -------------------------------------------------------------------------
def serve_deepseek(args: ServeArgs) -> str:
    return (
        "## Use\n\nThis folder is the target with the MTP modules appended as DeepSeek-style layers "
        "(`num_nextn_predict_layers`).\n"
        "transformers loads it as the plain target (the extra layers are unused); draftsmith drafts "
        f"with the modules:\n\n```bash\ndraftsmith generate --target {args.repo} --draft mtp:{args.repo} "
        '--prompt "Hello"\n```\n\nvLLM and SGLang load this layout only for DeepSeek architectures '
        "(`DeepSeekMTP`, `DeepseekV3ForCausalLMNextN`), so they do not serve it for a Llama target.\n"
    )


def serve_mimo(args: ServeArgs) -> str:
    return (
        "## Serve\n\nThis folder is the target written as `MiMoForCausalLM` (Qwen2 with zero q/k/v "
        "biases, which computes exactly the Llama target) with the MTP module as "
        f"`model.mtp_layers.0`. vLLM:\n\n{VLLM.serve_command(args, tokens=1)}"
    )


def serve_speculators(args: ServeArgs) -> str:
    load = "from speculators.models.mtp import MTPDraftModel\n\n"
    load += f'model = MTPDraftModel.from_pretrained("{args.repo}")'
    return (
        "## Use\n\nspeculators' MTP layout: one module as `mtp_layers.0`, the embedding and LM head read "
        f"from the verifier in `speculators_config`:\n\n```python\n{load}\n```\n\n"
        "vLLM maps a speculators `mtp` folder to an MTP model class by the verifier's architecture "
        "(MiMo, Qwen3-Next, Qwen3.5); it has none for a dense Qwen3 verifier. draftsmith:\n\n"
        f"{args.generate}"
    )


read_any = lazy_function("draftsmith.runtime.heads.mtp", "load_head")


KIND = HeadKind(
    name="mtp",
    title="MTP modules",
    about="MTP modules: our folder or DeepSeek's / MiMo's layout; tree depth <= modules, or "
    "mtp:DIR#recursive to reuse the last module deeper",
    module_class=lazy_class("draftsmith.runtime.heads.mtp", "MtpHead"),
    section=MtpSection,
    read=read_any,
    draft_arg=draft_arg,
    spec="mtp:DIR[#recursive]",
    layouts={
        "mtp": Layout(
            write=write_deepseek,
            serve=serve_deepseek,
            reads="target",
            about="MTP modules in DeepSeek's layout: the target plus layers L..L+M-1 and "
            "num_nextn_predict_layers (draftsmith generate --target DIR --draft mtp:DIR)",
        ),
        "mtp-mimo": Layout(
            write=write_mimo,
            serve=serve_mimo,
            reads="target",
            about="one MTP module in MiMo's layout (the target as MiMoForCausalLM: Qwen2 with zero q/k/v "
            'biases): vllm serve DIR --speculative-config \'{"method": "mtp", ...}\'',
        ),
        "speculators": Layout(
            write=write_speculators,
            serve=serve_speculators,
            reads="verifier",
            about="one MTP module in speculators' layout (speculators_model_type: mtp, mtp_layers.0.*; "
            "Qwen3 targets): MTPDraftModel.from_pretrained(DIR)",
        ),
    },
    default_depth=default_depth,
    cotrain=True,
    vllm=VLLM,
)
