"""The serving core's base: the target, its caches, plain and speculative decoding, configs.

- `target` (the target adapter: forward over a KV cache with positions and tree masks, hidden states
  after chosen layers, norm and LM head), `families` (the registry of target families: what the adapter
  does per family), `layer_inputs` (each layer's mask and rotary embedding: sliding windows, eager masks,
  per-layer-type rope), `targets` (resolving --target specs, GGUF conversion cache),
  `target_parts` (offline training's embedding, norm and LM head alone), `checkpoint_index` (where each
  tensor of a sharded checkpoint lives; `block_fp8`: DeepSeek-V3's block-scaled FP8 read dequantized),
  `placement` (the frozen target whole on every rank, tensor or expert parallel), `placement_moe` (its
  split of MoE experts), `transformers_range` (the transformers releases those splits are tested on),
  `launch` (what torchrun says, the process group and waits on other ranks), `split_run` (a verb's work
  on rank 0 of a split target, the other ranks replaying its calls), `collectives` (the all-reduces,
  broadcasts and gathers a process issues, and their bytes, by phase);
- caches and attention: `kv_cache`, `masks`, `kernel_attention` (tree attention through draftsmith.kernels),
  `mla` (what an MLA target's cache holds: a latent and a rope key of two widths);
- `quantize`: weight-only int8/int4 (CPU) and fp8 (CUDA) linears for the target and for drafts;
- `row_linear`: fp32 CPU linears over few rows as `W @ x^T` where it measured faster (`--cpu-linears`);
- engines: `engine` (plain decoding), `speculative` (propose -> verify in one forward -> accept -> commit),
  `cycle_timing` (each cycle's draft and verify time), `static_forward` (the GPU engine path: the
  target's forward on a static cache written through device-side indices, one CUDA graph per shape);
- shared: `config` (strict dataclass + YAML configs), `prompts`
  (prompt files), `chat_template` (the template's thinking mode: which templates have one, the mode
  prompts render with, the template identity data and heads record), `artifacts` (hashes, atomic tensor
  files, draft-vocabulary files), `forwarding`
  (read-only properties that read through another object: `forwarded("config.hidden_size")`).
"""
