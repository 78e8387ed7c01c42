"""The negative control of scripts/check_vllm.sh mtp: a copy of an `export --format mtp-mimo` folder whose MTP
layer's input_proj has its column halves back in our order.

    python scripts/mimo_unswapped.py EXPORT_DIR CONTROL_DIR

Our MTP module concatenates [norm(embed(t+1)); norm(h_t)] (DeepSeek-V3's eh_proj order); vLLM's MiMo MTP
layer concatenates [hidden; embed], so the export swaps input_proj's [H, 2H] column halves
(runtime/heads/mtp_layout.py `mimo_module`). This copy undoes the swap: served by vLLM it reads the token
embedding where the hidden state belongs, the concatenation-order bug a converter makes most easily, and its
acceptance counts must differ from draftsmith's. The target's shards are hard links (nothing is copied but
the shard that holds the MTP layer).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

NAME = "model.mtp_layers.0.input_proj.weight"


def main(src: str, dst: str) -> int:
    src_dir, dst_dir = Path(src), Path(dst)
    shutil.rmtree(dst_dir, ignore_errors=True)
    shutil.copytree(src_dir, dst_dir, copy_function=os.link)
    for path in sorted(dst_dir.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            if NAME not in f.keys():
                continue
        tensors = load_file(path)
        weight = tensors[NAME]  # [H, 2H] over [h; embed]
        hidden = weight.shape[1] // 2
        tensors[NAME] = torch.cat([weight[:, hidden:], weight[:, :hidden]], dim=1).contiguous()
        tmp = path.with_suffix(".tmp")
        save_file(tensors, tmp, metadata={"format": "pt"})
        os.replace(
            tmp, path
        )  # a new file: the hard link to the export's shard is broken, not written through
        print(f"   control: {NAME} column halves swapped back in {path}")
        return 0
    raise SystemExit(f"{src}: no {NAME} in any shard (not an `export --format mtp-mimo` folder?)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
