"""Checks and measurements of the data steps on vLLM (`--engine vllm`) against draftsmith's engine.

    python scripts/vllm_data_check.py regen-agree  --target T --draftsmith A --vllm B [--out J]
    python scripts/vllm_data_check.py same-rows    --source DIR --a A --b B
    python scripts/vllm_data_check.py capture-agree --draftsmith A --vllm B [--rtol 1e-4]
    python scripts/vllm_data_check.py bench --data DIR --out J [--batches 8,32,64] [--max-new-tokens 128]
                                            [--engines draftsmith,vllm]
    python scripts/vllm_data_check.py capture-bench --data DIR --out J [--rounds 2] [--max-num-seqs 32]
                                                    [--storage-dtype bfloat16]

Run from the repository root in draftsmith's venv (the vLLM side runs in .venv-vllm by itself);
scripts/check_vllm.sh data calls these. Exit 1 when a check fails.

- regen-agree: two regenerated folders of the same prepared DIR, greedy. Per conversation, the first
  assistant turn whose texts differ is judged by runtime/verify/near_tie.py as the bench does: the target's
  logit gap between the two tokens at the first differing position, after the common history; later
  turns of that conversation take that verdict (their prompts differ already). The token lists are the
  answers re-tokenized (the folders store text), which can only make a tie look like a real difference.
- same-rows: every row of DIR is in A and B exactly once, A and B hold the same messages (kill-and-resume).
- capture-agree: two captures of the same rows; per row and tensor, max |a - b| <= rtol * max |b| (fp32
  captures: 1e-4; bf16 storage rounds each value to 2^-8 relative, use 1e-2).
- bench: regeneration tokens/s of each engine at each batch size (draftsmith: --batch-size; vLLM:
  --max-num-seqs) on the same conversations, fp32, greedy; tokens = the answers re-tokenized (the same
  count for both engines); wall = the step without loading the model (vLLM: without engine start-up).
  Greedy agreement of each run with draftsmith's batch-8 answers (regen-agree's rule) is reported too.
- capture-bench: `draftsmith data capture` tokens/s of each engine on the same prepared DIR, the engines
  alternating for --rounds rounds (a drift in the machine's speed hits both); each run is the CLI in its
  own process, timed by the step's record (`last_run.wall_s`: the capture loop, without loading the model
  or starting vLLM's engine). Prints each run, then the median tokens/s per engine and their ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def messages_by_id(folder) -> dict[str, list[dict]]:
    from draftsmith.data_recipes.parts import load_prepared

    ds = load_prepared(folder)
    return {row["id"]: json.loads(row["messages"]) for split in ds for row in ds[split]}


def agreement(target, a: dict, b: dict) -> dict:
    """Greedy agreement of regenerated conversations `b` with `a` (the reference), near-ties judged."""
    from draftsmith.data_recipes.regenerate import assistant_turns, chat_prompt_ids
    from draftsmith.runtime.verify.near_tie import first_mismatch

    turns = identical = 0
    mismatches = []
    for row_id, ref in a.items():
        got = b.get(row_id)
        if got is None:
            mismatches.append({"row": row_id, "missing": True, "near_tie": False})
            continue
        for index in assistant_turns(ref):
            turns += 1
            if ref[index] == got[index]:
                identical += 1
                continue
            prompt = chat_prompt_ids(target, ref[:index])  # the common history (earlier turns agreed)
            tok = target.tokenizer
            want = tok(ref[index]["content"], add_special_tokens=False)["input_ids"]
            mine = tok(got[index]["content"], add_special_tokens=False)["input_ids"]
            m = first_mismatch(target, prompt, mine, want)
            entry = {"row": row_id, "turn": index, **(m.as_dict() if m else {"near_tie": True})}
            entry["later_turns"] = len([i for i in assistant_turns(ref) if i > index])
            mismatches.append(entry)
            break  # later turns follow different histories: they take this verdict
    return {
        "turns": turns,
        "identical_turns": identical,
        "greedy_identical": not mismatches,
        "greedy_near_ties_only": all(m["near_tie"] for m in mismatches),
        "mismatches": mismatches[:20],
    }


def cmd_regen_agree(args) -> int:
    from draftsmith.runtime.core.target import Target

    target = Target.load(args.target, device="cpu", dtype="float32")
    result = agreement(target, messages_by_id(args.draftsmith), messages_by_id(args.vllm))
    print(json.dumps({k: v for k, v in result.items() if k != "mismatches"}))
    for m in result["mismatches"]:
        print("  mismatch:", json.dumps(m))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["greedy_near_ties_only"] else 1


def cmd_same_rows(args) -> int:
    source, a, b = messages_by_id(args.source), messages_by_id(args.a), messages_by_id(args.b)
    from draftsmith.data_recipes.parts import load_prepared

    counts = [sorted(r["id"] for split in load_prepared(f).values() for r in split) for f in (args.a, args.b)]
    ok = counts[0] == counts[1] == sorted(source) and a == b
    print(f"same-rows: {len(source)} rows; each once in both: {counts[0] == counts[1] == sorted(source)}; "
          f"same messages: {a == b}")  # fmt: skip
    return 0 if ok else 1


def cmd_capture_agree(args) -> int:
    from draftsmith.data_recipes.capture_reader import CaptureFolder

    a, b = CaptureFolder(args.vllm), CaptureFolder(args.draftsmith)
    worst, ok = {}, len(a) == len(b)
    for i in range(min(len(a), len(b))):
        ok &= a[i]["input_ids"].tolist() == b[i]["input_ids"].tolist()
        ok &= a[i]["loss_mask"].tolist() == b[i]["loss_mask"].tolist()
        for name in ("aux_hidden", "last_hidden"):
            x, y = a[i][name].float(), b[i][name].float()
            worst[name] = max(worst.get(name, 0.0), ((x - y).abs().max() / y.abs().max()).item())
    ok &= all(v <= args.rtol for v in worst.values())
    print(f"capture-agree: {len(a)} vs {len(b)} rows; max |vllm - draftsmith| / max |draftsmith|: "
          f"{json.dumps(worst)} (allowed {args.rtol}): {'ok' if ok else 'FAILED'}")  # fmt: skip
    return 0 if ok else 1


def answer_tokens(tokenizer, folder) -> int:
    from draftsmith.data_recipes.regenerate import assistant_turns

    return sum(
        len(tokenizer(m[i]["content"], add_special_tokens=False)["input_ids"])
        for m in messages_by_id(folder).values()
        for i in assistant_turns(m)
    )


def cmd_bench(args) -> int:
    from draftsmith.data_recipes import regenerate as regen
    from draftsmith.data_recipes import vllm_regenerate as vregen
    from draftsmith.data_recipes.vllm_engine import TargetView, find_python
    from draftsmith.runtime.core.target import Target
    from draftsmith.runtime.verify.sampling import SamplingParams

    target = Target.load(args.target, device="cpu", dtype="float32")
    view = TargetView.load(args.target, dtype="float32")
    engines = args.engines.split(",")
    python = find_python(args.vllm_python) if "vllm" in engines else None
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-", dir=args.work))
    rows, folders = [], {}
    for engine in engines:
        for batch in [int(b) for b in args.batches.split(",")]:
            out = work / f"{engine}-{batch}"
            t0 = time.perf_counter()
            if engine == "draftsmith":
                regen.regenerate(target, args.data, out, SamplingParams(), args.max_new_tokens, 0, batch,
                                 progress=False)  # fmt: skip
                wall, exact, init = time.perf_counter() - t0, None, None
            else:
                done = vregen.regenerate_vllm(view, args.data, out, SamplingParams(), args.max_new_tokens, 0,
                                              batch, python=python, progress=False)  # fmt: skip
                gen = done["outputs"]["generation"]
                init = gen["engine_init_s"]
                wall, exact = time.perf_counter() - t0 - (init or 0), gen["tokens"]
            tokens = answer_tokens(target.tokenizer, out)
            folders[(engine, batch)] = out
            row = {"engine": engine, "batch": batch, "answer_tokens": tokens, "wall_s": round(wall, 2),
                   "tokens_per_s": round(tokens / wall, 2), "vllm_generated_tokens": exact,
                   "engine_init_s": init and round(init, 1)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    reference = folders.get(("draftsmith", min(int(b) for b in args.batches.split(","))))
    if reference is not None:
        ref = messages_by_id(reference)
        for row in rows:
            got = agreement(target, ref, messages_by_id(folders[(row["engine"], row["batch"])]))
            row.update({k: got[k] for k in ("turns", "identical_turns", "greedy_identical",
                                              "greedy_near_ties_only")})  # fmt: skip
            row["mismatches"] = got["mismatches"]
    Path(args.out).write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=1) + "\n")
    print("engine      batch  tokens/s  wall s  greedy vs draftsmith batch 8")
    for r in rows:
        verdict = "identical" if r.get("greedy_identical") else (
            "near-ties only" if r.get("greedy_near_ties_only") else "DIFFERENT")  # fmt: skip
        verdict = verdict if "turns" in r else "not compared (no draftsmith run)"
        print(f"{r['engine']:<11} {r['batch']:>5}  {r['tokens_per_s']:>8}  {r['wall_s']:>6}  "
              f"{verdict} ({r.get('identical_turns')}/{r.get('turns')} turns)")  # fmt: skip
    return 0


def capture_run(engine: str, args, out: Path) -> dict:
    """One `draftsmith data capture` run in its own process; its tokens and wall time from its record."""
    import subprocess

    cmd = [str(Path(sys.executable).parent / "draftsmith"), "data", "capture", "--engine", engine,
           "--target", args.target, "--data", args.data, "--out", str(out),
           "--storage-dtype", args.storage_dtype, "--max-num-seqs", str(args.max_num_seqs),
           *(["--vllm-python", args.vllm_python] if args.vllm_python else [])]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    outputs = json.loads((out / "draftsmith_data.json").read_text())["outputs"]
    wall = outputs["last_run"]["wall_s"]
    return {"engine": engine, "tokens": outputs["tokens"], "rows": outputs["rows"], "wall_s": wall,
            "tokens_per_s": round(outputs["tokens"] / wall, 1)}  # fmt: skip


def cmd_capture_bench(args) -> int:
    import shutil
    import statistics

    engines = args.engines.split(",")
    work = Path(tempfile.mkdtemp(prefix="capture-bench-", dir=args.work))
    rows = []
    for round_ in range(args.rounds):
        for engine in engines if round_ % 2 == 0 else engines[::-1]:  # ABBA: neither always goes first
            out = work / f"{engine}-{round_}"
            row = {"round": round_, **capture_run(engine, args, out)}
            shutil.rmtree(out)
            rows.append(row)
            print(json.dumps(row), flush=True)
    median = {e: statistics.median(r["tokens_per_s"] for r in rows if r["engine"] == e) for e in engines}
    report = {"settings": vars(args), "rows": rows, "median_tokens_per_s": median}
    if len(engines) == 2:
        report["ratio"] = {f"{engines[1]}/{engines[0]}": round(median[engines[1]] / median[engines[0]], 3)}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("median capture tokens/s:", json.dumps(median), json.dumps(report.get("ratio", {})))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("regen-agree")
    a.add_argument("--target", default="smollm2-135m")
    a.add_argument("--draftsmith", required=True)
    a.add_argument("--vllm", required=True)
    a.add_argument("--out")
    s = sub.add_parser("same-rows")
    s.add_argument("--source", required=True)
    s.add_argument("--a", required=True)
    s.add_argument("--b", required=True)
    c = sub.add_parser("capture-agree")
    c.add_argument("--draftsmith", required=True)
    c.add_argument("--vllm", required=True)
    c.add_argument("--rtol", type=float, default=1e-4)
    b = sub.add_parser("bench")
    b.add_argument("--target", default="smollm2-135m")
    b.add_argument("--data", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--batches", default="8,32,64")
    b.add_argument("--engines", default="draftsmith,vllm")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--vllm-python")
    b.add_argument("--work", default=None, help="where the regenerated folders go (a temp folder in it)")
    cb = sub.add_parser("capture-bench")
    cb.add_argument("--target", default="smollm2-135m")
    cb.add_argument("--data", required=True)
    cb.add_argument("--out", required=True)
    cb.add_argument("--engines", default="draftsmith,vllm")
    cb.add_argument("--rounds", type=int, default=2)
    cb.add_argument("--max-num-seqs", type=int, default=32)
    cb.add_argument("--storage-dtype", default="bfloat16")
    cb.add_argument("--vllm-python")
    cb.add_argument("--work", default=None, help="where the captures go while timed (a temp folder in it)")
    args = p.parse_args(argv)
    run = {"regen-agree": cmd_regen_agree, "same-rows": cmd_same_rows, "capture-agree": cmd_capture_agree,
           "bench": cmd_bench, "capture-bench": cmd_capture_bench}  # fmt: skip
    return run[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
