"""Drafters: what proposes each cycle's tree.

`drafter` (the protocol and the `Draft` a cycle returns), `drafting` (--draft specs -> drafters, through
the head-kind registry), `ngram` (prompt lookup), `suffix` (suffix decoding) over `suffix_tree` (its
tries and draft trees), `lm_drafter` (a causal LM over its own cache:
`self:layers=N`, `model:TARGET`), `eagle3_drafter`, `mtp_drafter`, `medusa_drafter`, `dflash_drafter`,
`peagle_drafter` (a P-EAGLE block in one head forward);
`ssd` (speculative speculative decoding: pre-drafted next cycles, in process), `draft_process` (the drafter
in its own process over torch.distributed, optionally with SSD).
"""
