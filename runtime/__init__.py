"""draftsmith.runtime: everything serving needs, importable without accelerate, deepspeed, datasets or wandb.

Modules: `target` (the target adapter: forward over a KV cache with positions and tree masks, hidden
states after chosen layers, norm and LM head), `targets` (resolving --target specs, GGUF conversion cache),
`kv_cache`, `masks`, `tree` (draft trees: masks, positions, paths, dynamic-tree selection),
`sampling`, `engine` (the plain decoding loop), `drafting` (the drafter protocol and the registry of
--draft specs), `ngram` and `lm_drafter` (drafters), `acceptance` (greedy and exact rejection-sampling
rules over a tree), `speculative` (propose -> verify in one forward -> accept -> commit),
`side_by_side` (timing against transformers), `config` (strict dataclass + YAML configs), `cli` (the
`draftsmith` command).

Words: target (the model whose distribution is preserved), draft/drafter, head (a trained draft module on
the target's features), tree (nodes with parents; a path runs root to leaf), accepted / recovered / bonus
tokens, tau = mean tokens committed per target forward (bonus included). Shapes: B batch, T tokens,
N tree nodes, K depth, V vocab, H hidden, L layers.
"""
