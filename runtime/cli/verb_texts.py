"""The words of the verbs' --help: for each verb, (the one-line summary `draftsmith --help` lists, the
description with examples shown above its options). Prose only, kept apart from the parsers (main.py,
bench.py, data.py) so each verb's wiring reads on one screen; every flag's own help stands beside the flag.
"""

GENERATE = (
    "generate text with the target (plain or speculative decoding)",
    "Generate from the target. Prompts are chat-templated unless --no-chat.\n\n"
    "examples:\n"
    '  draftsmith generate --prompt "Why is the sky blue?"\n'
    "  draftsmith generate --prompts prompts.txt --batch-size 8 --json > out.jsonl\n"
    '  draftsmith generate --prompt "Tell a story" --temperature 0.8 --top-p 0.95 --seed 1\n\n'
    "--json prints one object per prompt (JSON Lines) with prompt_token_ids, token_ids (new tokens\n"
    "only), text, new_tokens, finish_reason, target_forwards, mean_accepted (tau),\n"
    "accept_rate_per_position, wall_s and tokens_per_s.",
)

BENCH = (
    "speed of drafts side by side with plain decoding, transformers and vLLM",
    "Decode the same prompts with plain decoding, the baselines and every --draft (combined with\n"
    "every --tree), per temperature and batch size: warm-up first, methods interleaved per batch,\n"
    "repeats with medians. Prints a table per block and writes OUT/results.json (one row per\n"
    "method, temperature and batch size: tokens/s, speedup over plain, tau, acceptance per\n"
    "position, TTFT/TPOT, greedy_identical at T=0), OUT/meta.json (command, versions, machine,\n"
    "roofline), OUT/report.md and PNG plots.\n\n"
    "Tree auto:K is load-aware speculation: the engine measures its verify-cost curve at start-up\n"
    "and drafts a chain of depth 0..K per cycle, whichever gives the most expected tokens per\n"
    "second for the acceptance it observes (0 = a plain step), so speculation never costs much\n"
    "more than plain decoding even where verification is compute-bound.\n\n"
    "examples:\n"
    "  draftsmith bench --draft ngram --prompts humaneval --num-prompts 20\n"
    "  draftsmith bench --draft eagle3:runs/eagle3-smollm2-135m/final --tree chain:2 \\\n"
    "      --tree auto:3 \\\n"
    "      --prompts sharegpt --temperatures 0,1 --batch-sizes 1,4,16\n"
    "  draftsmith bench --draft 'self:layers=20@chain:2' --prompts mtbench:question.jsonl \\\n"
    "      --categories coding,math --baselines plain,hf,vllm\n"
    "  draftsmith bench --draft eagle3:HEAD --baselines plain,vllm,vllm-eagle3:HEAD@chain:2\n"
    "  draftsmith bench --draft ngram --baselines plain,llamacpp,llamacpp-lookup --batch-sizes 1\n"
    "  draftsmith bench --device cuda --baselines plain,plain+graphs \\\n"
    "      --draft 'eagle3:HEAD@chain:3+graphs'\n\n"
    "A +graphs suffix runs plain or DRAFT@TREE on the GPU engine path (static KV cache,\n"
    "CUDA graphs). llamacpp[:GGUF] runs llama.cpp (bash scripts/setup_llamacpp.sh) on the GGUF the\n"
    "target came from, or on GGUF; rows name its precision (weights: Q4_1, Q8_0, F32).\n"
    "A +ssd[:F] suffix (DRAFT@chain:K+ssd:8) runs the draft through SSD in process\n"
    "(generate --ssd).\n"
    "Speculative rows carry draft and verify ms per cycle (mean), the draft share of wall time, and\n"
    "for +ssd the hit rate per accepted length, draft latency hidden and target idle time.",
)

