"""An EAGLE-3 head as the GGUF file llama.cpp's speculative decoding reads (`--spec-type draft-eagle3`),
written by llama.cpp's own converter and held against the head tensor by tensor.

    draftsmith export runs/eagle3-smollm2-135m --format gguf --out exports/eagle3-gguf
    llama-speculative-simple -m TARGET.F32.gguf -md exports/eagle3-gguf/head.gguf --spec-type draft-eagle3 ...

The converter is the one vendored in llama-cpp-python 0.3.36 (its llama.cpp of 2026-10-01), which
`scripts/setup_llamacpp.sh` unpacks into `.venv-llamacpp/converter`: what llama.cpp reads is what its
converter writes, so draftsmith writes the official EAGLE-3 folder and lets the converter do the rest.
Two facts of that converter shape the folder (conversion/llama.py of that release):
- it reads `eagle_aux_hidden_state_layer_ids` at the top level of config.json (never inside `eagle_config`)
  and, without it, silently falls back to (2, L/2, L-3); the ids are written there, in the "input to layer
  X" convention llama.cpp extracts (`extract_layer_inputs`): draftsmith's output-of-layer id i is i + 1;
- it takes the tokenizer from `--target-model-dir`, so the GGUF cannot be written without the target.
The file is read back with the `gguf` package and compared with the head: the aux ids in `target_layers`,
every tensor (q/k rows in llama.cpp's rope order, d2t as absolute target ids), so a converter that read the
folder differently fails the export instead of losing acceptance in llama.cpp.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from draftsmith.runtime.core.artifacts import atomic_save_file
from draftsmith.runtime.errors import BadInputError, DraftsmithError

LLAMACPP_RELEASE = "llama.cpp as vendored in llama-cpp-python 0.3.36 (its llama.cpp of 2026-10-01)"
SETUP = "bash scripts/setup_llamacpp.sh"
GGUF_FILE = "head.gguf"
# Official EAGLE-3 tensor -> the GGUF tensor llama.cpp's eagle3 architecture loads (src/models/eagle3.cpp).
GGUF_NAMES = {
    "fc.weight": "fc.weight",
    "input_norm.weight": "enc.output_norm.weight",  # EAGLE-3.1 norm_before_fc
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "d2t": "d2t",
}
DROPPED = ("t2d",)  # the converter skips it: llama.cpp maps draft ids to target ids with d2t alone


def check_gguf_head(cfg) -> None:
    """The EAGLE-3 variants this llama.cpp runs: one layer; EAGLE-3.1's `norm_before_fc` (one norm over the
    concatenated features); not the per-feature `fc_norm.{i}` nor `norm_output` (no such tensor or flag)."""
    unsupported = {
        "num_layers": (cfg.num_layers, 1),
        "fc_norm": (cfg.fc_norm, False),
        "norm_output": (cfg.norm_output, False),
        "norm_before_residual": (cfg.norm_before_residual, False),
    }
    for field, (got, wanted) in unsupported.items():
        if got != wanted:
            raise BadInputError(
                field,
                got,
                f"{wanted} for --format gguf: {LLAMACPP_RELEASE} reads one-layer EAGLE-3 heads, with or "
                "without norm_before_fc",
                "export --format speculators for vLLM",
            )


def converter_script(setup: str | Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py in the setup's folder; missing -> the command that makes it."""
    script = Path(setup) / "converter" / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise BadInputError(
            "--llamacpp",
            str(setup),
            f"a llama.cpp setup with its converter ({script} is missing)",
            f"run `{SETUP}` (about 4 minutes on 2 cores) or pass --llamacpp DIR",
        )
    return script


def llamacpp_ids(aux_layer_ids) -> list[int]:
    """draftsmith's output-of-layer ids as llama.cpp's target_layers (the input of layer i + 1)."""
    return [int(i) + 1 for i in aux_layer_ids]


def write_gguf(head, official: tuple[dict, dict], target_dir: Path, setup: str | Path, out: Path) -> Path:
    """The official EAGLE-3 folder (`official`: config and tensors, aux ids in vLLM's convention) converted
    by llama.cpp's converter into out/head.gguf (F32: exact for float32 and bfloat16 heads), checked."""
    script = converter_script(setup)
    config, tensors = official
    config = {**config, "eagle_aux_hidden_state_layer_ids": llamacpp_ids(head.config.aux_layer_ids)}
    with tempfile.TemporaryDirectory(prefix="eagle3-gguf-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        atomic_save_file(Path(tmp) / "model.safetensors", tensors, {"format": "pt"})
        part = out / f".{GGUF_FILE}.tmp"
        _convert(script, Path(tmp), target_dir, part, out / "convert.log")
        check_gguf(part, head, tensors)
        part.replace(out / GGUF_FILE)  # atomic: a file that failed its check never carries the name
    return out / GGUF_FILE


def _convert(script: Path, folder: Path, target_dir: Path, gguf: Path, log: Path) -> None:
    """Run the converter under this Python (it needs torch) with its own gguf-py first on the path."""
    converter = script.parent
    path = [str(converter / "gguf-py"), str(converter / "deps"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    command = [sys.executable, str(script), str(folder), "--target-model-dir", str(target_dir)]
    command += ["--outtype", "f32", "--outfile", str(gguf)]
    with open(log, "w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        tail = log.read_text().strip().splitlines()[-5:]
        raise DraftsmithError(
            f"llama.cpp's converter failed (exit {done.returncode}, {log}):\n" + "\n".join(tail)
        )


def check_gguf(path: Path, head, tensors: dict[str, torch.Tensor]) -> None:
    """The GGUF holds the head: architecture eagle3, target_layers = the aux ids llama.cpp must extract,
    the target's hidden size, and every tensor equal (q/k in llama.cpp's rope row order)."""
    import gguf

    reader = gguf.GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    cfg = head.config
    expected = {
        "general.architecture": "eagle3",
        "eagle3.target_layers": llamacpp_ids(cfg.aux_layer_ids),
        "eagle3.target_hidden_size": cfg.target_hidden_size,
    }
    for key, want in expected.items():
        if fields.get(key) != want:
            raise DraftsmithError(f"gguf export: {key} is {fields.get(key)!r}, expected {want!r}")
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    want = {
        GGUF_NAMES[name]: _as_llamacpp(name, tensor, cfg)
        for name, tensor in tensors.items()
        if name not in DROPPED
    }
    if set(got) != set(want):
        raise DraftsmithError(f"gguf export: tensors {sorted(set(got) ^ set(want))} differ in presence")
    for name, array in want.items():
        if got[name].shape != array.shape or not np.array_equal(got[name], array):
            raise DraftsmithError(f"gguf export: tensor {name} differs from the head's")


def _as_llamacpp(name: str, tensor: torch.Tensor, cfg) -> np.ndarray:
    """The tensor as llama.cpp stores it: float32; q/k rows permuted for its rope (pairs (i, i + d/2) made
    adjacent, as the converter's LlamaModel.permute does); d2t as absolute target ids."""
    if name == "d2t":
        return (tensor.to(torch.int64) + torch.arange(tensor.numel())).numpy()
    array = tensor.detach().to(torch.float32)
    heads = {"q_proj": cfg.layer["num_attention_heads"], "k_proj": cfg.layer["num_key_value_heads"]}
    for proj, n_head in heads.items():
        if name.endswith(f"{proj}.weight"):
            rows = array.shape[0]  # [n_head * head_dim, in]: each head's halves interleaved
            array = array.reshape(n_head, 2, rows // n_head // 2, -1).transpose(1, 2).reshape(rows, -1)
    return array.numpy()
