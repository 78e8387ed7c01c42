"""vLLM side of scripts/check_vllm.sh: run vLLM (CPU) on draftsmith's prompt token ids, and compare.

    # inside the vLLM venv (.venv-vllm): one engine per process (vLLM spawns workers; the guard below)
    python scripts/check_vllm.py run --model TARGET_DIR --prompts ds.jsonl --out plain.json
    python scripts/check_vllm.py run --model TARGET_DIR --draft HEAD_DIR --k 2 --prompts ds.jsonl --out s.json
    python scripts/check_vllm.py run --model SPECULATORS_DIR --prompts ds.jsonl --out spec-model.json
    python scripts/check_vllm.py run --model T --draft PEAGLE_DIR --k 4 --parallel-drafting ...  # P-EAGLE
    # anywhere (stdlib only): the comparison table and summary.json
    python scripts/check_vllm.py compare --draftsmith ds.jsonl --plain plain.json --spec NAME=spec.json ...

`run` reads the prompts as token ids from draftsmith's `generate --json` output (`prompt_token_ids`), so
both sides see exactly the same chat-templated prompt. It decodes greedily (temperature 0, fp32, eager),
after a 4-token warm-up, and writes the new token ids, the wall time and, for speculative runs, the
spec-decode counters from `llm.get_metrics()` (differences across the timed call): drafts, draft tokens,
accepted tokens per position. The plain run also records the top-2 logprobs of each step, so that a
greedy mismatch can be called a near-tie (or not). `run` writes {"error": ...} instead when vLLM fails.

`compare` counts prompts whose greedy ids differ (vLLM spec vs vLLM plain vs draftsmith), the first
differing position and the plain run's top-1/top-2 logprob margin there, and puts vLLM's per-position
acceptance and tau (1 + accepted / drafts) next to draftsmith's. It exits 1 when a vLLM speculative run
fails to load, disagrees with draftsmith's greedy output or its acceptance counts, or when the control
(the head exported with SGLang's aux-layer ids, which vLLM reads one layer off) reproduces draftsmith's
counts too (then equal counts would not show that the ids are right).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def read_draftsmith(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- run (inside the vLLM venv) ----------------------------------------------------------------------


def spec_snapshot(llm) -> dict:
    """The spec-decode counters now, summed over label sets (one engine here)."""
    snap: dict = {"per_pos": []}
    for m in llm.get_metrics():
        if m.name in SPEC_COUNTERS:
            key = SPEC_COUNTERS[m.name]
            snap[key] = snap.get(key, 0) + int(m.value)
        elif m.name == PER_POS:
            vals = [int(v) for v in m.values]
            old = snap["per_pos"] + [0] * (len(vals) - len(snap["per_pos"]))
            snap["per_pos"] = [a + b for a, b in zip(old, vals)]
    return snap


def spec_stats(before: dict, after: dict) -> dict:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in SPEC_COUNTERS.values()}
    pb = before["per_pos"] + [0] * (len(after["per_pos"]) - len(before["per_pos"]))
    per_pos = [a - b for a, b in zip(after["per_pos"], pb)]
    drafts = delta["drafts"]
    rate = [round(a / drafts, 4) if drafts else None for a in per_pos]  # P(position k accepted), per cycle
    cond = [
        round(per_pos[i] / (per_pos[i - 1] if i else drafts), 4)
        if (per_pos[i - 1] if i else drafts)
        else None
        for i in range(len(per_pos))
    ]  # P(k accepted | k-1 accepted)
    return {
        **delta,
        "accepted_per_pos": per_pos,
        "accept_rate_per_position": rate,
        "conditional_accept_rate": cond,
        "tau": round(1 + delta["accepted_tokens"] / drafts, 4) if drafts else None,
    }


def run(args) -> int:
    result: dict = {"args": vars(args)}
    try:
        import vllm
        from vllm import LLM, SamplingParams

        result["vllm_version"] = vllm.__version__
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in read_draftsmith(args.prompts)]
        kwargs = dict(
            model=args.model,
            dtype="float32",
            enforce_eager=True,
            disable_log_stats=False,
            max_model_len=args.max_model_len,
            seed=0,
            enable_prefix_caching=False,  # the warm-up prompt must not be served from cache in the timed run
            max_num_seqs=args.max_num_seqs,  # 1: one prompt at a time, like draftsmith's batch 1
        )
        if args.method == "mtp":  # the model's own MTP layers (an `export --format mtp-mimo` folder)
            kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": args.k or 1}
        elif args.draft:  # a head folder: eagle3 (the official export) or medusa (vLLM's medusa layout)
            kwargs["speculative_config"] = {
                "method": args.method,
                "model": args.draft,
                "num_speculative_tokens": args.k or 2,
            }
            if args.parallel_drafting:  # a P-EAGLE head in vLLM's EAGLE-3 layout (mask_token_id)
                kwargs["speculative_config"]["parallel_drafting"] = True
        elif args.k:  # --model is a speculators folder: override the K its config carries
            kwargs["speculative_config"] = {"num_speculative_tokens": args.k}
        result["llm_kwargs"] = kwargs
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        result["init_s"] = round(time.perf_counter() - t0, 2)
        spec_cfg = llm.llm_engine.vllm_config.speculative_config
        result["speculative_config"] = (
            None
            if spec_cfg is None
            else {
                "method": spec_cfg.method,
                "model": spec_cfg.model,
                "num_speculative_tokens": spec_cfg.num_speculative_tokens,
                "parallel_drafting": spec_cfg.parallel_drafting,
            }
        )
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # warm-up
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        before = spec_snapshot(llm)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = spec_snapshot(llm)
        rows = [
            {
                "token_ids": list(o.outputs[0].token_ids),
                "finish_reason": o.outputs[0].finish_reason,
                "text": o.outputs[0].text,
            }
            for o in outs
        ]
        if spec_cfg is None:  # untimed second pass: the top-2 logprobs of every greedy step
            params.logprobs = 2
            for row, out in zip(rows, llm.generate(prompts, params, use_tqdm=False)):
                c = out.outputs[0]
                row["same_ids_with_logprobs"] = list(c.token_ids) == row["token_ids"]
                row["top2"] = [  # per step {token id: Logprob} -> the top-2 (id, logprob) pairs
                    sorted(((int(t), lp.logprob) for t, lp in step.items()), key=lambda x: -x[1])[:2]
                    for step in c.logprobs
                ]
        new = sum(len(r["token_ids"]) for r in rows)
        result.update(
            generate_s=round(wall, 2),
            new_tokens=new,
            tokens_per_s=round(new / wall, 2),
            outputs=rows,
            spec=spec_stats(before, after) if spec_cfg else None,
        )
        code = 0
    except Exception as err:  # a layout vLLM rejects is a result, not a crash of the whole check
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc()
        print(result["traceback"], file=sys.stderr)
        code = 3
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return code


# ---- compare (stdlib only) ---------------------------------------------------------------------------


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def diff_report(name: str, a_rows: list[list[int]], b_rows: list[list[int]], plain: dict | None) -> dict:
    mismatches = []
    for p, (a, b) in enumerate(zip(a_rows, b_rows, strict=True)):
        pos = first_diff(a, b)
        if pos is None:
            continue
        item = {"prompt": p, "first_mismatch_pos": pos, "a": a[pos : pos + 3], "b": b[pos : pos + 3]}
        top2 = (plain or {}).get("outputs", [{}] * (p + 1))[p].get("top2")
        if top2 and pos < len(top2) and len(top2[pos]) == 2:  # vLLM plain's margin at that step
            (t1, l1), (t2, l2) = top2[pos]
            item["plain_top2_at_pos"] = {"ids": [t1, t2], "logprob_margin": round(l1 - l2, 6)}
        mismatches.append(item)
    return {
        "pair": name,
        "prompts": len(a_rows),
        "mismatching_prompts": len(mismatches),
        "mismatches": mismatches,
    }


def draftsmith_stats(rows: list[dict]) -> dict:
    """Pooled over prompts like vLLM's counters: cycles = target forwards - 1 (the prefill drafts nothing)."""
    cycles = [r["target_forwards"] - 1 for r in rows]
    k = max(len(r["accept_rate_per_position"]) for r in rows)
    total = sum(cycles)
    # each row's rates are counts / its cycles, rounded to 4 digits: round(rate * cycles) is the count again
    accepted = [
        sum(round(c * (r["accept_rate_per_position"] + [0] * k)[i]) for c, r in zip(cycles, rows))
        for i in range(k)
    ]
    rate = [round(a / total, 4) for a in accepted]
    new = sum(r["new_tokens"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)  # batch 1: each row's own wall time
    return {
        "drafts": total,
        "accepted_per_pos": accepted,
        "accept_rate_per_position": rate,
        "conditional_accept_rate": [
            round(accepted[i] / (accepted[i - 1] if i else total), 4)
            if (accepted[i - 1] if i else total)
            else None
            for i in range(k)
        ],
        "tau": round(1 + sum(accepted) / total, 4) if total else None,
        "tau_per_target_forward": round(new / sum(r["target_forwards"] for r in rows), 4),
        "new_tokens": new,
        "tokens_per_s": round(new / wall, 2) if wall else None,
    }


def compare(args) -> int:
    ds = read_draftsmith(args.draftsmith)
    ds_ids = [r["token_ids"] for r in ds]
    plain = json.load(open(args.plain))
    summary: dict = {
        "vllm_version": plain.get("vllm_version"),
        "prompts": len(ds),
        "max_tokens": args.max_tokens,
        "k": args.k,
        "draftsmith": {"draft": args.draftsmith_draft, **draftsmith_stats(ds)},
        "vllm_plain": {
            k: plain.get(k) for k in ("init_s", "generate_s", "new_tokens", "tokens_per_s", "error")
        },
        "runs": {},
        "greedy": [],
    }
    if args.timings and os.path.exists(args.timings):
        summary["phase_seconds"] = json.load(open(args.timings))
    plain_ok = "error" not in plain
    if plain_ok:
        summary["greedy"].append(
            diff_report("vllm_plain vs draftsmith", [o["token_ids"] for o in plain["outputs"]], ds_ids, plain)
        )
    failed = False
    for item in args.spec:
        name, _, path = item.partition("=")
        spec = json.load(open(path)) if os.path.exists(path) else {"error": f"no output file {path}"}
        entry = {
            k: spec.get(k)
            for k in ("speculative_config", "init_s", "generate_s", "new_tokens", "tokens_per_s")
        }
        if "error" in spec:
            entry["loaded"] = False
            entry["error"] = spec["error"]
            summary["runs"][name] = entry
            failed = True
            continue
        entry["loaded"] = True
        entry.update(spec["spec"] or {})
        summary["runs"][name] = entry
        ids = [o["token_ids"] for o in spec["outputs"]]
        vs_ds = diff_report(f"{name} vs draftsmith", ids, ds_ids, plain if plain_ok else None)
        summary["greedy"].append(vs_ds)
        if plain_ok:
            summary["greedy"].append(
                diff_report(f"{name} vs vllm_plain", ids, [o["token_ids"] for o in plain["outputs"]], plain)
            )
        entry["counts_match_draftsmith"] = same_counts(entry, summary["draftsmith"])
        failed |= vs_ds["mismatching_prompts"] > 0 or not entry["counts_match_draftsmith"]
    if args.control:
        failed |= not add_control(summary, args.control)
    summary["ok"] = not failed
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print_table(summary)
    print(f"wrote {args.out}")
    return 1 if failed else 0


def same_counts(run: dict, ours: dict) -> bool:
    """vLLM and draftsmith drafted as often and had the same tokens accepted at every position."""
    return run.get("drafts") == ours["drafts"] and run.get("accepted_per_pos") == ours["accepted_per_pos"]


def add_control(summary: dict, item: str) -> bool:
    """The negative control: the same head exported with the other engine's aux-layer ids (one layer
    off) must NOT reproduce draftsmith's counts, or equal counts would prove nothing about the ids."""
    name, _, path = item.partition("=")
    run = json.load(open(path)) if os.path.exists(path) else {"error": f"no output file {path}"}
    if "error" in run:
        summary["control"] = {"name": name, "error": run["error"], "discriminates": False}
        return False
    stats = run["spec"] or {}
    differs = not same_counts(stats, summary["draftsmith"])
    summary["control"] = {
        "name": name,
        "drafts": stats.get("drafts"),
        "accepted_per_pos": stats.get("accepted_per_pos"),
        "tau": stats.get("tau"),
        "discriminates": differs,
    }
    return differs


def print_table(s: dict) -> None:
    def row(name, loaded, drafts="-", rates="-", tau="-", tps="-"):
        print(f"{name:<20} {loaded:<7} {drafts!s:>6}  {rates!s:<22} {tau!s:>7} {tps!s:>7}")

    print(
        f"\nvLLM {s['vllm_version']}: {s['prompts']} prompts x {s['max_tokens']} tokens, chain K={s['k']}, ",
        end="",
    )
    print("greedy, fp32, batch 1")
    row("run", "loaded", "drafts", "P(accepted) per pos", "tau", "tok/s")
    d = s["draftsmith"]
    row("draftsmith", "yes", d["drafts"], d["accept_rate_per_position"], d["tau"], d["tokens_per_s"])
    p = s["vllm_plain"]
    row("vllm plain", "no" if p.get("error") else "yes", tps=p.get("tokens_per_s"))
    for name, r in s["runs"].items():
        if r["loaded"]:
            row(name, "yes", r["drafts"], r["accept_rate_per_position"], r["tau"], r["tokens_per_s"])
        else:
            row(name, "NO")
            print(f"    {r['error'][:300]}")
    if "control" in s:
        c = s["control"]
        verdict = "differ (the check discriminates)" if c["discriminates"] else "DO NOT differ"
        print(
            f"control {c['name']}: drafts {c.get('drafts')}, accepted {c.get('accepted_per_pos')}: {verdict}"
        )
    print("\ngreedy token ids:")
    for g in s["greedy"]:
        firsts = [
            (m["prompt"], m["first_mismatch_pos"], m.get("plain_top2_at_pos", {}).get("logprob_margin"))
            for m in g["mismatches"]
        ]
        tail = f"  (prompt, first pos, plain top1-top2 logprob margin): {firsts}" if firsts else ""
        print(f"  {g['pair']:<40} {g['mismatching_prompts']}/{g['prompts']} prompts differ{tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one vLLM engine over draftsmith's prompt ids (vLLM venv)")
    r.add_argument("--model", required=True, help="target folder, or a speculators head folder")
    r.add_argument("--draft", help="head folder for speculative_config (its --method: eagle3 or medusa)")
    r.add_argument(
        "--method",
        default="eagle3",
        choices=["eagle3", "medusa", "dflash", "dspark", "mtp"],
        help="with --draft: eagle3, medusa, dflash or dspark (the head's vLLM layout); "
        "mtp: --model's own MTP layers",
    )
    r.add_argument(
        "--k",
        type=int,
        default=0,
        help="num_speculative_tokens (with --draft: default 2; "
        "with a speculators --model: overrides its config, 0 keeps it)",
    )
    r.add_argument(
        "--parallel-drafting",
        action="store_true",
        help="with --draft: speculative_config parallel_drafting (P-EAGLE: K drafts in one forward)",
    )
    r.add_argument("--max-num-seqs", type=int, default=1, help="vLLM batch size (1 = like draftsmith's)")
    r.add_argument("--prompts", required=True, help="draftsmith generate --json output (prompt_token_ids)")
    r.add_argument("--max-tokens", type=int, default=48)
    r.add_argument("--max-model-len", type=int, default=1024)
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare", help="table + summary.json (stdlib only)")
    c.add_argument("--draftsmith", required=True)
    c.add_argument("--draftsmith-draft", default="", help="the --draft spec draftsmith ran with (recorded)")
    c.add_argument("--plain", required=True)
    c.add_argument("--spec", action="append", default=[], help="NAME=run.json, repeatable")
    c.add_argument("--control", help="NAME=run.json: the head with the other engine's aux ids (must differ)")
    c.add_argument("--k", type=int, default=2)
    c.add_argument("--max-tokens", type=int, default=48)
    c.add_argument("--timings", help="phase timings JSON from the shell script")
    c.add_argument("--out", required=True)
    args = ap.parse_args()
    return run(args) if args.cmd == "run" else compare(args)


if __name__ == "__main__":  # required: vLLM starts its engine core with spawn
    sys.exit(main())
