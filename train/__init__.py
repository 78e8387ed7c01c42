"""draftsmith.train: heads' training objectives, the Accelerate loop, checkpoints (export arrives later).

    draftsmith train --config configs/eagle3-smollm2-135m.yaml [key=value ...]
    accelerate launch --config_file configs/accelerate/ddp-cpu.yaml -m draftsmith.train --config ...

Modules: `config` (the TrainConfig schema), `data_steps` (prepare / vocab / capture run or reused before
training; the sample order), `eagle3_objective` (the training-time test: K-step unroll with the drafter's
tree mask, soft cross-entropy on the draft vocabulary, per-step accuracy, simulated tau), `ttt_attention`
(its attention without a dense mask: causal + diagonal keys merged by log-sum-exp), `eagle3_data`
(online and offline batches), `mtp_objective` (MTP modules: distillation or data labels, per-module
accuracy), `cotrain` (LoRA / full co-training of the target, the drift report), `heads` (what the loop
needs per head type), `trainer` (the loop, numerics guard), `accelerator_setup` (process group,
precision, DeepSpeed), `checkpoints` (atomic, rotated, exact resume), `metrics` (metrics.jsonl,
trackers, the PNG curve).
"""
