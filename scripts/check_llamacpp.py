"""Does llama.cpp's own speculative decoding run draftsmith's EAGLE-3 head, as `export --format gguf` writes
it, and accept exactly what draftsmith's runtime accepts? A control GGUF that reads other layers must not.

    bash scripts/setup_llamacpp.sh --gguf F32         # once: llama.cpp's tool and converter, the target's F32
    .venv/bin/python scripts/check_llamacpp.py [--head heads/eagle3-smollm2-135m] [--k 2] [--num-prompts 4]
        [--max-tokens 32] [--prompts configs/prompts/runtime-bench.jsonl] [--out runs/check-llamacpp]

1. export   the head as `--format gguf` (llama.cpp's converter, checked tensor by tensor) and the control: the
            same head with every aux-layer id one lower, so llama.cpp feeds it the previous layers' states
            (what the converter's silent fallback or a convention mix-up does to a head).
2. draftsmith  `generate` at T = 0, fp32: plain, and `--draft eagle3:HEAD --tree chain:K` (--json rows: the
            chat-templated prompt ids, the text, the accepted tokens of each cycle).
3. llama.cpp   `llama-speculative-simple` (runtime/bench/llamacpp_spec.py) on the target's F32 GGUF (the
            same weights as draftsmith's fp32 target), greedy, K drafted a step, per prompt, with the head and
            with the control; its prompt is the same chat-templated text (its token count is checked).
4. compare  per prompt: llama.cpp's ids (read from its debug log) equal draftsmith's plain and speculative
            ids (both heads: speculation is lossless); llama.cpp's accepted count of every step equals
            draftsmith's, except the last: llama.cpp is given the prompt and the prefill's greedy token (it
            prefills all but the last token given and verifies [last, drafts], so its step j is then
            draftsmith's cycle j). The control's counts must differ. A table on stdout, OUT/summary.json;
            exit 1 when a check fails.
llama.cpp stops once more than -n tokens are out, so draftsmith generates --max-tokens + 2 (the prefill's
token and the overshoot); ids are compared up to the shorter run, steps up to the last common one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from draftsmith.runtime.bench.llamacpp_spec import SpecRequest, run_spec, spec_tool
from draftsmith.train.export import ExportRequest, export


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tool = spec_tool(args.setup)
    head_gguf, control_gguf = exports(args, out)
    plain = draftsmith_rows(args, out / "draftsmith-plain.jsonl", [])
    spec = draftsmith_rows(args, out / "draftsmith-eagle3.jsonl", ["--draft", f"eagle3:{args.head}"])
    decode = tokenizer(args.target).decode
    rows = []
    for i, (p, s) in enumerate(zip(plain, spec, strict=True)):
        text = decode(p["prompt_token_ids"] + p["token_ids"][:1])  # the prompt and the prefill's token
        runs = {}
        for name, gguf in (("head", head_gguf), ("control", control_gguf)):
            req = SpecRequest(args.target_gguf, str(gguf), text, args.max_tokens, args.k, args.threads)
            req.per_step = True
            runs[name] = run_spec(tool, req)
        rows.append(compare(i, p, s, runs))
    return report(rows, out, args)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head", default="heads/eagle3-smollm2-135m")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--target-gguf", default="runs/gguf/smollm2-135m.F32.gguf")
    p.add_argument("--setup", default=".venv-llamacpp", help="scripts/setup_llamacpp.sh's folder")
    p.add_argument("--prompts", default="configs/prompts/runtime-bench.jsonl")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="runs/check-llamacpp")
    args = p.parse_args()
    if not Path(args.target_gguf).is_file():
        p.error(f"--target-gguf {args.target_gguf}: no such file (bash scripts/setup_llamacpp.sh --gguf F32)")
    return args


def exports(args, out: Path) -> tuple[Path, Path]:
    """The head's GGUF and the control's (aux ids one lower: the previous layers' states)."""
    shifted = out / "head-aux-minus-1"
    shutil.rmtree(shifted, ignore_errors=True)
    shutil.copytree(args.head, shifted)
    config = json.loads((shifted / "config.json").read_text())
    config["aux_layer_ids"] = [i - 1 for i in config["aux_layer_ids"]]
    (shifted / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    folders = []
    for name, head in (("gguf", args.head), ("control-gguf", shifted)):
        req = ExportRequest(str(head), "gguf", str(out / name), llamacpp=args.setup, overwrite=True)
        folders.append(export(req) / "head.gguf")
    return folders[0], folders[1]


def draftsmith_rows(args, path: Path, draft: list[str]) -> list[dict]:
    """`draftsmith generate --json` at T = 0, fp32: one row per prompt."""
    prompts = path.with_suffix(".prompts.jsonl")
    prompts.write_text("".join(Path(args.prompts).read_text().splitlines(keepends=True)[: args.num_prompts]))
    command = [str(Path(sys.executable).parent / "draftsmith"), "generate", "--target", args.target]
    command += [*draft, "--tree", f"chain:{args.k}"] if draft else []
    command += ["--temperature", "0", "--dtype", "float32", "--max-new-tokens", str(args.max_tokens + 2)]
    command += ["--prompts", str(prompts), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"draftsmith generate failed:\n{done.stderr[-2000:]}")
    path.write_text(done.stdout)
    return [json.loads(line) for line in done.stdout.splitlines()]


def tokenizer(target: str):
    """The target's tokenizer: prompts go to llama.cpp as text (special tokens spelled out), which it
    tokenizes back (the token count is checked)."""
    from transformers import AutoTokenizer

    from draftsmith.runtime.core.targets import resolve_target

    return AutoTokenizer.from_pretrained(resolve_target(target).path)


def compare(i: int, plain: dict, spec: dict, runs: dict) -> dict:
    """llama.cpp continues after the prefill's token, so its step j is draftsmith's cycle j. The runs' last
    steps may differ (their budgets end differently: llama.cpp overshoots -n), and so may their lengths."""
    head, control = runs["head"], runs["control"]
    ours = spec["accepted_lengths"]
    common = min(len(head.accepted), len(ours)) - 1

    def same_ids(run) -> bool:  # up to the shorter run: llama.cpp overshoots, draftsmith stops at its budget
        ids, plain_ids = plain["token_ids"][:1] + run.token_ids, plain["token_ids"]
        n = min(len(ids), len(plain_ids))
        return spec["token_ids"] == plain_ids and ids[:n] == plain_ids[:n] and n >= len(plain_ids) - 1

    checks = {
        "prompt tokens": head.prompt_tokens == len(plain["prompt_token_ids"]) + 1,
        "ids = draftsmith's": same_ids(head),
        "control ids = plain": same_ids(control),
        "steps": common > 0 and head.accepted[:common] == ours[:common],
    }
    return {
        "prompt": i,
        "new_tokens": spec["new_tokens"],
        "steps_compared": common,
        "draftsmith_accepted": sum(ours[:common]),  # over the steps compared
        "draftsmith_per_step": ours,
        "llamacpp_accepted": sum(head.accepted[:common]),
        "llamacpp_per_step": head.accepted,
        "control_accepted": control.n_accept,
        "control_per_step": control.accepted,
        "checks": checks,
    }


def report(rows: list[dict], out: Path, args) -> int:
    print(
        f"{'prompt':>6} {'tokens':>6} {'draftsmith':>10} {'llama.cpp':>9} {'steps':>8} {'control':>7}  checks"
    )
    for r in rows:
        failed = [name for name, ok in r["checks"].items() if not ok]
        print(
            f"{r['prompt']:>6} {r['new_tokens']:>6} {r['draftsmith_accepted']:>10} "
            f"{r['llamacpp_accepted']:>9} "
            f"{r['steps_compared']:>8} {r['control_accepted']:>7}  "
            + ("ok" if not failed else "FAILED: " + ", ".join(failed))
        )
    control_differs = any(r["control_per_step"] != r["llamacpp_per_step"] for r in rows)
    passed = control_differs and all(all(r["checks"].values()) for r in rows)
    summary = {"k": args.k, "max_tokens": args.max_tokens, "head": args.head, "rows": rows}
    summary.update(control_differs=control_differs, passed=passed)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"control's counts differ from the head's: {control_differs}; {'passed' if passed else 'FAILED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
