"""draftsmith.data_recipes: conversations -> training data for draft heads (`draftsmith data ...`).

Modules: `sources` (ShareGPT bundle, local JSON/JSONL/Parquet, prompt lists, `datasets` names ->
normalized conversations, bad rows skipped and counted), `templating` (chat template rendering and
assistant-only loss masks by the render-boundary method), `prepare` (the prepared DatasetDict folder),
`regenerate` (assistant turns replaced by the target's own answers), `capture` / `capture_shards` /
`capture_reader` (aux and last hidden states in sharded safetensors; the same code computes them
online), `parts` (a step run in --num-shards parts, read as one folder), `vocab` (draft-vocabulary maps
d2t/t2d), `common` (content hashes, step records, summaries, atomic files), `step_summary` (each step's
progress bar and closing summary line).
At scale: `tp_steps` (capture and regenerate on a tensor-parallel target under torchrun),
`vllm_engine`, `vllm_regenerate` and `vllm_capture` (the same steps through vLLM in its own Python:
--engine vllm; `engine_choice`: --engine auto, the default, picks one; `step_options`: their numeric
flags checked before either engine), `fp8` and `capture_storage`
(e4m3 captures with per-token scales; bytes per token).
Every step writes `draftsmith_data.json` last; same inputs = no-op; killed steps resume.
"""
