"""`draftsmith export`: a trained head in the layout an engine loads, checked by a round trip, with a
model card, optionally pushed to the Hugging Face Hub.

    draftsmith export runs/eagle3-smollm2-135m --format eagle3 --out exports/eagle3-sglang
    draftsmith export runs/eagle3-smollm2-135m --format eagle3 --engine vllm --out exports/eagle3-vllm
    draftsmith export runs/eagle3-smollm2-135m --format speculators --out exports/spec --push-to-hub me/head
    draftsmith export runs/mtp-smollm2-135m --format mtp --out exports/mtp-deepseek

Formats: `draftsmith` (our folder, the default), `eagle3` (official / SGLang layout; `--engine vllm`
writes the aux-layer ids the way vLLM reads them), `speculators` (vLLM's native layout), `mtp` (DeepSeek
layout: the target with the modules appended as layers), `mtp-mimo` (one module in MiMo's layout, which
vLLM serves as `method: mtp`; runtime/mtp_layout.py). An export is written to a
temporary sibling folder, read back with the same importer `--draft` uses and compared tensor by tensor
with the head, and only then renamed into place: a failed export leaves nothing half-written.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draftsmith.runtime.artifacts import atomic_save_file, load_tensors, open_tensors
from draftsmith.runtime.errors import BadInputError, DraftsmithError, check_output_dir, read_json
from draftsmith.train.model_card import CardFacts, bench_rows, model_card, run_facts

log = logging.getLogger(__name__)

FORMATS = {
    "draftsmith": ("eagle3", "mtp"),
    "eagle3": ("eagle3",),
    "speculators": ("eagle3",),
    "mtp": ("mtp",),
    "mtp-mimo": ("mtp",),
}
ENGINES = ("sglang", "vllm")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


@dataclass
class ExportRequest:
    checkpoint: str
    format: str = "draftsmith"
    out: str = ""
    engine: str = "sglang"
    verifier: str | None = None  # speculators: the verifier path or Hub id written into the config
    target: str | None = None  # mtp: the target whose weights are appended (default: the head's own)
    bench: str | None = None  # a bench JSON whose rows for this head go into the card
    vllm_check: str | None = None  # scripts/check_vllm.sh summary.json for the card
    speculative_tokens: int = 3  # drafted tokens per step in the speculators config and serve commands
    license: str | None = None
    push_to_hub: str | None = None
    private: bool = False
    revision: str | None = None
    overwrite: bool = False


def export(req: ExportRequest) -> Path:
    folder, head_type = resolve_checkpoint(req.checkpoint)
    _check_request(req, head_type)
    out = check_output_dir("--out", req.out)
    _check_out_apart_from_inputs(out, _inputs(req, folder))
    if out.exists() and any(out.iterdir()) and not req.overwrite:
        raise BadInputError("--out", str(out), "a new or empty folder", "pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; an export is meant to be shared
    try:
        facts = WRITERS[req.format](req, folder, head_type, tmp)
        facts.run = run_facts(_run_dir(folder))
        facts.bench, facts.bench_meta = bench_rows(Path(req.bench) if req.bench else None, folder)
        facts.vllm = read_json(req.vllm_check, "--vllm-check") if req.vllm_check else None
        facts.repo_id = req.push_to_hub
        facts.speculative_tokens = req.speculative_tokens
        (tmp / "README.md").write_text(model_card(facts))
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("export: %s layout of %s written to %s", req.format, folder, out)
    if req.push_to_hub:
        from draftsmith.train.hub import push_folder

        url = push_folder(out, req.push_to_hub, private=req.private, revision=req.revision)
        log.info("export: pushed to %s", url)
    return out


def resolve_checkpoint(path: str) -> tuple[Path, str]:
    """A head folder (config.json with head_type) or a run folder (its final/) -> (folder, head type)."""
    p = Path(path)
    for folder in (p, p / "final"):
        config = folder / "config.json"
        if config.is_file():
            head_type = read_json(config, "CHECKPOINT").get("head_type")
            if head_type in ("eagle3", "mtp"):
                return folder, head_type
    raise BadInputError(
        "CHECKPOINT",
        path,
        "a draftsmith head folder (config.json with head_type) or a run folder with final/",
    )


def _check_request(req: ExportRequest, head_type: str) -> None:
    if req.format not in FORMATS:
        raise BadInputError("--format", req.format, f"one of {', '.join(FORMATS)}")
    if head_type not in FORMATS[req.format]:
        fits = [f for f, kinds in FORMATS.items() if head_type in kinds]
        raise BadInputError("--format", req.format, f"a format for a {head_type} head: {', '.join(fits)}")
    if not 1 <= req.speculative_tokens <= 16:
        raise BadInputError("--num-speculative-tokens", req.speculative_tokens, "an integer in [1, 16]")
    if req.engine not in ENGINES:
        raise BadInputError("--engine", req.engine, f"one of {', '.join(ENGINES)}")
    if req.push_to_hub:
        from draftsmith.train.hub import check_repo_id

        check_repo_id(req.push_to_hub)
    for name in ("bench", "vllm_check"):
        value = getattr(req, name)
        if value and not Path(value).is_file():
            raise BadInputError(f"--{name.replace('_', '-')}", value, "an existing JSON file")


def _inputs(req: ExportRequest, folder: Path) -> list[tuple[str, Path]]:
    """What the export reads, each with the flag that names it: the head (and the run folder given),
    the run's files, the card's JSON files, the verifier or target it describes or appends to."""
    named = [("CHECKPOINT", req.checkpoint), ("CHECKPOINT", str(folder))]
    run = _run_dir(folder)
    if run is not None:  # run_facts reads the run's config and metrics
        named += [("CHECKPOINT", str(run / "config.yaml")), ("CHECKPOINT", str(run / "metrics.jsonl"))]
    named += [("--bench", req.bench), ("--vllm-check", req.vllm_check)]
    if req.format in ("speculators", "mtp", "mtp-mimo"):
        flag, given = (
            ("--verifier", req.verifier) if req.format == "speculators" else ("--target", req.target)
        )
        head_target = read_json(folder / "config.json", "CHECKPOINT").get("target")
        named.append((flag, given) if given else ("the head's target", head_target))
    return [(flag, Path(p).expanduser()) for flag, p in named if p and Path(p).expanduser().exists()]


def _check_out_apart_from_inputs(out: Path, inputs: list[tuple[str, Path]]) -> None:
    """--out must not be, contain or lie inside anything the export reads: replacing it (--overwrite)
    would delete an input, and writing inside a head folder would copy the export into itself."""
    where = out.resolve()
    for flag, path in inputs:
        read = path.resolve()
        if where == read or read.is_relative_to(where):
            relation = "is" if where == read else "contains"
        elif read.is_dir() and where.is_relative_to(read):
            relation = "is inside"
        else:
            continue
        raise BadInputError(
            "--out",
            str(out),
            "a folder apart from what export reads",
            f"it {relation} {flag} {path}; --overwrite never deletes an input",
        )


def _run_dir(folder: Path) -> Path | None:
    return folder.parent if (folder.parent / "config.yaml").is_file() else None


def _replace(tmp: Path, out: Path) -> None:
    """Rename the finished export into place; an old export is moved aside first and removed last."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---- writers: each writes the layout into `tmp`, reads it back, and returns the card's facts ------------


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def _size(tensors: dict[str, torch.Tensor]) -> str:
    floats = [t for t in tensors.values() if t.is_floating_point()]
    count = sum(t.numel() for t in floats)
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in floats})
    return f"{count / 1e6:.1f}M parameters, {'/'.join(dtypes)}"


