"""The memory preflight: bytes per rank a training run will need, from the target's config.json alone.

    est = estimate(shapes, Knobs.from_config(cfg, shapes), Setup("zero2", world_size=8))   # estimate.py

- `estimate`: the knobs of a config, where it runs, the estimate (the resident terms plus what the kind
  declares); `units` (a `Term`, what one token keeps for backward per layer, norm, linear and kernel);
- `shapes` (what is known of a target without its weights) and `families` (MoE and MLA targets);
- the kinds' own terms, which their objectives declare: `eagle3_memory` (EAGLE-3's and P-EAGLE's unroll),
  `mtp_memory`, `medusa_memory`, `dflash_memory`, with `target_memory` (the target inside a step);
- `report` (the table a run prints at its start, what would fit, the refusal), `capture` (an offline
  run's missing capture, counted and planned) and `plan` (`train --preflight`: the table for every
  strategy, what would fit, the fewest nodes).
"""
