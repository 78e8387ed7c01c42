"""draftsmith.train: heads' training objectives, the Accelerate loop, the memory preflight, export and
model cards.

    draftsmith train --config configs/eagle3-smollm2-135m.yaml [key=value ...]
    accelerate launch --config_file configs/accelerate/ddp-cpu.yaml -m draftsmith.train --config ...

Sub-packages, one idea each:
- `objectives`: what is trained, one objective per head kind (their registry, losses, batches and
  co-training of the target);
- `loop`: the training loop on Accelerate and what it runs on (data steps, loader, checkpoints, metrics);
- `preflight`: the memory estimate before anything loads (with each kind's own memory terms).
Modules: `config` (the TrainConfig schema), `export` (`draftsmith export`: a head in one of its kind's
layouts, read back and compared), `model_card` and `hub` (Hub push).
`__main__` is what `accelerate launch -m draftsmith.train` runs (the CLI's train verb). Nothing here
imports the runtime's CLI, demo and bench layer (tests/test_imports.py).
"""