def check_round_trip(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor], what: str) -> None:
    """Every tensor back exactly (torch.equal) under the same name: the layout lost nothing."""
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or extra:
        raise DraftsmithError(f"{what}: round trip lost {missing[:5]} / added {extra[:5]}")
    for name in expected:
        if not torch.equal(expected[name].cpu(), got[name].cpu()):
            raise DraftsmithError(f"{what}: tensor {name} changed in the round trip")


def write_draftsmith(req: ExportRequest, folder: Path, head_type: str, tmp: Path) -> CardFacts:
    for item in folder.iterdir():  # config.json, model.safetensors, and a co-trained target/
        if item.name == "README.md":
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
    config = read_json(folder / "config.json", "CHECKPOINT")
    tensors = load_tensors(folder / "model.safetensors", "CHECKPOINT")
    return CardFacts(
        req.format, head_type, config["target"], license=_license(req, config), size=_size(tensors)
    )


def write_eagle3(req: ExportRequest, folder: Path, head_type: str, tmp: Path) -> CardFacts:
    """Official / SGLang layout (`--engine` picks the aux-id convention) or speculators (vLLM native)."""
    from draftsmith.runtime.eagle3 import load_head
    from draftsmith.runtime.layouts import load_eagle3, to_official, to_speculators

    head = load_head(folder)
    if req.format == "speculators":
        facts = _verifier_facts(req, head.config.target)
        config, tensors = to_speculators(head, req.verifier, req.speculative_tokens, **facts)
        engine = "speculators"
    else:
        config, tensors = to_official(head, engine=req.engine)
        engine = req.engine
    _write_json(tmp / "config.json", config)
    atomic_save_file(tmp / "model.safetensors", tensors, {"format": "pt"})
    back = load_eagle3(str(tmp))  # what `--draft eagle3:DIR` does
    check_round_trip(head.state_dict(), back.state_dict(), f"{req.format} export")
    if asdict(back.config) != asdict(head.config):
        raise DraftsmithError(f"{req.format} export: the config read back differs from the head's")
    ids = (
        config.get("eagle_aux_hidden_state_layer_ids")
        or config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    )
    details = [
        f"aux layers (0-based decoder-layer outputs): {head.config.aux_layer_ids}; written as {ids} "
        f"for {engine}",
        f"draft vocabulary: {head.config.draft_vocab_size} of {head.config.vocab_size} target tokens (`d2t`)",
    ]
    return CardFacts(
        req.format,
        head_type,
        head.config.target,
        license=_license(req, asdict(head.config)),
        engine=engine if req.format == "eagle3" else None,
        size=_size(tensors),
        details=details,
    )


