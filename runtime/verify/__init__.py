"""Draft trees, sampling and acceptance: the pure math of lossless verification (imports only torch).

- trees: `tree` (parents and depths; the functions verification needs), `draft_tree` (one cycle's tree
  per row, grown on the device), `draft_batch` (the cycle's drafts as the device tensors verification
  and acceptance read, and the host `Draft`);
- sampling and acceptance: `sampling` (temperature, top-k/p), `acceptance` (greedy and exact
  rejection-sampling rules over a tree), `batch_accept` (the whole batch in one kernel call), `near_tie`
  (greedy identity up to near-ties for bf16/GPU runs);
- `load_aware` (auto:K: each cycle's depth from measured costs and observed acceptance), `adaptive`
  (adaptive:K: each row verifies the prefix of its chain that pays best, by a stopping rule on the
  drafter's survival estimates), `calibration` (the expected calibration error of survival estimates and
  a run's tally of them against what was accepted), `recalibration` (Platt scaling of survival estimates
fitted to a run's verified slots, and the AUROC it keeps);
- `ssd_fanout` (SSD's outcome prediction: the geometric fan-out, branch order, hit accounting).
"""
