"""A probe for serving checks: a 2-layer, norm_output EAGLE-3 head for the embedded target, made of the
trained recipe head's tensors plus a second layer with small random weights (it perturbs, it does not
erase what the head learned), so acceptance is high enough for counts to be compared with an engine's.

    python scripts/studies/two_layer_probe_head.py        # reads runs/eagle3-smollm2-135m/final
    draftsmith bench --prompts sharegpt --num-prompts 6 --max-new-tokens 64 --temperatures 0 \
        --batch-sizes 1 --draft eagle3:runs/eagle3-2layer-probe@chain:2 \
        --baselines plain,vllm-eagle3:runs/eagle3-2layer-probe@chain:2 --no-plots --out runs/bench-2layer-vllm
"""

import dataclasses

import torch

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.eagle3 import Eagle3Head, load_head, save_head

target = Target.load("smollm2-135m", device="cpu")
base = load_head("runs/eagle3-smollm2-135m/final", target)
cfg = dataclasses.replace(base.config, num_layers=2, norm_output=True)
head = Eagle3Head(cfg)
torch.manual_seed(0)
state = head.state_dict()
for k, v in base.state_dict().items():
    state[k] = v
for k, v in state.items():
    if k.startswith("layers.1.") and k.endswith("proj.weight"):
        state[k] = torch.randn_like(v) * (
            0.002 if k.endswith(("o_proj.weight", "down_proj.weight")) else 0.05
        )
head.load_state_dict(state)
save_head(head.eval(), "runs/eagle3-2layer-probe")
print("saved", cfg.num_layers, cfg.norm_output)
