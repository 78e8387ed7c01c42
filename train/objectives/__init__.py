"""What a run trains: one objective per head kind, registered by the kind's name, and what they share.

    kind = objective(cfg.head.type)(cfg, target, aux_layers, paths)   # registry.py; the loop trains it

- `registry`: the objectives by head kind (runtime/heads/head_kinds.py registers the kinds);
- `heads`: the EAGLE-3 and MTP objectives (what the loop needs per kind); `medusa_objective` (Medusa-1
  heads: per-head soft or data cross-entropy, the sparse tree's calibration), `dflash_objective` (DFlash:
  blocks at random anchors, position-weighted soft cross-entropy), `peagle_objective` (P-EAGLE: all K block
  positions from one context, per-position soft cross-entropy), `dspark_objective` (DSpark: DFlash's blocks
  with the Markov bias, plus TVD and the confidence head's BCE, its calibration error);
- EAGLE-3's training-time test: `eagle3_objective` (the K-step unroll with the drafter's tree mask, soft
  cross-entropy on the draft vocabulary, per-step accuracy, simulated tau), `ttt_attention` (its attention
  without a dense mask: causal + diagonal keys merged by log-sum-exp), `draft_losses` (its other losses,
  pure torch: reverse KL, JSD, TV = 1 - acceptance, LK hybrid), `eagle3_levers` (head.loss, the TTT
  schedule and step weights, feature noise), `eagle3_data` (online and offline batches);
- `head_init`: what building a fresh head shares (the draft vocabulary's ids, the target's LM head and norm);
- `mtp_objective`: MTP modules (distillation or data labels, per-module accuracy);
- co-training the target: `cotrain` (LoRA / full, the drift report), `eagle3_cotrain` (EAGLE-3: L_next + w *
  L_eagle3 on the target's own features), `medusa2` (Medusa-2: lambda0's warmup, self-distillation).
"""
