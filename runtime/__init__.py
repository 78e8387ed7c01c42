"""draftsmith.runtime: everything serving needs, importable without accelerate, deepspeed, datasets or wandb.

The serving core (it imports neither draftsmith.train nor draftsmith.data_recipes, not even inside a
function; tests/test_imports.py checks every import):
- target and caches: `target` (the target adapter: forward over a KV cache with positions and tree
  masks, hidden states after chosen layers, norm and LM head), `targets` (resolving --target specs, GGUF
  conversion cache), `target_parts` (offline training's embedding, norm and LM head alone),
  `checkpoint_index`, `placement` (tensor parallel), `kv_cache`, `masks`, `kernel_attention`;
- trees, sampling, acceptance: `tree`, `draft_tree`, `load_aware` (auto:K), `sampling`, `acceptance`
  (greedy and exact rejection-sampling rules over a tree), `batch_accept`, `near_tie`;
- heads and their kinds: `head_kinds` (the registry of head kinds: module, train-config section,
  drafter, export layouts, model-card words; the only place that maps a kind's name) with `head_kind`
  (what a kind declares), `eagle3_kind`, `mtp_kind` and `medusa_kind`; the heads `eagle3`, `mtp` (with
  `mtp_config`), `medusa` (with its trees `medusa_tree`: cartesian and sparse), their engine layouts
  `layouts`, `mtp_layout` and `medusa_layout`, `aux_layers`, `artifacts` (hashes, tensor files);
- drafters: `drafter` (the protocol), `drafting` (--draft specs -> drafters), `ngram`, `lm_drafter`,
  `eagle3_drafter`, `mtp_drafter`, `medusa_drafter`;
- engines: `engine` (plain decoding), `speculative` (propose -> verify in one forward -> accept ->
  commit), `static_forward` and `static_draft` (the GPU path: static caches, CUDA graphs);
- shared: `config` (strict dataclass + YAML configs), `errors`, `prompts` (prompt files), `worker_process`
  (a JSON-lines worker in another Python: start, read, stop; the vLLM method and data steps use it).

The CLI, demo and bench layer (may import everything; nothing in the core, train, data_recipes or
kernels imports it): `cli`, `cli_args`, `cli_bench`, `cli_data`, `cli_export` (the `draftsmith`
command), `demo`, `bench`, `bench_methods`, `bench_report`, `bench_run`, `bench_types`, `prompt_sets`
(held-out prompt sets), `roofline`, `side_by_side` and `speed` (timing against transformers),
`vllm_method` and `vllm_worker` (vLLM baselines).

Words: target (the model whose distribution is preserved), draft/drafter, head (a trained draft module on
the target's features), tree (nodes with parents; a path runs root to leaf), accepted / recovered / bonus
tokens, tau = mean tokens committed per target forward (bonus included). Shapes: B batch, T tokens,
N tree nodes, K depth, V vocab, H hidden, L layers.
"""
