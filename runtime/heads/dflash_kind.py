"""The DFlash head kind: what runtime/heads/head_kinds.py registers for `dflash` (runtime/heads/head_kind.py
says what a kind declares).

    head, options = KIND.load_draft("runs/dflash/final", target)           # --draft dflash:DIR
    head, options = KIND.load_draft("runs/dflash/final#block=8", target)   # {"block": 8}: a smaller block
    KIND.parse_tree("runs/dflash/final", "cartesian:3,2,1")       # a tree over per-position top-k
    KIND.all_layouts()["speculators"].write(head_folder, out, LayoutOptions(verifier="org/model"))

The head is runtime/heads/dflash.py, its drafter runtime/drafters/dflash_drafter.py, its engine layouts
runtime/heads/dflash_layout.py; this file holds the `head:` section of a train config (the objective is
train/objectives/dflash_objective.py), the export writers and the model card's serve texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.dflash import DEFAULT_BLOCK, check_block_size, check_window
from draftsmith.runtime.heads.head_kind import DEFAULT_DEPTH, HeadKind, HeadSection, Layout, VllmServe
from draftsmith.runtime.heads.kind_parts import lazy_class, lazy_function, serve_speculators, write_checked

if TYPE_CHECKING:  # the layout functions' annotations
    from draftsmith.runtime.heads.head_kind import LayoutOptions, ServeArgs, Written

BLOCK_OPTION = "#block="
VLLM = VllmServe(layout="dflash", method="dflash")  # z-lab's layout


@dataclass
class DFlashSection(HeadSection):
    """`head:` of a DFlash train config (configs/dflash-smollm2-135m.yaml)."""

    type: Literal["dflash"] = "dflash"
    block_size: int = DEFAULT_BLOCK  # tokens per block, the anchor included (drafts block_size - 1)
    num_layers: int = 1  # draft decoder layers (Qwen3 layers; the paper's Qwen3-8B drafter has 5)
    mask_token_id: int | None = None  # None: the tokenizer's unk, else pad, else the last id
    reduce_vocab: bool = True  # the LM head over the data steps' draft vocabulary (draft_vocab_size ids)
    max_anchors: int = 32  # blocks per row per step, at random supervised anchors (speculators: 512)
    loss_gamma: float = 7.0  # position j weighted exp(-(j-1)/gamma): the paper's 7 for blocks of 16
    window: int | None = None  # sliding-window draft attention: the last `window` context tokens (None: all)

    def validate(self) -> DFlashSection:
        super().validate()
        check_block_size(self.block_size, "head.block_size")
        self.check_at_least("num_layers", 1)
        self.check_at_least("max_anchors", 1)
        if not self.loss_gamma > 0:
            raise BadInputError("head.loss_gamma", self.loss_gamma, "a number > 0")
        check_window(self.window, "head.window")
        return self

    def check_run(self, cfg) -> None:
        check_window(self.window, "head.window", cfg.data.max_length)

    def head_options(self) -> dict:
        """DFlashConfig.for_target's keywords (trainer and preflight build the same head) and the anchors
        per row the memory preflight reads (DFlashKind.new_head drops them)."""
        return self.keywords("block_size", "num_layers", "mask_token_id", "max_anchors", "window")


# ---- drafting ---------------------------------------------------------------------------------------------
def draft_arg(arg: str) -> tuple[str, dict]:
    """`DIR` or `DIR#block=N` -> (DIR, the drafter's {"block": N or None (the trained block)})."""
    folder, sep, size = arg.partition(BLOCK_OPTION)
    if not sep:
        return arg, {"block": None}
    if not size.isdigit():
        raise BadInputError("--draft", f"dflash:{arg}", "dflash:DIR or dflash:DIR#block=N with an integer N")
    return folder, {"block": int(size)}


def parse_tree(arg: str, spec: str):
    """`--tree`: cartesian:K1,K2,.. (top-K_d of block position d) or any runtime/tree.parse_tree_spec spec."""
    from draftsmith.runtime.heads.medusa_tree import parse_medusa_tree

    return parse_medusa_tree(spec)


def default_depth(arg: str) -> int | None:
    """chain:2, or chain:1 for a block of 2."""
    folder, options = draft_arg(arg)
    block, config = options["block"], Path(folder) / "config.json"
    if block is None and config.is_file():
        raw = read_json(config, "--draft")
        block = raw.get("block_size")
    return min(DEFAULT_DEPTH, block - 1) if isinstance(block, int) and block >= 2 else None


read_any = lazy_function("draftsmith.runtime.heads.dflash_layout", "load_dflash")


# ---- export: each layout written, read back as `--draft dflash:DIR` reads it, compared with the head ------
def _details(c) -> list[str]:
    """The model card's lines about a head with config `c`."""
    return [
        f"block of {c.block_size} (anchor + {c.drafts} mask tokens, mask id {c.mask_token_id}), "
        f"{c.num_layers} Qwen3 draft layer(s)",
        f"target features: layer outputs {c.aux_layer_ids} (0-based), fused as every layer's context KV",
        f"draft vocabulary: {c.draft_vocab_size} of {c.vocab_size} target tokens",
    ]


def write_speculators(folder: Path, out: Path, options: LayoutOptions) -> Written:
    from draftsmith.runtime.heads.dflash import load_head
    from draftsmith.runtime.heads.dflash_layout import to_speculators

    head = load_head(folder)
    layout = to_speculators(head, options.verifier)
    return write_checked(out, head, layout, read_any, "speculators", _details(head.config))


def write_zlab(folder: Path, out: Path, options: LayoutOptions) -> Written:
    from draftsmith.runtime.core.targets import local_target_folder
    from draftsmith.runtime.heads.dflash import load_head
    from draftsmith.runtime.heads.dflash_layout import to_zlab

    head = load_head(folder)
    if head.config.window is not None:
        raise BadInputError(
            "--format", "dflash", "speculators for a head with a sliding window (z-lab's layout carries none)"
        )
    target = options.target or head.config.target
    where = local_target_folder(target)
    if where is None:
        raise BadInputError(
            "--target", target, "a local target folder (its config.json gives num_target_layers)"
        )
    layers = read_json(where / "config.json", "--target").get("num_hidden_layers")
    return write_checked(out, head, to_zlab(head, layers), read_any, "dflash", _details(head.config))


def serve_zlab(args: ServeArgs) -> str:
    return (
        f"## Serve\n\nvLLM:\n\n{VLLM.serve_command(args)}\n"
        f"SGLang:\n\n```bash\npython -m sglang.launch_server --model-path {args.target} "
        f"--speculative-algorithm DFLASH --speculative-draft-model-path {args.repo}\n```\n\n"
        f"draftsmith:\n\n{args.generate}"
    )


KIND = HeadKind(
    name="dflash",
    title="DFlash block drafter",
    about="a DFlash block drafter: our folder or its speculators / z-lab export; dflash:DIR#block=N drafts "
    "a smaller block",
    module_class=lazy_class("draftsmith.runtime.heads.dflash", "DFlashHead"),
    section=DFlashSection,
    read=read_any,
    draft_arg=draft_arg,
    spec="dflash:DIR[#block=N]",
    layouts={
        "speculators": Layout(
            write=write_speculators,
            serve=partial(serve_speculators, note="; DFlash drafts a block per forward"),
            reads="verifier",
            about="speculators' DFlash layout (speculators_model_type: dflash), which vLLM serves",
        ),
        "dflash": Layout(
            write=write_zlab,
            serve=serve_zlab,
            reads="target",
            about="z-lab's DFlash layout (DFlashDraftModel, dflash_config) that vLLM and SGLang load",
        ),
    },
    default_depth=default_depth,
    parse_tree=parse_tree,
    vllm=VLLM,
)
