"""`draftsmith export`: the CLI shell over `draftsmith.train.export.export` (lazy import)."""

from __future__ import annotations

import argparse

from draftsmith.runtime.cli.args import Formatter


def add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a trained head in an engine's layout (with a model card); push it to the Hub",
        formatter_class=Formatter,
        description=(
            "Export a head folder (or a run folder: its final/) in a layout engines load. Every export is\n"
            "read back and compared tensor by tensor before it is renamed into place, and gets a README.md\n"
            "model card (Hub metadata, training data, measured tau/speedup when --bench is given, serve\n"
            "commands for vLLM and SGLang).\n\n"
            "formats:\n"
            "  draftsmith   our folder (config.json + model.safetensors), what --draft eagle3:/mtp: reads\n"
            "  eagle3       official / SGLang EAGLE-3 layout (LlamaForCausalLMEagle3, midlayer.*, d2t);\n"
            "               vLLM's `method: eagle3` loads it too. Aux-layer ids mean different tensors\n"
            "               in SGLang (output of layer X) and vLLM (input to layer X): --engine picks\n"
            "               whose convention to write\n"
            "  speculators  vLLM's native layout (speculators_config, layers.0.*, aux ids in vLLM's\n"
            "               convention): `vllm serve DIR`\n"
            "  mtp          MTP modules in DeepSeek's layout: the target plus layers L..L+M-1 and\n"
            "               num_nextn_predict_layers (draftsmith generate --target DIR --draft mtp:DIR)\n"
            "  mtp-mimo     one MTP module in MiMo's layout (the target as MiMoForCausalLM: Qwen2 with zero\n"
            '               q/k/v biases): vllm serve DIR --speculative-config \'{"method": "mtp", ...}\'\n\n'
            "examples:\n"
            "  draftsmith export runs/eagle3-smollm2-135m --format eagle3 --out exports/eagle3-sglang\n"
            "  draftsmith export runs/eagle3-smollm2-135m --format eagle3 --engine vllm --out exports/vllm\n"
            "  draftsmith export runs/eagle3-smollm2-135m --format speculators --out exports/spec \\\n"
            "      --bench runs/bench-eagle3/compare-sharegpt.json --push-to-hub me/smol-eagle3 --private\n"
            "  draftsmith export runs/mtp-smollm2-135m --format mtp --out exports/mtp-deepseek"
        ),
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a head folder or a run folder (uses final/)")
    p.add_argument("--format", default="draftsmith", help="draftsmith, eagle3, speculators, mtp or mtp-mimo")
    p.add_argument("--out", required=True, help="the export folder (new or empty; see --overwrite)")
    p.add_argument(
        "--engine", default="sglang", help="eagle3 format: whose aux-id convention, sglang or vllm"
    )
    p.add_argument(
        "--verifier", help="speculators format: the verifier written in the config (default: target)"
    )
    p.add_argument("--target", help="mtp format: the target to append the modules to (default: the head's)")
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=3,
        help="drafted tokens per step written in the speculators config and the serve commands",
    )
    p.add_argument(
        "--bench",
        help="a bench JSON (compare-*.json / results.json): its rows for this head go into the model card",
    )
    p.add_argument("--vllm-check", help="scripts/check_vllm.sh's summary.json, recorded in the model card")
    p.add_argument("--license", help="model card license (default: apache-2.0 for SmolLM2 heads, else other)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export folder")
    p.add_argument("--push-to-hub", metavar="REPO_ID", help="also upload the folder to this Hub repository")
    p.add_argument("--private", action="store_true", help="create the Hub repository private")
    p.add_argument("--revision", help="Hub branch to push to (created if missing)")
    p.set_defaults(run=run_export)


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
            license=args.license,
            push_to_hub=args.push_to_hub,
            private=args.private,
            revision=args.revision,
            overwrite=args.overwrite,
        )
    )
    print(out)
