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
from typing import Literal

from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads.dflash import DEFAULT_BLOCK, check_block_size
from draftsmith.runtime.heads.head_kind import (
    DEFAULT_DEPTH,
    HeadKind,
    HeadSection,
    Layout,
    LayoutOptions,
    ServeArgs,
    VllmServe,
    Written,
    lazy_class,
    lazy_function,
    serve_speculators,
    write_checked,
)

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

    def validate(self) -> DFlashSection:
        super().validate()
        check_block_size(self.block_size, "head.block_size")
        if self.num_layers < 1:
            raise BadInputError("head.num_layers", self.num_layers, "an integer >= 1")
        if self.max_anchors < 1:
            raise BadInputError("head.max_anchors", self.max_anchors, "an integer >= 1")
        if not self.loss_gamma > 0:
            raise BadInputError("head.loss_gamma", self.loss_gamma, "a number > 0")
        return self

    def head_options(self) -> dict:
        """DFlashConfig.for_target's keywords (trainer and preflight build the same head) and the anchors
        per row the memory preflight reads (DFlashKind.new_head drops them)."""
        options = dict(
            block_size=self.block_size, num_layers=self.num_layers, mask_token_id=self.mask_token_id
        )
        return {**options, "max_anchors": self.max_anchors}


# ---- drafting ---------------------------------------------------------------------------------------------
def split_arg(arg: str) -> tuple[str, int | None]:
    """`DIR` or `DIR#block=N` -> (DIR, N or None)."""
    folder, sep, size = arg.partition(BLOCK_OPTION)
    if not sep:
        return arg, None
    if not size.isdigit():
        raise BadInputError("--draft", f"dflash:{arg}", "dflash:DIR or dflash:DIR#block=N with an integer N")
    return folder, int(size)


def load_draft(arg: str, target):
    """`dflash:DIR[#block=N]` -> the head and {"block": N or None (the trained block)}."""
    from draftsmith.runtime.heads.dflash_layout import load_dflash

    folder, block = split_arg(arg)
    return load_dflash(folder, target).to(device=target.device, dtype=target.dtype), {"block": block}


def parse_tree(arg: str, spec: str):
    """`--tree`: cartesian:K1,K2,.. (top-K_d of block position d) or any runtime/tree.parse_tree_spec spec."""
    from draftsmith.runtime.heads.medusa_tree import parse_medusa_tree

    return parse_medusa_tree(spec)


def default_depth(arg: str) -> int | None:
    """chain:2, or chain:1 for a block of 2."""
    folder, block = split_arg(arg)
    config = Path(folder) / "config.json"
    if block is None and config.is_file():
        raw = read_json(config, "--draft")
        block = raw.get("block_size")
    return min(DEFAULT_DEPTH, block - 1) if isinstance(block, int) and block >= 2 else None


read_any = lazy_function("draftsmith.runtime.heads.dflash_layout", "load_dflash")


# ---- export -----------------------------------------------------------------------------------------------
def _write(head, config: dict, tensors: dict, out: Path, what: str) -> Written:
    """Write the layout, read it back as `--draft dflash:DIR` does, compare with the head."""
    write_checked(out, config, tensors, read_any, head.state_dict(), head.config, what)
    c = head.config
    details = [
        f"block of {c.block_size} (anchor + {c.drafts} mask tokens, mask id {c.mask_token_id}), "
        f"{c.num_layers} Qwen3 draft layer(s)",
        f"target features: layer outputs {c.aux_layer_ids} (0-based), fused as every layer's context KV",
        f"draft vocabulary: {c.draft_vocab_size} of {c.vocab_size} target tokens",
    ]
    return Written.of_head(c, tensors, details)


def write_speculators(folder: Path, out: Path, options: LayoutOptions) -> Written:
    from draftsmith.runtime.heads.dflash import load_head
    from draftsmith.runtime.heads.dflash_layout import to_speculators

    head = load_head(folder)
    config, tensors = to_speculators(head, options.verifier)
    return _write(head, config, tensors, out, "speculators")


def write_zlab(folder: Path, out: Path, options: LayoutOptions) -> Written:
    from draftsmith.runtime.core.targets import local_target_folder
    from draftsmith.runtime.heads.dflash import load_head
    from draftsmith.runtime.heads.dflash_layout import to_zlab

    head = load_head(folder)
    target = options.target or head.config.target
    where = local_target_folder(target)
    if where is None:
        raise BadInputError(
            "--target", target, "a local target folder (its config.json gives num_target_layers)"
        )
    layers = read_json(where / "config.json", "--target").get("num_hidden_layers")
    config, tensors = to_zlab(head, layers)
    return _write(head, config, tensors, out, "dflash")


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
    load_draft=load_draft,
    spec="dflash:DIR[#block=N]",
    layouts={
        "speculators": Layout(
            write=write_speculators,
            read=read_any,
            serve=partial(serve_speculators, note="; DFlash drafts a block per forward"),
            reads="verifier",
            about="speculators' DFlash layout (speculators_model_type: dflash), which vLLM serves",
        ),
        "dflash": Layout(
            write=write_zlab,
            read=read_any,
            serve=serve_zlab,
            reads="target",
            about="z-lab's DFlash layout (DFlashDraftModel, dflash_config) that vLLM and SGLang load",
        ),
    },
    default_depth=default_depth,
    parse_tree=parse_tree,
    vllm=VLLM,
)
