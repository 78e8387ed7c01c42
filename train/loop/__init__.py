"""The training loop on Accelerate and what it runs on.

    train(load_train_config("configs/eagle3-smollm2-135m.yaml"))   # trainer.py: one run to final/

- `trainer`: the loop (steps, evaluation, the numerics guard, the end) and `trainer_setup` (what a run is
  built from: accelerator, preflight, head inputs, sample order, optimizer);
- `accelerator_setup` (process group, precision, DeepSpeed's "auto" values) and `process_group` (its
  timeout, the waits around the data steps);
- `data_steps` (prepare / vocab / capture run or reused before training; the sample order) and `loader`
  (micro-batch rows read ahead of the step);
- `checkpoints` (atomic, rotated, exact resume) and `metrics` (metrics.jsonl, trackers, the PNG curve).
"""
