"""A P-EAGLE head built from a trained EAGLE-3 head, and an engine export with its aux-layer ids shifted.

    python scripts/peagle_from_eagle3.py head heads/eagle3-smollm2-135m runs/x/peagle [--block 4]
    python scripts/peagle_from_eagle3.py shift-aux runs/x/peagle-vllm runs/x/peagle-vllm-aux-plus-1

`head`: P-EAGLE extends the EAGLE-3 head (runtime/heads/peagle.py): same layers, fc, norms, LM head and
draft vocabulary, plus `mask_hidden` [1, 1, A*Ht] and `mask_embed` [H]. The shared tensors are copied;
the two extra ones start as a fresh P-EAGLE head's do: `mask_hidden` randn (seed 0, speculators' init)
and `mask_embed` the target's embedding of `mask_token_id` (train/objectives/peagle_objective.py's
init_from_target). Depth 1 of a block is then the EAGLE-3 head's draft, so the head has real acceptance
at position 0 without any training (scripts/check_vllm.sh peagle needs that: an untrained head accepts
nothing, and a negative control could not differ).

`shift-aux`: a copy of an export folder (vLLM, speculators or z-lab DFlash layout) whose aux-layer ids are
one layer later: the negative control of scripts/check_vllm.sh peagle, dflash and dspark, which must NOT
reproduce the acceptance.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.runtime.heads.eagle3 import load_head as load_eagle3
from draftsmith.runtime.heads.eagle3_kind import _verifier_facts
from draftsmith.runtime.heads.peagle import PEagleConfig, PEagleHead, load_head, save_head

# EAGLE-3 / speculators keys, and z-lab DFlash's dflash_config.target_layer_ids
AUX_KEYS = ("eagle_aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids", "target_layer_ids")


def build(src: str, dst: str, block: int) -> int:
    eagle3 = load_eagle3(src)
    cfg = PEagleConfig(**{**asdict(eagle3.config), "head_type": "peagle", "block_size": block})
    cfg.validate()
    torch.manual_seed(0)
    head = PEagleHead(cfg)
    shared = {k: v for k, v in eagle3.state_dict().items() if not k.startswith("rotary.")}
    missing, unexpected = head.load_state_dict(shared, strict=False)
    extra = {k for k in missing if not k.startswith("rotary.")}
    if unexpected or extra != {"mask_hidden", "mask_embed"}:
        raise SystemExit(
            f"{src}: not an EAGLE-3 head P-EAGLE extends (missing {extra}, unexpected {unexpected})"
        )
    embed = _verifier_facts(cfg.target).get("embed_tokens")
    if embed is None:
        raise SystemExit(f"{cfg.target}: no local target folder with model.embed_tokens.weight")
    with torch.no_grad():
        head.mask_embed.copy_(embed[cfg.mask_token_id].float())
    save_head(head, dst)
    load_head(dst)  # strict read-back
    print(f"   {dst}: P-EAGLE head from {src}, block {block}, mask token id {cfg.mask_token_id}")
    return 0


def shift_aux(src: str, dst: str) -> int:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = Path(dst) / "config.json"
    config = json.loads(path.read_text())
    found = _shift(config)
    if not found:
        raise SystemExit(f"{src}/config.json: no aux-layer ids ({', '.join(AUX_KEYS)})")
    path.write_text(json.dumps(config, indent=1) + "\n")
    print(f"   {dst}: aux-layer ids one layer later: {found}")
    return 0


def _shift(node) -> list:
    """Every aux-id list in the (nested) config, shifted by +1 in place; the new lists."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in AUX_KEYS and isinstance(value, list):
                node[key] = [i + 1 for i in value]
                found.append(node[key])
            else:
                found += _shift(value)
    elif isinstance(node, list):
        for value in node:
            found += _shift(value)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("head", help="EAGLE-3 head folder -> P-EAGLE head folder")
    h.add_argument("src")
    h.add_argument("dst")
    h.add_argument("--block", type=int, default=4, help="block_size K (tokens per forward)")
    s = sub.add_parser("shift-aux", help="export folder -> a copy with aux-layer ids + 1 (the control)")
    s.add_argument("src")
    s.add_argument("dst")
    args = ap.parse_args()
    return build(args.src, args.dst, args.block) if args.cmd == "head" else shift_aux(args.src, args.dst)


if __name__ == "__main__":
    sys.exit(main())