def write_mtp(req: ExportRequest, folder: Path, head_type: str, tmp: Path) -> CardFacts:
    """The target's own files with the modules appended (runtime/mtp_layout.py): DeepSeek's layout
    (`mtp`: layers L..L+M-1, `num_nextn_predict_layers`) or MiMo's (`mtp-mimo`: one module as
    `model.mtp_layers.0.*`, the target as MiMoForCausalLM, which vLLM serves)."""
    from safetensors.torch import load_file

    from draftsmith.runtime.mtp import load_head
    from draftsmith.runtime.mtp_layout import from_deepseek, from_mimo, to_deepseek, to_mimo

    head = load_head(folder)
    target_dir = _mtp_target_dir(req, folder, head.config)
    target_config = read_json(target_dir / "config.json", "--target")
    target_tensors: dict[str, torch.Tensor] = {}
    for file in sorted(target_dir.glob("*.safetensors")):
        target_tensors.update(load_tensors(file, "--target"))
    _check_target_weights(target_dir, target_tensors, target_config, head.config)
    ours = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    to_layout = to_mimo if req.format == "mtp-mimo" else to_deepseek
    config, tensors = to_layout(head.config, ours, target_config, target_tensors)
    tensors = {k: v.contiguous().clone() for k, v in tensors.items()}  # no shared storage in safetensors
    _write_json(tmp / "config.json", config)
    atomic_save_file(tmp / "model.safetensors", tensors, {"format": "pt"})
    for name in TOKENIZER_FILES + ("generation_config.json",):
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, tmp / name)
    written = load_file(str(tmp / "model.safetensors"))
    if req.format == "mtp-mimo":
        back_ours = from_mimo(config, written)[1]
        back_target = {k: written[k] for k in target_tensors}
    else:
        _, back_ours, back_target = from_deepseek(config, written)
    check_round_trip(ours, back_ours, f"{req.format} export (modules)")
    check_round_trip(target_tensors, back_target, f"{req.format} export (target)")
    where = (
        "as `model.mtp_layers.0` of a MiMoForCausalLM (the target with zero q/k/v biases)"
        if req.format == "mtp-mimo"
        else f"as layers {head.config.num_target_layers}.."
        f"{head.config.num_target_layers + head.config.num_modules - 1}"
    )
    trained = "co-trained with the modules" if head.config.cotrained else "unchanged (frozen in training)"
    details = [f"{head.config.num_modules} MTP module(s) {where}; target {trained}"]
    if req.format == "mtp-mimo":
        details.append(_mimo_exactness(head.config))
    return CardFacts(
        req.format,
        head_type,
        head.config.target,
        license=_license(req, asdict(head.config)),
        size=_size(ours) + " in the modules",
        details=details,
    )


