"""draftsmith.train: heads' training objectives, the Accelerate loop, checkpoints, export and model cards.

    draftsmith train --config configs/eagle3-smollm2-135m.yaml [key=value ...]
    accelerate launch --config_file configs/accelerate/ddp-cpu.yaml -m draftsmith.train --config ...

Modules: `config` (the TrainConfig schema), `data_steps` (prepare / vocab / capture run or reused before
training; the sample order), `eagle3_objective` (the training-time test: K-step unroll with the drafter's
tree mask, soft cross-entropy on the draft vocabulary, per-step accuracy, simulated tau), `draft_losses`
(its other losses, pure torch: reverse KL, JSD, TV = 1 - acceptance, LK hybrid), `eagle3_levers` (head.loss,
the TTT schedule and step weights, feature noise), `ttt_attention`
(its attention without a dense mask: causal + diagonal keys merged by log-sum-exp), `eagle3_data` (online
and offline batches), `mtp_objective` (MTP modules: distillation or data labels, per-module accuracy),
`medusa_objective` (Medusa-1 heads: per-head soft or data cross-entropy, the sparse tree's calibration),
`dflash_objective` (DFlash: blocks at random anchors, position-weighted soft cross-entropy),
`peagle_objective` (P-EAGLE: all K block positions from one context, per-position soft cross-entropy),
`medusa2` (Medusa-2: the target co-trained with the heads, lambda0's warmup, self-distillation),
`cotrain` (LoRA / full co-training of the target, the drift report), `eagle3_cotrain` (EAGLE-3 against
a co-trained target: L_next + w * L_eagle3 on the target's own features), `heads` (the EAGLE-3 and MTP
objectives: what the loop needs per head kind), `objectives` (the registry of objectives by head kind;
runtime/heads/head_kinds.py registers the kinds), `trainer` (the loop, numerics guard), `trainer_setup`
(what a run is built from: accelerator, preflight, head inputs, sample order, optimizer), `accelerator_setup`
(process group, precision, DeepSpeed), `checkpoints` (atomic, rotated, exact resume), `metrics`
(metrics.jsonl, trackers, the PNG curve), `preflight`, `preflight_bytes`, `preflight_shapes`,
`preflight_families` (MoE and MLA targets), `preflight_report` (the memory estimate before anything
loads), `preflight_capture` (an offline run's missing capture, counted and planned) and `preflight_plan`
(`train --preflight`: the table, what would fit, the smallest setup), the kinds' own memory terms
(`eagle3_memory`, `mtp_memory`, `medusa_memory`, `dflash_memory`, with `target_memory`: the target inside
a step), `process_group`, `loader`, `hub`
(Hub push), `export` (`draftsmith export`: a head in one of its kind's layouts, read back and compared)
and `model_card`.
`__main__` is what `accelerate launch -m draftsmith.train` runs (the CLI's train verb). Nothing here
imports the runtime's CLI, demo and bench layer (tests/test_imports.py).
"""
