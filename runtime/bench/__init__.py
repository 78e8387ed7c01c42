"""`draftsmith bench` (bench layer: may import everything): methods side by side, timing, reports.

`run` (one bench run: build methods, time them per temperature and batch size, write the report), `methods`
(the methods it times), `types` (what every method returns), `compare` (summaries, greedy identity,
side-by-side rows), `cycle_fields` (draft / verify ms per cycle, draft share, +ssd cache metrics), `report`
(results.json, report.md, plots), `calibration_report` (survival estimates' calibration: row fields, table),
`prompt_sets` (held-out prompt sets), `bench_prompt` (what a prompt source yields), `roofline` (what plain
decoding could reach), `side_by_side` (transformers' `generate()` on the same prompts), `vllm_method` (vLLM
baselines through runtime/workers/vllm_worker.py), `llamacpp_method` (llama.cpp baselines through
runtime/workers/llamacpp_worker.py), `llamacpp_spec` (one run of llama.cpp's speculative tool, parsed),
`llamacpp_eagle3_method` (the bench row of an EAGLE-3 GGUF head in llama.cpp), `worker_method` (the
process handling both share), `ssd_replay` (the SSD replay simulator: recorded cycles + a hardware pair's
costs -> predicted tokens/s); `reading` (the demo's closing reading of its own rows: tau, the verify-cost
curve, why a drafter lost or won). `eval_run`
(`draftsmith eval`: the untimed acceptance of drafts on one pinned harness), `eval_replay` (its T = 0
path: every draft replayed against the target's greedy continuation), `eval_sets` (the papers' sets:
SPEED-Bench, GSM8K, MT-Bench, MATH-500, HumanEval, MBPP, from the Hub or local files), `eval_record` (the
acceptance record and the harness pins), `eval_report` (eval.json, report.md, plots, the leaderboard),
`eval_context` (acceptance against context length: long documents cut to each length), `eval_context_report`
(its plot and report table); `calibrate` (`draftsmith calibrate`: a DSpark confidence head's Platt scaling,
fitted on the target's own continuations through eval's replay, folded into a new head folder).
Studies built on these (the 70B-on-H100 SSD projection, the per-prompt speed harness) live in
scripts/studies/.
"""
