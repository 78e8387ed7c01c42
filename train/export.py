"""`draftsmith export`: a trained head in the layout an engine loads, checked by a round trip, with a
model card, optionally pushed to the Hugging Face Hub.

    draftsmith export runs/eagle3-smollm2-135m --format eagle3 --out exports/eagle3-sglang
    draftsmith export runs/eagle3-smollm2-135m --format eagle3 --engine vllm --out exports/eagle3-vllm
    draftsmith export runs/eagle3-smollm2-135m --format speculators --out exports/spec --push-to-hub me/head
    draftsmith export runs/mtp-smollm2-135m --format mtp --out exports/mtp-deepseek

Formats are the head kinds' layouts (runtime/heads/head_kinds.py; each kind's writers and readers live with
it, runtime/heads/eagle3_kind.py and runtime/heads/mtp_kind.py): `draftsmith` (our folder, the default),
`eagle3`
(official / SGLang layout; `--engine vllm` writes the aux-layer ids the way vLLM reads them),
`speculators` (vLLM's native layout), `mtp` (DeepSeek layout: the target with the modules appended as
layers), `mtp-mimo` (one module in MiMo's layout, which vLLM serves as `method: mtp`).
`--quantize fp8` writes an EAGLE-3 head's linears in FP8 with the compressed-tensors `quantization_config`
vLLM loads drafts with (`--format speculators`, or `eagle3 --engine vllm`; runtime/heads/fp8_checkpoint.py);
`--quantize int8` writes draftsmith's own int8 CPU folder of any kind (runtime/heads/int8_folder.py). The
model card states the precision.
An export is written to a temporary sibling folder, read back with the same importer `--draft` uses and
compared tensor by tensor with the head, and only then renamed into place: a failed export leaves
nothing half-written. The head's `trained_for` record (its chat template and thinking mode:
runtime/heads/trained_for.py) goes into the export's config.json and its card.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftsmith.runtime.errors import BadInputError, check_output_dir, read_json
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.fp8_checkpoint import check_quantize
from draftsmith.runtime.heads.head_folder import CONFIG_FILE
from draftsmith.runtime.heads.head_kind import HeadKind, LayoutOptions
from draftsmith.runtime.heads.trained_for import read_trained_for, stamp
from draftsmith.train.model_card import CardFacts, bench_rows, model_card, run_facts

log = logging.getLogger(__name__)

ENGINES = ("sglang", "vllm")


def formats() -> dict[str, tuple[str, ...]]:
    """Export format -> the head kinds it fits (runtime/heads/head_kinds.py: each kind's layouts)."""
    return head_kinds.formats()


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
    any_target: bool = False  # a co-trained eagle3 head for another target (runtime/heads/eagle3_binding.py)
    quantize: str | None = None  # fp8 (eagle3 --engine vllm, speculators) or int8 (draftsmith folder)
    llamacpp: str = ".venv-llamacpp"  # gguf: the llama.cpp setup (scripts/setup_llamacpp.sh) converting it
    sglang_version: str | None = None  # eagle3 --engine sglang: the SGLang release that will serve it
    license: str | None = None
    push_to_hub: str | None = None
    private: bool = False
    revision: str | None = None
    overwrite: bool = False


def export(req: ExportRequest) -> Path:
    folder, kind = resolve_checkpoint(req.checkpoint)
    layout = _check_request(req, kind)
    out = check_output_dir("--out", req.out)
    _check_out_apart_from_inputs(out, _inputs(req, folder, layout.reads))
    if out.exists() and any(out.iterdir()) and not req.overwrite:
        raise BadInputError("--out", str(out), "a new or empty folder", "pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; an export is meant to be shared
    try:
        options = LayoutOptions(
            req.engine,
            req.verifier,
            req.target,
            req.speculative_tokens,
            req.any_target,
            req.quantize,
            req.llamacpp,
            req.sglang_version,
        )
        if req.quantize == "int8":  # draftsmith's own folder, int8 (runtime/heads/int8_folder.py)
            from draftsmith.runtime.heads.int8_folder import write_int8_export

            written = write_int8_export(kind, folder, tmp)
        else:
            written = layout.write(folder, tmp, options)
        record = read_trained_for(folder)  # the chat template and thinking mode it was trained with
        if record is not None and (tmp / CONFIG_FILE).is_file():
            stamp(tmp, record)  # a top-level key engines' readers ignore (runtime/heads/trained_for.py)
        facts = CardFacts(
            req.format,
            kind.name,
            written.target,
            license=_license(req, written.config),
            engine=written.engine,
            size=written.size,
            details=written.details,
            precision=written.precision,
            trained_for=record,
        )
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


def resolve_checkpoint(path: str) -> tuple[Path, HeadKind]:
    """A head folder (config.json with head_type) or a run folder (its final/) -> (folder, head kind)."""
    p = Path(path)
    for folder in (p, p / "final"):
        kind = head_kinds.of_folder(folder)
        if kind is not None:
            return folder, kind
    raise BadInputError(
        "CHECKPOINT",
        path,
        "a draftsmith head folder (config.json with head_type) or a run folder with final/",
    )


def _check_request(req: ExportRequest, kind: HeadKind):
    """The layout `--format` names for this kind, after the request's other checks."""
    fits = formats()
    if req.format not in fits:
        raise BadInputError("--format", req.format, f"one of {', '.join(fits)}")
    layouts = kind.all_layouts()
    if req.format not in layouts:
        raise BadInputError(
            "--format",
            req.format,
            f"a format for a {kind.name} head: {', '.join(layouts)}",
            f"{req.format} is written for {', '.join(fits[req.format])} heads",
        )
    if not 1 <= req.speculative_tokens <= 16:
        raise BadInputError("--num-speculative-tokens", req.speculative_tokens, "an integer in [1, 16]")
    if req.engine not in ENGINES:
        raise BadInputError("--engine", req.engine, f"one of {', '.join(ENGINES)}")
    check_quantize(req.quantize, req.format, req.engine, layouts[req.format])
    if req.sglang_version is not None and req.engine != "sglang":  # the eagle3 format's SGLang export
        raise BadInputError("--sglang-version", req.sglang_version, "only with --engine sglang")
    if req.push_to_hub:
        from draftsmith.train.hub import check_repo_id

        check_repo_id(req.push_to_hub)
    for name in ("bench", "vllm_check"):
        value = getattr(req, name)
        if value and not Path(value).is_file():
            raise BadInputError(f"--{name.replace('_', '-')}", value, "an existing JSON file")
    return layouts[req.format]


def _inputs(req: ExportRequest, folder: Path, reads: str | None) -> list[tuple[str, Path]]:
    """What the export reads, each with the flag that names it: the head (and the run folder given),
    the run's files, the card's JSON files, the verifier or target it describes or appends to."""
    named = [("CHECKPOINT", req.checkpoint), ("CHECKPOINT", str(folder))]
    run = _run_dir(folder)
    if run is not None:  # run_facts reads the run's config and metrics
        named += [("CHECKPOINT", str(run / "config.yaml")), ("CHECKPOINT", str(run / "metrics.jsonl"))]
    named += [("--bench", req.bench), ("--vllm-check", req.vllm_check)]
    if reads is not None:  # the layout reads the verifier's or the target's folder too
        flag, given = f"--{reads}", getattr(req, reads)
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


def _license(req: ExportRequest, config: dict) -> str:
    """`--license`, else Apache-2.0 for the embedded SmolLM2 target, else 'other' (check the target's)."""
    if req.license:
        return req.license
    return "apache-2.0" if config.get("target", "").startswith("HuggingFaceTB/SmolLM2") else "other"
