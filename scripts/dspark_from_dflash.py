"""A DSpark head built from a trained DFlash head: the serving check's DSpark head (scripts/check_vllm.sh).

    python scripts/dspark_from_dflash.py heads/dflash-smollm2-135m runs/x/dspark [--rank 16] [--bias 0.5]

DSpark is a DFlash backbone plus a Markov head and a confidence head (runtime/heads/dspark.py). The backbone's
tensors are copied from the DFlash head, so every block position drafts what the trained DFlash head drafts,
and position 1 is accepted as often. The Markov head gets seeded random weights whose bias of position k's
logits by the token at k - 1 has a standard deviation of `--bias` logits: large enough to change some
drafts (so an engine that indexes the Markov embedding by the wrong token, or skips the bias, drafts
differently and its acceptance counts differ), small enough that the backbone's drafts mostly win. The
confidence head keeps a fresh head's seeded init (vLLM reads it only for adaptive verification).
This is a wiring check for an engine's DSpark loader and Markov step, not a trained DSpark head: a fresh
clone ships no DSpark head (a trained one is about twice the 25 MiB cap of scripts/ship_head.py, its
[V, r] Markov embedding over the target's whole vocabulary alone is 25 MB at rank 256 in bfloat16).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict

import torch

from draftsmith.runtime.heads.dflash import load_head as load_dflash
from draftsmith.runtime.heads.dspark import DSparkConfig, DSparkHead, load_head


def build(src: str, dst: str, rank: int, bias: float) -> int:
    dflash = load_dflash(src)
    cfg = DSparkConfig(**{**asdict(dflash.config), "head_type": "dspark", "markov_rank": rank})
    torch.manual_seed(0)
    head = DSparkHead(cfg)
    head.backbone.load_state_dict(dflash.state_dict())
    with torch.no_grad():  # w1 ~ N(0, 1), w2 ~ N(0, bias / sqrt(r)): bias = w2 @ w1[prev] has std `bias`
        head.markov_head.markov_w1.weight.normal_(0, 1)
        head.markov_head.markov_w2.weight.normal_(0, bias / math.sqrt(rank))
    head.save_pretrained(dst)
    load_head(dst)  # strict read-back
    print(f"   {dst}: DSpark head from {src}, Markov rank {rank}, bias std {bias} logits (seeded)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="a DFlash head folder (draftsmith's layout)")
    ap.add_argument("dst", help="the DSpark head folder to write")
    ap.add_argument("--rank", type=int, default=16, help="the Markov head's rank r")
    ap.add_argument("--bias", type=float, default=0.5, help="std of the Markov bias, in logits")
    args = ap.parse_args()
    return build(args.src, args.dst, args.rank, args.bias)


if __name__ == "__main__":
    raise SystemExit(main())
