"""draftsmith.train: heads' training objectives, the Accelerate loop, checkpoints, export and Hub push.

Modules so far: `eagle3_objective` (EAGLE-3 training-time test: the K-step unroll with the drafter's tree
mask, soft cross-entropy on the draft vocabulary, per-step accuracy and simulated tau), `eagle3_data`
(online and offline batches: the frozen target inside the step, or `data capture` shards). The trainer loop,
checkpoints, resume and export arrive with the EAGLE-3, MTP and export issues.
"""
