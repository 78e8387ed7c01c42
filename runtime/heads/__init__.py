"""Head kinds, the heads, and the layouts engines load.

- the registry: `head_kinds` (the one place that maps a kind's name to what it declares) with
  `head_kind` (what a kind declares: config section, module, drafter, export layouts, model-card words),
  and the kinds `eagle3_kind`, `mtp_kind`, `medusa_kind`;
- the heads: `eagle3`, `mtp` (with `mtp_config`, and `mtp_block`: its blocks per family, MoE or dense),
  `medusa` (with its trees `medusa_tree`: cartesian and sparse), `aux_layers` (which target hidden
  states feature heads read);
- engine layouts: `layouts` (EAGLE-3: vLLM, SGLang, speculators), `mtp_layout` (DeepSeek-V3's),
  `medusa_layout` (vLLM's medusa, FasterDecoding's on import).
"""
