"""The negative control of scripts/check_vllm.sh medusa: a copy of a vLLM-layout Medusa export with heads 0
and 1 swapped (their blocks and, when each head has its own, their LM heads).

    python scripts/swap_medusa_heads.py EXPORT_DIR CONTROL_DIR

Served by vLLM, the copy drafts token t+3 where t+2 belongs and back, so its acceptance counts must differ
from draftsmith's on the true export; if they did not, equal counts on the true export would prove nothing
about the head order (head k predicts token t+k+2: Cai et al. 2024, Medusa, section 2.1.1).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

HEAD_INDEX = re.compile(r"^(blocks|lm_heads)\.([01])\.")


def swapped_name(name: str) -> str:
    """`blocks.0.x` <-> `blocks.1.x`, `lm_heads.0.x` <-> `lm_heads.1.x`; every other name unchanged."""
    match = HEAD_INDEX.match(name)
    if not match:
        return name
    other = "1" if match.group(2) == "0" else "0"
    return f"{match.group(1)}.{other}." + name[match.end() :]


def main(src: str, dst: str) -> int:
    src_dir, dst_dir = Path(src), Path(dst)
    if dst_dir.exists():
        shutil.rmtree(dst_dir)
    shutil.copytree(src_dir, dst_dir)
    (files,) = [list(src_dir.glob("*.safetensors"))]
    for path in files:
        tensors = load_file(path)
        swapped = {swapped_name(name): t for name, t in tensors.items()}
        moved = sum(swapped_name(n) != n for n in tensors)
        if moved == 0:
            raise SystemExit(f"{path}: no blocks.0/1 or lm_heads.0/1 tensors to swap (fewer than 2 heads?)")
        save_file(swapped, dst_dir / path.name, metadata={"format": "pt"})
        print(f"   control: {moved} tensors of heads 0/1 swapped in {dst_dir / path.name}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
