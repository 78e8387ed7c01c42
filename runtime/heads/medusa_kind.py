"""The Medusa head kind: what runtime/heads/head_kinds.py registers for `medusa` (runtime/heads/head_kind.py
says what a kind declares).

    heads, options = KIND.load_draft("runs/medusa/final", target)   # --draft medusa:DIR
    KIND.parse_tree("runs/medusa/final", "sparse:15")     # --tree: cartesian:K1,.. and sparse:N too
    KIND.all_layouts()["medusa"].write(head_folder, out, LayoutOptions())       # vLLM's layout

The heads are runtime/heads/medusa.py, their drafter runtime/drafters/medusa_drafter.py, their trees
runtime/heads/medusa_tree.py, vLLM's and FasterDecoding's layouts runtime/heads/medusa_layout.py; this file
ties them together and holds the `head:` section of a train config (the trainer's objective is
train/objectives/medusa_objective.py), the export writer and the model card's serve text. Heavy modules are
imported inside the functions that use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.head_folder import CONFIG_FILE
from draftsmith.runtime.heads.head_kind import DEFAULT_DEPTH, CotrainSection, HeadKind, Layout, VllmServe
from draftsmith.runtime.heads.kind_parts import checked_export, lazy_class, lazy_function
from draftsmith.runtime.heads.medusa import MAX_HEADS

if TYPE_CHECKING:  # the layout functions' annotations
    from draftsmith.runtime.heads.head_kind import LayoutOptions, ServeArgs, Written

VLLM = VllmServe(layout="medusa", method="medusa")


@dataclass
class MedusaSection(CotrainSection):
    """`head:` of a Medusa train config: Medusa-1, the target frozen (configs/medusa-smollm2-135m.yaml), or
    Medusa-2 with `cotrain:` (configs/medusa2-lora-smollm2-135m.yaml, train/objectives/medusa2.py)."""

    type: Literal["medusa"] = "medusa"
    allows_self_distill: ClassVar[bool] = True  # Medusa-2's self-distillation (train/objectives/medusa2.py)
    num_heads: int = 3  # K: head k predicts token t+k+2
    num_layers: int = 1  # residual blocks per head
    original_lm_head: bool = True  # share the target's LM head (0.33M parameters per head on SmolLM2)
    fc_bias: bool = True  # the blocks' linear layers have a bias (FasterDecoding's heads do)
    labels: Literal["target", "data"] = "target"  # the target's distributions, or the data's tokens
    init_from_target: bool = True  # own LM heads start as the target's (blocks always start at zero)
    reduce_vocab: bool = False  # LM heads over the data steps' draft vocabulary (draft_vocab_size ids)
    calibration_topk: int = 10  # ranks measured per head on the validation split (the sparse tree's)
    calibration_rows: int = 64  # validation rows the final heads are calibrated on
    # Medusa-2 (cotrain.enabled): L_LM + lambda0 * L_medusa with lambda0 = cotrain_weight (0.2 in the
    # Medusa-2 axolotl recipes), ramped from ~0 over the warmup steps (the paper's heads warmup: fresh
    # heads' large loss must not drag the target), linear or sine in the step (train/objectives/medusa2.py)
    cotrain_weight: float = 0.2
    cotrain_weight_warmup_steps: int = 0  # 0 = lambda0 from the first step
    cotrain_weight_schedule: Literal["linear", "sine"] = "sine"

    def validate(self) -> MedusaSection:
        super().validate()
        if not 1 <= self.num_heads <= MAX_HEADS:
            raise BadInputError("head.num_heads", self.num_heads, f"an integer in [1, {MAX_HEADS}]")
        self.check_at_least("num_layers", 0)
        self.check_at_least("cotrain_weight_warmup_steps", 0)
        if self.calibration_topk < 1 or self.calibration_rows < 0:
            raise BadInputError(
                "head.calibration_topk/rows", [self.calibration_topk, self.calibration_rows], ">= 1 / >= 0"
            )
        return self

    def head_options(self) -> dict:
        """MedusaConfig.for_target's keywords besides the head count (trainer and preflight alike)."""
        vocab = self.draft_vocab_size if self.reduce_vocab else None
        return {**self.keywords("num_layers", "original_lm_head", "fc_bias"), "draft_vocab_size": vocab}


# ---- drafting ---------------------------------------------------------------------------------------------
def _accuracies(folder: str) -> list[list[float]] | None:
    """The calibration accuracies a head folder records (ours, or a vLLM export's provenance block)."""
    from draftsmith.runtime.heads.medusa_layout import PROVENANCE_KEY

    config = Path(folder) / CONFIG_FILE
    if not config.is_file():
        return None
    raw = read_json(config, "--draft")
    return (raw.get(PROVENANCE_KEY) or raw).get("accuracies")


