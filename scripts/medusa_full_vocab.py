"""A full-vocabulary copy of a Medusa head folder whose heads share the target's LM head over a reduced
draft vocabulary (`head.reduce_vocab: true`, `original_lm_head: true`): same blocks, the target's whole LM
head. vLLM 0.32 cannot load a Medusa `token_map` (runtime/heads/medusa_layout.py says why), so
scripts/check_vllm.sh medusa checks this copy: both engines then draft the argmax over all ids.

    python scripts/medusa_full_vocab.py runs/medusa-smollm2-135m/final runs/x/medusa-full-vocab
"""

from __future__ import annotations

import sys
from dataclasses import replace

from draftsmith.runtime.heads.medusa import MedusaHeads


def main(src: str, dst: str) -> int:
    heads = MedusaHeads.from_pretrained(src)
    cfg = heads.config
    if not cfg.original_lm_head:
        raise SystemExit(
            f"{src}: its heads have LM heads of their own over {cfg.out_vocab} ids: no full copy"
        )
    full = MedusaHeads(replace(cfg, draft_vocab_size=None))
    own = {k: v for k, v in heads.state_dict().items() if k.startswith("blocks.")}
    missing, unexpected = full.load_state_dict(own, strict=False)
    assert not unexpected and all(not k.startswith("blocks.") for k in missing), (missing, unexpected)
    full.save_pretrained(dst)
    print(f"   {dst}: {cfg.num_heads} heads over all {cfg.vocab_size} ids (was {cfg.out_vocab})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