def _mimo_exactness(config) -> str:
    """vLLM's MiMo MTP reads the target's pre-norm last state and zeroes the embedding at position 0;
    a module trained otherwise still serves losslessly there, with other (usually lower) acceptance."""
    if config.feature == "pre_norm" and config.mask_first_position:
        return "inputs as vLLM's MiMo MTP computes them (pre-norm target state, position 0 masked): exact"
    log.warning(
        "export: this module reads h_0 %s and %s position 0; vLLM's MiMo MTP feeds the pre-norm state and "
        "masks position 0, so vLLM will draft with other inputs (still lossless, other acceptance). "
        "Train with head.mtp_feature=pre_norm head.mtp_mask_first_position=true for an exact export.",
        "after the final norm" if config.feature == "final_norm" else "before the final norm",
        "masks" if config.mask_first_position else "does not mask",
    )
    return (
        "approximate in vLLM: it feeds the pre-norm target state and masks position 0, this module was "
        f"trained with feature={config.feature}, mask_first_position={config.mask_first_position} "
        "(lossless, other acceptance)"
    )


def _target_folder(name: str) -> Path | None:
    """The target's local folder: a path, the embedded alias's cache, or a Hub id already in the Hub
    cache. Never downloads: an export must not depend on the network."""
    from draftsmith.runtime.targets import ALIASES, resolve_target

    alias = next((a for a, emb in ALIASES.items() if emb.hub_name == name), None)
    if alias or Path(name).expanduser().is_dir():
        return resolve_target(alias or name).path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached (or not a repo id): the caller says what is missing
        log.warning("export: the target %s is not on this machine", name)
        return None


def _verifier_facts(req: ExportRequest, target: str) -> dict:
    """speculators writes the verifier's embedding and architectures into its folders; so do we, from the
    target's files when they are here (vLLM then reads the embedding from the head, speculators too)."""
    folder = _target_folder(req.verifier or target)
    if folder is None:
        log.warning("export: speculators folder without embed_tokens (vLLM shares the target's)")
        return {}
    architectures = read_json(folder / "config.json", "--verifier").get("architectures")
    for file in sorted(folder.glob("*.safetensors")):
        with open_tensors(file, "--verifier") as f:
            if "model.embed_tokens.weight" in f.keys():
                return {
                    "embed_tokens": f.get_tensor("model.embed_tokens.weight"),
                    "architectures": architectures,
                }
    return {"architectures": architectures}


def _mtp_target_dir(req: ExportRequest, folder: Path, config) -> Path:
    from draftsmith.runtime.targets import resolve_target

    if req.target:
        return resolve_target(req.target).path
    if config.cotrained:
        if not (folder / "target").is_dir():
            raise BadInputError("--target", None, f"the co-trained target (expected it in {folder}/target)")
        return folder / "target"
    found = _target_folder(config.target)
    if found is None:
        raise BadInputError("--target", None, f"a local copy of {config.target} (the modules' target)")
    return found


def _check_target_weights(target_dir: Path, tensors: dict, target_config: dict, config) -> None:
    """The appended modules only work on the weights they were trained with (artifacts.weights_hash)."""
    from draftsmith.runtime.artifacts import weights_hash_of_tensors

    got = weights_hash_of_tensors(tensors, target_config["num_hidden_layers"])
    if got != config.target_weights_hash:
        raise BadInputError(
            "--target",
            str(target_dir),
            f"the target the modules were trained with (weights {config.target_weights_hash})",
            f"its weights hash is {got}",
        )


def _license(req: ExportRequest, config: dict) -> str:
    """`--license`, else Apache-2.0 for the embedded SmolLM2 target, else 'other' (check the target's)."""
    if req.license:
        return req.license
    return "apache-2.0" if config.get("target", "").startswith("HuggingFaceTB/SmolLM2") else "other"


WRITERS = {
    "draftsmith": write_draftsmith,
    "eagle3": write_eagle3,
    "speculators": write_eagle3,
    "mtp": write_mtp,
    "mtp-mimo": write_mtp,
}
