"""The serving core before and after a change, side by side in one run (issue 41's Measure).

    python scripts/studies/core_cycle_bench.py --before /work/before --out runs/core-cycle

Runs `draftsmith bench` from two checkouts of this repository (--before, a `git worktree` of the old
commit, and --after, default this one) on the embedded SmolLM2-135M target, interleaved: each repeat runs
both checkouts, in alternating order, on the same prompts, drafts and trees; the table is the median of
the repeats per method and batch size: tokens/s, draft and verify ms per cycle, tau, and after/before.
Drafts: ngram chain:2, the shipped EAGLE-3 head (chain:2 and a dynamic tree), and MTP (2 modules) and
Medusa (3 heads) heads made here with a fixed seed and saved once, so both checkouts load the same
weights (untrained: they time the cycle, their acceptance is low). Each checkout is imported through a
folder of links (draftsmith/runtime -> CHECKOUT/runtime, ...) put first on PYTHONPATH.
It also counts host synchronizations per cycle in each checkout (every tolist/item/bool/int/float of a
tensor during a batched generation, over the cycles it ran).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"runtime": "runtime", "train": "train", "kernels": "gpu_kernels", "data_recipes": "data_recipes",
            "configs": "configs", "heads": "heads"}  # fmt: skip
SYNCS = """
import collections, torch, json, sys
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec
target = Target.load("smollm2-135m")
prompts = [target.encode(p) for p in ("Write a haiku about rain.", "List three prime numbers.", "Hi!")]
out = {}
for spec, tree in json.loads(sys.argv[1]):
    drafter = build_drafter(spec, target, parse_tree_spec(tree))
    counts = collections.Counter()
    originals = {n: getattr(torch.Tensor, n) for n in ("tolist", "item", "__bool__", "__int__", "__float__")}
    def counted(n, f):
        return lambda self, *a, **k: counts.update([n]) or f(self, *a, **k)
    for n, f in originals.items():
        setattr(torch.Tensor, n, counted(n, f))
    results = generate_speculative(target, drafter, prompts, SamplingParams(), 24, batch_size=3)
    for n, f in originals.items():
        setattr(torch.Tensor, n, f)
    cycles = max(len(r.accepted_lengths) for r in results)
    out[f"{spec.split(':')[0]}@{tree}"] = round((sum(counts.values()) - 1) / cycles, 2)
print(json.dumps(out))
"""


def shim(checkout: Path, where: Path) -> Path:
    """A folder whose draftsmith/* link to the checkout's package folders."""
    package = where / "draftsmith"
    package.mkdir(parents=True)
    for name, folder in PACKAGES.items():
        (package / name).symlink_to(checkout / folder)
    return where


def make_heads(out: Path) -> dict[str, Path]:
    """MTP (2 modules) and Medusa (3 heads) folders for the embedded target, seeded, saved once."""
    import torch

    from draftsmith.runtime.core.target import Target
    from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads
    from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, save_head

    target = Target.load("smollm2-135m")
    folders = {"mtp": out / "heads" / "mtp", "medusa": out / "heads" / "medusa"}
    if not folders["mtp"].is_dir():
        torch.manual_seed(0)
        save_head(MtpHead(MtpConfig.for_target(target, num_modules=2)), folders["mtp"])
    if not folders["medusa"].is_dir():
        torch.manual_seed(0)
        MedusaHeads(MedusaConfig.for_target(target, num_heads=3)).init_from_target(target).save_pretrained(
            folders["medusa"]
        )
    return folders


def run(path: Path, argv: list[str], env: dict) -> None:
    code = f"import sys; from draftsmith.runtime.cli.main import main; sys.exit(main({argv!r}))"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the old commit")
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "core-cycle")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    heads = make_heads(args.out)
    eagle = ROOT / "heads" / "eagle3-smollm2-135m"
    drafts = ["ngram@chain:2", f"eagle3:{eagle}@chain:2", f"eagle3:{eagle}@dynamic:depth=3,topk=2,tokens=6",
              f"mtp:{heads['mtp']}@chain:2", f"medusa:{heads['medusa']}@chain:2"]  # fmt: skip
    bench = ["bench", "--prompts", "sharegpt", "--num-prompts", str(args.num_prompts), "--max-new-tokens",
             str(args.max_new_tokens), "--temperatures", "0", "--batch-sizes", "1,4", "--repeats", "1",
             "--no-plots", "--no-roofline", "--baselines", "plain"]  # fmt: skip
    for d in drafts:
        bench += ["--draft", d]
    rows: dict[tuple, dict[str, list[dict]]] = {}
    syncs = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {
            "before": shim(args.before.resolve(), Path(tmp) / "b"),
            "after": shim(args.after.resolve(), Path(tmp) / "a"),
        }
        envs = {side: os.environ | {"PYTHONPATH": str(path)} for side, path in sides.items()}
        probe = json.dumps(
            [
                ["ngram", "chain:2"],
                [f"eagle3:{eagle}", "chain:2"],
                [f"eagle3:{eagle}", "dynamic:depth=3,topk=2,tokens=6"],
            ]
        )
        for side, env in envs.items():
            got = subprocess.run(
                [sys.executable, "-c", SYNCS, probe],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            syncs[side] = json.loads(got.stdout.strip().splitlines()[-1])
        for r in range(args.repeats):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for side in order:
                out = args.out / side / f"repeat{r}"
                run(args.after, [*bench, "--out", str(out)], envs[side])
                for row in json.loads((out / "results.json").read_text()):
                    rows.setdefault((row["method"], row["batch_size"]), {}).setdefault(side, []).append(row)
    report(rows, syncs, args)


def median(rows: list[dict], key: str):
    values = [r.get(key) for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def report(rows: dict, syncs: dict, args) -> None:
    head = ["method", "batch", "tok/s before", "tok/s after", "after/before", "draft ms before",
            "draft ms after", "verify ms before", "verify ms after", "tau"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (method, batch), sides in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        b, a = sides.get("before", []), sides.get("after", [])
        tb, ta = median(b, "tokens_per_s"), median(a, "tokens_per_s")
        cells = [method, batch, tb, ta, ta / tb if tb and ta else None]
        for key in ("draft_ms_per_cycle", "verify_ms_per_cycle"):
            cells += [median(b, key), median(a, key)]
        cells.append(median(a, "mean_accepted"))
        lines.append("| " + " | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in cells) + " |")
    lines += ["", f"host syncs per cycle (batch 3, greedy): before {syncs['before']}, after {syncs['after']}"]
    text = "\n".join(lines)
    (args.out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