def parse_tree(arg: str, spec: str):
    """`--tree SPEC` for `--draft medusa:ARG`: cartesian:K1,K2,.., sparse:N (from the folder's calibration
    accuracies) or any runtime/tree.parse_tree_spec spec."""
    from draftsmith.runtime.heads.medusa_tree import parse_medusa_tree

    return parse_medusa_tree(spec, _accuracies(arg))


def default_depth(arg: str) -> int | None:
    """chain:2, or chain:1 for a folder of one head (head k drafts depth k + 1 only)."""
    config = Path(arg) / CONFIG_FILE
    if not config.is_file():
        return None
    raw = read_json(config, "--draft")
    heads = raw.get("num_heads", raw.get("medusa_num_heads"))
    return min(DEFAULT_DEPTH, heads) if isinstance(heads, int) and heads >= 1 else None


# `--draft medusa:DIR`: ours, vLLM's or FasterDecoding's folder (detected)
read_any = lazy_function("draftsmith.runtime.heads.medusa_layout", "load_medusa")


# ---- export: vLLM's layout --------------------------------------------------------------------------------
def write_vllm_layout(folder: Path, out: Path, options: LayoutOptions) -> Written:
    """vLLM's `medusa` layout. Its LM heads are read from the checkpoint (a shared head as a copy of the
    target's rows), so the target's parts are loaded (runtime/core/target_parts.py: embedding, norm, LM head)
    from `--target`, or the target the heads name; read back with load_medusa and compared."""
    from draftsmith.runtime.core.target_parts import TargetParts
    from draftsmith.runtime.core.targets import recorded_target
    from draftsmith.runtime.heads.medusa import MedusaHeads
    from draftsmith.runtime.heads.medusa_layout import write_vllm

    config = read_json(Path(folder) / CONFIG_FILE, "CHECKPOINT")
    # the recorded target: found here first (the embedded alias, the Hub cache) by its weights hash
    spec = options.target or recorded_target(config.get("target", ""), config.get("target_weights_hash"))
    target = TargetParts.load(spec, device="cpu")
    heads = MedusaHeads.from_pretrained(folder, target)
    write_vllm(heads, target, out)
    back = read_any(out, target)
    c = heads.config
    lm = "a copy of the target's LM head (shared in training)" if c.original_lm_head else "own LM heads"
    details = [
        f"{c.num_heads} Medusa head(s) of {c.num_layers} residual block(s); {lm}",
        f"draft vocabulary: {c.out_vocab} of {c.vocab_size} target tokens"
        + (" (`token_map`)" if c.out_vocab < c.vocab_size else ""),
    ]
    tensors = {k: v for k, v in back.state_dict().items() if k.startswith(("blocks.", "lm_heads."))}
    return checked_export(back, heads, tensors, "medusa", details, whose="heads'")


# ---- the model card's serve texts -------------------------------------------------------------------------
def serve_vllm(args: ServeArgs) -> str:
    """vLLM's speculative config (vllm/config/speculative.py: `method`, `model`, `num_speculative_tokens`)."""
    return (
        "## Serve\n\nvLLM (its Medusa proposer drafts a chain, one token per head):\n\n"
        f"{VLLM.serve_command(args)}\n"
        f"draftsmith (trees too: `--tree cartesian:3,2,1` or `--tree sparse:15`):\n\n{args.generate}"
    )


KIND = HeadKind(
    name="medusa",
    title="Medusa heads",
    about="Medusa heads: our folder, vLLM's or FasterDecoding's layout; --tree cartesian:K1,.. or sparse:N "
    "too",
    module_class=lazy_class("draftsmith.runtime.heads.medusa", "MedusaHeads"),
    section=MedusaSection,
    read=read_any,
    spec="medusa:DIR",
    layouts={
        "medusa": Layout(
            write=write_vllm_layout,
            serve=serve_vllm,
            reads="target",
            about="vLLM's `method: medusa` layout (MedusaModel: blocks.K.layers.J, lm_heads.K or one shared "
            "lm_head, token_map for a reduced vocabulary)",
            no_fp8="vLLM's Medusa (vllm/model_executor/models/medusa.py) builds plain nn.Linear blocks "
            "without a quantization config and would load e4m3 values as bf16 without their scales",
        )
    },
    default_depth=default_depth,
    parse_tree=parse_tree,
    cotrain=True,  # Medusa-2: the target trains with the heads (train/objectives/medusa2.py)
    vllm=VLLM,
)