DATA = (
    "turn conversations into training data for a target: prepare, regenerate, capture, vocab",
    "Data recipes for head training. Each step writes a folder with a draftsmith_data.json record\n"
    "(inputs hash, target/tokenizer/template hashes, summary of kept and dropped rows); re-running\n"
    "a step with the same inputs is a no-op, a killed step resumes. regenerate and capture take\n"
    "--num-shards N --shard-index K (one process or machine per part; the parts read as one). Under\n"
    "torchrun they take --target-placement tp --tp-size N: the target split over N processes, each\n"
    'group of N making one part (README, "Targets larger than one GPU"). regenerate and capture run\n'
    "on --engine auto: vLLM where it is measured faster (regenerate on a CPU-only machine) and a\n"
    "Python with vLLM is found, else draftsmith's engine; the log names the engine and why.\n\n"
    "examples:\n"
    "  draftsmith data prepare --source sharegpt --out data/sg --max-samples 1000 --max-length 1024\n"
    "  draftsmith data regenerate --data data/sg --out data/sg-regen --batch-size 8\n"
    "  draftsmith data capture --data data/sg-regen --out data/sg-hidden --dtype bfloat16\n"
    "  draftsmith data capture --data data/sg-regen --out data/sg-h --num-shards 4 --shard-index 0\n"
    "  torchrun --nproc-per-node 8 -m draftsmith.runtime.cli data capture --target-placement tp \\\n"
    "      --tp-size 8 --target meta-llama/Llama-3.3-70B-Instruct --data data/sg-regen --out data/h\n"
    "  torchrun --nproc-per-node 8 -m draftsmith.runtime.cli data regenerate --target T \\\n"
    "      --target-placement tp --tp-size 4 --data data/sg --out data/sg-regen  # 2 parts\n"
    "  draftsmith data vocab --data data/sg-regen --draft-vocab-size 8192 --out data/sg-vocab",
)

TRAIN = (
    "train a draft head from a YAML config (data steps included, resumable)",
    "Train an EAGLE-3 head or MTP modules (head.type) for a target, MTP with the target frozen or\n"
    "co-trained (cotrain.enabled, LoRA or full). The config names the target, the data recipe, the\n"
    "head and the loop; the data steps it needs (prepare, vocab, capture in offline mode) run first\n"
    "or are reused from ~/.cache/draftsmith/data. A run writes OUT/metrics.jsonl, OUT/config.yaml,\n"
    "OUT/checkpoints/step-N/ (atomic, rotated; a rerun resumes from the newest), OUT/final/ (the\n"
    "head: --draft eagle3:OUT/final or mtp:OUT/final; a co-trained target in OUT/final/target) and\n"
    "OUT/training_curve.png (OUT = output_dir).\n"
    "Several processes (configs: ddp-cpu, ddp-gpu, fsdp-gpu, deepspeed-zero2, deepspeed-zero3):\n"
    "  accelerate launch --config_file configs/accelerate/X.yaml -m draftsmith.train --config ...\n\n"
    "examples:\n"
    "  draftsmith train --config configs/eagle3-smollm2-135m.yaml\n"
    "  draftsmith train --config configs/mtp-cotrain-lora-smollm2-135m.yaml\n"
    "  draftsmith train --config configs/eagle3-smollm2-135m.yaml train.max_steps=20 \\\n"
    "      data.max_samples=64 output_dir=runs/smoke log.tracker=wandb\n"
    "  draftsmith train --preflight --config configs/eagle3-smollm2-135m.yaml \\\n"
    "      target=meta-llama/Llama-3.3-70B-Instruct data.max_length=4096 --world-size 8\n\n"
    "A run first estimates its memory per rank from the target's config.json (train/preflight/estimate.py),\n"
    "prints it and refuses (exit 2) what exceeds the device: train.preflight=warn tries anyway.",
)

