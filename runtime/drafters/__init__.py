"""Drafters: what proposes each cycle's tree, as one DraftBatch (runtime/verify/draft_batch.py).

`drafter` (the protocol, with each drafter's state and `fork` for SSD), `drafting` (--draft specs ->
drafters, through the head-kind registry), `registry` (each head kind's drafter), `ngram` (prompt
lookup), `suffix` (suffix decoding) over `suffix_tree` (its tries and draft trees). Every model drafter
is one `grower` (`ModelDrafter`: chain, static and dynamic trees grown on the device) over a step model:
`lm_drafter` (a causal LM over its own cache: `self:layers=N`, `model:TARGET`), `eagle3_drafter`,
`peagle_drafter` (a P-EAGLE block in one head forward; its pairs are EAGLE-3's `PairCache`),
`mtp_drafter`, `medusa_drafter`, `dflash_drafter`, `dspark_drafter` (DFlash's steps with a Markov bias
and survival estimates); `static_steps` (the step models' forwards on static
caches, one CUDA graph per shape, for the GPU engine path); `ssd` (speculative speculative decoding:
pre-drafted next cycles, in process), `draft_process` (the drafter in its own process over
torch.distributed, optionally with SSD).
"""
