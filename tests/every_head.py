"""A random head of every layout the runtime reads, saved for one tiny target (tests/runtime/
test_eval_leaderboard.py ranks them; tests/runtime/test_eval_replay.py replays them): EAGLE-3 in
draftsmith's and in speculators' layout, P-EAGLE, MTP, Medusa, DFlash, DSpark."""

import json
from pathlib import Path

import torch
from dflash_heads import random_head as random_dflash
from dspark_heads import random_head as random_dspark
from medusa_heads import random_heads as random_medusa
from peagle_heads import AUX
from peagle_heads import random_head as random_peagle
from safetensors.torch import save_file

from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.runtime.heads.eagle3 import save_head as save_eagle3
from draftsmith.runtime.heads.layouts import to_speculators
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.heads.mtp import save_head as save_mtp
from draftsmith.runtime.heads.peagle import save_head as save_peagle


def save_every_head(tiny, tiny_dir: Path, root: Path) -> Path:
    """One folder per layout under `root` (eagle3, eagle3-speculators, peagle, mtp, medusa, dflash,
    dspark) for the loaded tiny target `tiny` saved at `tiny_dir` -> root."""
    torch.manual_seed(1)
    eagle3 = Eagle3Head(Eagle3Config.for_target(tiny, aux_layer_ids=AUX))
    save_eagle3(eagle3, root / "eagle3")
    config, tensors = to_speculators(eagle3, verifier=str(tiny_dir))
    (root / "eagle3-speculators").mkdir()
    (root / "eagle3-speculators" / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(root / "eagle3-speculators" / "model.safetensors"), {"format": "pt"})
    save_peagle(random_peagle(tiny, block_size=3), root / "peagle")
    torch.manual_seed(2)
    save_mtp(MtpHead(MtpConfig.for_target(tiny, num_modules=1)), root / "mtp")
    random_medusa(tiny, heads=2).save_pretrained(root / "medusa")
    random_dflash(tiny, block=4).save_pretrained(root / "dflash")
    random_dspark(tiny, block=4).save_pretrained(root / "dspark")
    return root