DEMO = (
    "the main job on embedded defaults: the shipped EAGLE-3 head -> bench -> export",
    "Decode held-out prompts with plain decoding, transformers generate(), prompt lookup and an\n"
    "EAGLE-3 head (chain and dynamic tree) side by side (warmed up, interleaved), check greedy\n"
    "tokens against plain decoding and print tokens/s, speedup, tau and acceptance per position;\n"
    "then export the head (export_formats: the SGLang and speculators layouts) with model cards\n"
    "quoting those rows.\n"
    "The head: the one shipped in heads/eagle3-smollm2-135m (trained by the shipped recipe; its\n"
    "README names the command, commit and machine), `head=DIR` for another, or with --train a new\n"
    "one: data + `draftsmith train` with configs/eagle3-smollm2-135m.yaml first (a finished run is\n"
    "reused, an interrupted one resumes; the expected time is printed before it starts).\n"
    "Writes OUT/results.json, OUT/config.yaml and OUT/export-FORMAT/ (OUT = out_dir, default\n"
    "runs/demo).\n\n"
    "examples:\n"
    "  draftsmith demo                     # the shipped head: bench + export in minutes\n"
    "  draftsmith demo --train             # train the recipe's head first (~1 h on 2 cores)\n"
    "  draftsmith demo --quick             # a 40-step head, 4 prompts: the whole pipeline, minutes\n"
    "  draftsmith demo prompt_set=humaneval num_prompts=20\n"
    "  draftsmith demo --train 'train_overrides=[train.max_steps=200]'",
)

EVAL = (
    "acceptance of drafts on the sets papers use, untimed, on one pinned harness: the leaderboard",
    "Every --draft (and --tree) on each set's prompts, at each temperature, in large batches: no\n"
    "warm-up, no repeats, no plain run, no clock. At T=0 the target's greedy continuation is decoded\n"
    "once per set and each draft replays against it, no target forward per cycle (--engine-at-t0: each\n"
    "draft through the engine instead); at T>0 and for auto:K / adaptive:K each draft decodes through\n"
    "the runtime's engine, whose lossless verify makes its accepted lengths the draft's acceptance.\n"
    "At T=0 both equal generate's on the same prompts. Writes\n"
    "OUT/eval.json and OUT/report.md with plots: per prompt, category and set the acceptance record\n"
    "(mean acceptance length = 1 + accepted / steps, draft acceptance rate, acceptance per position,\n"
    "the accepted-count histogram), the leaderboard per temperature, and the pinned harness (target,\n"
    "chat template hash, sets with revision or file sha256, sampling, K and tree).\n\n"
    "examples:\n"
    "  draftsmith eval --draft eagle3:heads/eagle3-smollm2-135m --draft ngram --set humaneval\n"
    "  draftsmith eval --draft eagle3:HEAD --tree chain:2 --tree chain:4 --set gsm8k --set mt-bench \\\n"
    "      --temperatures 0,1 --num-prompts 80\n"
    "  draftsmith eval --draft eagle3:HEAD --set speed-bench/qualitative --categories coding,math\n"
    "  draftsmith eval --draft ngram --set gsm8k:data/gsm8k_test.jsonl --json > eval.json\n\n"
    "Offline, a set reads from --set NAME:FILE or $DRAFTSMITH_EVAL_SETS/NAME.jsonl (default folder\n"
    "~/.cache/draftsmith/eval_sets), rows in the Hub set's own schema (docs/eval.md).",
)

CALIBRATE = (
    "fit a DSpark confidence head's calibration on the target's own continuations (Platt scaling)",
    "The confidence head learns acceptance on training answers other models wrote; the runtime asks it\n"
    "about the target's own text, where acceptance is higher. This decodes the target greedily once\n"
    "on --prompts (default: prompts from the head's training range, never the held-out bench slice),\n"
    "drafts against it at T=0 as the runtime would, fits survival -> sigmoid(a * logit + b) on a fit\n"
    "split (the ranking of slots unchanged: a monotone map) and writes OUT: the head with the map folded\n"
    "into its confidence layer (exports carry it), calibration.json (a, b; per split the ECE before and\n"
    "after, AUROC, reliability bins, per-position predicted vs observed) and reliability.png.\n\n"
    "examples:\n"
    "  draftsmith calibrate --draft dspark:runs/dspark-smollm2-135m/final \\\n"
    "      --out runs/dspark-smollm2-135m/calibrated\n"
    "  draftsmith bench --draft dspark:runs/dspark-smollm2-135m/calibrated@adaptive:3 --prompts sharegpt",
)
