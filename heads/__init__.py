"""Heads shipped in the repository (package `draftsmith.heads`), each trained by a shipped recipe.

    heads/eagle3-smollm2-135m/   EAGLE-3 head for SmolLM2-135M-Instruct (configs/eagle3-smollm2-135m.yaml)

Each folder is a draftsmith head folder (config.json + model.safetensors in bfloat16) with `training.json`
(the command, commit, machine, steps, training time and last validation row) and a README.md model card;
`scripts/ship_head.py` writes one from a finished run. `draftsmith demo` benches and exports the shipped
head (`head: NAME` in its config); `draftsmith demo --train` trains a new one. Use one anywhere a head
folder goes: `draftsmith generate --draft eagle3:heads/eagle3-smollm2-135m ...`.
"""
