"""Drafters: what proposes each cycle's tree.

`drafter` (the protocol and the `Draft` a cycle returns), `drafting` (--draft specs -> drafters, through
the head-kind registry), `ngram` (prompt lookup), `lm_drafter` (a causal LM over its own cache:
`self:layers=N`, `model:TARGET`), `eagle3_drafter`, `mtp_drafter`, `medusa_drafter`.
"""
