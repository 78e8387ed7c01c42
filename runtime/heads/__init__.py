"""Head kinds, the heads, and the layouts engines load.

- the registry: `head_kinds` (the one place that maps a kind's name to what it declares) with
  `head_kind` (what a kind declares: config section, module, drafter, export layouts, model-card words),
  the kinds `eagle3_kind`, `mtp_kind`, `medusa_kind`, `dflash_kind`, `dspark_kind`, `peagle_kind`, and
  `kind_parts` (the helpers they share: lazy imports, a layout written, read back and compared, the
  speculators serve text);
- `head_folder`: the one strict reader of head folders every kind's loader calls (files, head_type, config
  keys, tensor names, shapes and values); `trained_for`: the chat template and thinking mode a head was
  trained with (its config's record), checked against the target it is served with;
- the heads: `eagle3` (with `eagle3_binding`: a co-trained head's binding to its target's weights),
  `mtp` (with `mtp_config`, and `mtp_block`: its blocks per family, MoE or dense), `medusa` (with its
  trees `medusa_tree`: cartesian and sparse), `dflash` (the DFlash block drafter), `dspark` (DSpark: a
  DFlash backbone with a Markov head and a confidence head),
  `peagle` (P-EAGLE: the EAGLE-3 head drafting K positions in one forward), `aux_layers` (which
  target hidden states feature heads read), `draft_vocab` (the reduced draft vocabulary EAGLE-3 and DFlash
  heads share: `d2t`, `t2d`);
- engine layouts: `layouts` (EAGLE-3: vLLM, SGLang, speculators; `sglang_versions`: the first SGLang
  release that reads each EAGLE-3.1 option), `mtp_layout` (DeepSeek-V3's;
  `mtp_stream` writes it shard by shard), `mtp_speculators` (speculators' MTP),
  `medusa_layout` (vLLM's medusa, FasterDecoding's on import), `dflash_layout` (speculators', z-lab's),
  `dspark_layout` (speculators' DSpark);
- `eagle3_gguf`: an EAGLE-3 head as llama.cpp's GGUF, written by llama.cpp's own converter and checked.
- `int8_folder`: any kind's head stored int8 in draftsmith's folder, loaded as int8 by `--draft`.
- `fp8_checkpoint`: EAGLE-3 exports in FP8 with the compressed-tensors `quantization_config` vLLM loads,
  read back (dequantized) by the EAGLE-3 readers; which layout `export --quantize` accepts.
"""
