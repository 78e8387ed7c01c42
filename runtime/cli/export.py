"""`draftsmith export`: the CLI shell over `draftsmith.train.export.export` (lazy import)."""

from __future__ import annotations

import argparse
import textwrap

from draftsmith.runtime.cli.args import add_verb, declare_needs, declare_outputs
from draftsmith.runtime.errors import flag_needs

INTRO = (
    "Export a head folder (or a run folder: its final/) in a layout engines load. Every export is\n"
    "read back and compared tensor by tensor before it is renamed into place, and gets a README.md\n"
    "model card (Hub metadata, training data, measured tau/speedup when --bench is given, serve\n"
    "commands for vLLM and SGLang)."
)
EXAMPLES = (
    "examples:\n"
    "  draftsmith export runs/eagle3-smollm2-135m --format eagle3 --out exports/eagle3-sglang\n"
    "  draftsmith export runs/eagle3-smollm2-135m --format eagle3 --engine vllm --out exports/vllm\n"
    "  draftsmith export runs/eagle3-smollm2-135m --format speculators --out exports/spec \\\n"
    "      --bench runs/bench-eagle3/compare-sharegpt.json --push-to-hub me/smol-eagle3 --private\n"
    "  draftsmith export runs/mtp-smollm2-135m --format mtp --out exports/mtp-deepseek\n"
    "  draftsmith export runs/medusa-smollm2-135m --format medusa --out exports/medusa-vllm\n"
    "  draftsmith export runs/eagle3-smollm2-135m --format speculators --quantize fp8 --out exports/fp8\n"
    "  draftsmith export runs/eagle3-smollm2-135m --format gguf --out exports/eagle3-gguf   # llama.cpp\n"
    "  draftsmith export runs/eagle3-smollm2-135m --quantize int8 --out exports/eagle3-int8"
)


def formats_text(width: int = 100) -> str:
    """The `formats:` section: every layout of the registry, the kinds it fits and its `about` line."""
    from draftsmith.runtime.heads import head_kinds  # imports torch: only when the help is printed

    lines = ["formats:"]
    for name, kinds in head_kinds.formats().items():
        layout = head_kinds.get(kinds[0]).all_layouts()[name]
        fits = "every kind" if name == "draftsmith" else ", ".join(kinds)
        text = f"({fits}) {layout.about}".strip()
        wrapped = textwrap.wrap(text, width - 15) or [""]
        lines.append(f"  {name:<12} {wrapped[0]}")
        lines += [" " * 15 + more for more in wrapped[1:]]
    return "\n".join(lines)


def lazy_formats(parser: argparse.ArgumentParser) -> None:
    """Fill the description's {formats} only when help is printed: the CLI module stays free of torch
    (tests/test_imports.py), and the list stays the registry's (runtime/heads/head_kinds.py)."""
    template, format_help = parser.description, parser.format_help

    def with_formats() -> str:
        parser.description = template.replace("{formats}", formats_text())
        return format_help()

    parser.format_help = with_formats


def add_export(sub) -> None:
    about = "write a trained head in an engine's layout (with a model card); push it to the Hub"
    description = INTRO + "\n\n{formats}\n\n" + EXAMPLES  # formats: from the registry, when printed
    p = add_verb(sub, "export", about, description, run=run_export)
    lazy_formats(p)
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a head folder or a run folder (uses final/)")
    p.add_argument(
        "--format", default="draftsmith", help="an export layout of the head's kind (formats above)"
    )
    p.add_argument("--out", required=True, help="the export folder (new or empty; see --overwrite)")
    add_layout_args(p)
    add_card_args(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing export folder")
    add_hub_args(p)
    declare_outputs(p, dirs=("--out",))


def add_layout_args(p: argparse.ArgumentParser) -> None:
    """What the chosen layout needs: the aux-id convention, the verifier or target, quantization, depth."""
    p.add_argument(
        "--engine", default="sglang", help="eagle3 format: whose aux-id convention, sglang or vllm"
    )
    p.add_argument(
        "--verifier", help="speculators format: the verifier written in the config (default: target)"
    )
    p.add_argument(
        "--target",
        help="mtp format: the target to append the modules to (default: the head's); eagle3 format of a "
        "co-trained head: the target it is exported for (checked against the head's binding)",
    )
    p.add_argument(
        "--any-target",
        action="store_true",
        help="a co-trained EAGLE-3 head: export it for a --verifier/--target other than its own co-trained "
        "target (refused otherwise)",
    )
    p.add_argument(
        "--quantize",
        choices=("fp8", "int8"),
        help="fp8: an EAGLE-3 head's linears as FP8 e4m3 (per-channel scales) with the compressed-tensors "
        "quantization_config vLLM loads (--format speculators, or eagle3 --engine vllm); int8: "
        "draftsmith's own int8 CPU folder (--format draftsmith, any kind). The card states the precision",
    )
    p.add_argument(
        "--llamacpp",
        default=".venv-llamacpp",
        help="gguf format: the llama.cpp setup whose converter writes the file "
        "(bash scripts/setup_llamacpp.sh)",
    )
    p.add_argument(
        "--sglang-version",
        help="eagle3 format for SGLang: the release that will serve it; required for a head with EAGLE-3.1 "
        "options (fc_norm, norm_output: >= 0.5.12; norm_before_fc: >= 0.5.17), which older SGLang skips",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=3,
        help="drafted tokens per step written in the speculators config and the serve commands",
    )


def add_card_args(p: argparse.ArgumentParser) -> None:
    """What the model card records besides the head: bench rows, the vLLM check, the license."""
    p.add_argument(
        "--bench",
        help="a bench JSON (compare-*.json / results.json): its rows for this head go into the model card",
    )
    p.add_argument("--vllm-check", help="scripts/check_vllm.sh's summary.json, recorded in the model card")
    p.add_argument("--license", help="model card license (default: apache-2.0 for SmolLM2 heads, else other)")


def add_hub_args(p: argparse.ArgumentParser) -> None:
    """--push-to-hub and the options that need it."""
    p.add_argument("--push-to-hub", metavar="REPO_ID", help="also upload the folder to this Hub repository")
    p.add_argument("--private", action="store_true", help="create the Hub repository private")
    p.add_argument("--revision", help="Hub branch to push to (created if missing)")
    declare_needs(
        p,
        *(
            flag_needs(f, "--push-to-hub", lambda a: a.push_to_hub is not None)
            for f in ("--private", "--revision")
        ),
    )


def run_export(args: argparse.Namespace) -> None:
    from draftsmith.train.export import ExportRequest, export

    out = export(
        ExportRequest(
            checkpoint=args.checkpoint,
            format=args.format,
            out=args.out,
            engine=args.engine,
            verifier=args.verifier,
            target=args.target,
            bench=args.bench,
            vllm_check=args.vllm_check,
            speculative_tokens=args.num_speculative_tokens,
            any_target=args.any_target,
            quantize=args.quantize,
            llamacpp=args.llamacpp,
            sglang_version=args.sglang_version,
            license=args.license,
            push_to_hub=args.push_to_hub,
            private=args.private,
            revision=args.revision,
            overwrite=args.overwrite,
        )
    )
    print(out)
