"""Model cards for exported heads: README.md with Hub metadata, what the head was trained on, what was
measured (with the command that measured it) and how to serve it.

    card = model_card(CardFacts(format="eagle3", head_type="eagle3", target="HuggingFaceTB/...", ...))

A kind's words (its title) and each layout's serve text come from the registry (runtime/heads/head_kinds.py).

Every number in a card comes from a file the run or a benchmark wrote (`run_facts`, `bench_rows`,
`vllm_check`); a card never states a figure nobody measured, it says "not measured" instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from draftsmith.runtime.errors import BadInputError, read_json
from draftsmith.runtime.heads import head_kinds
from draftsmith.runtime.heads.head_kind import ServeArgs

BENCH_META = ("date", "machine", "threads", "prompt_set", "command", "versions")
DATASETS = {"sharegpt": "anon8231489123/ShareGPT_Vicuna_unfiltered"}


@dataclass
class CardFacts:
    format: str  # an export layout of the head's kind (draftsmith, eagle3, speculators, mtp, ...)
    head_type: str  # the head kind (runtime/heads/head_kinds.py)
    target: str
    repo_id: str | None = None  # where it is (or will be) published; the serve commands use it
    license: str = "other"
    engine: str | None = None  # whose aux-id convention an eagle3 export wrote
    speculative_tokens: int = 3  # in the serve commands
    size: str = ""  # "12.6M parameters, float32"
    run: dict = field(default_factory=dict)  # run_facts()
    bench: list[dict] = field(default_factory=list)  # bench_rows()
    bench_meta: dict = field(default_factory=dict)  # date, machine, threads, prompt set, command
    vllm: dict | None = None  # scripts/check_vllm.sh summary
    details: list[str] = field(default_factory=list)  # format-specific lines (aux ids, modules, ...)
    precision: str = ""  # a quantized export's weights (fp8 / int8); "" = as trained, the size's dtypes
    trained_for: dict | None = None  # the head's record: template hash, thinking mode (heads/trained_for.py)


def run_facts(run_dir: Path | None) -> dict:
    """The training run's config and its last evaluation, when the head sits in a run folder."""
    if run_dir is None or not (run_dir / "config.yaml").is_file():
        return {}
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    last_eval = {}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == "eval":
                last_eval = row
    return {"config": config, "eval": last_eval, "dir": str(run_dir)}


def bench_rows(path: Path | None, head_dir: Path) -> tuple[list[dict], dict]:
    """Rows of a bench JSON (scripts/bench_runtime.py compare, or `draftsmith bench` results.json) that
    measured this head, plus the plain rows they are relative to; and where and how it was measured."""
    if path is None:
        return [], {}
    if not path.is_file():
        raise BadInputError("--bench", str(path), "a bench JSON file (compare-*.json or results.json)")
    data = read_json(path, "--bench", (dict, list))
    rows = data.get("rows", []) if isinstance(data, dict) else data
    ours = [r for r in rows if _measures(r.get("method", ""), head_dir) or r.get("method") == "plain"]
    if not any(r.get("method") != "plain" for r in ours):
        raise BadInputError("--bench", str(path), f"rows that measured {head_dir}", "no method names it")
    meta = {k: data[k] for k in BENCH_META if isinstance(data, dict) and k in data}
    side = path.with_name("meta.json")  # `draftsmith bench` keeps the run's facts next to results.json
    if isinstance(data, list) and side.is_file():
        facts = read_json(side, "--bench")
        machine = facts.get("machine", {})
        meta = {
            "prompt_set": facts.get("request", {}).get("prompts"),
            "date": facts.get("date"),
            "machine": f"{machine.get('processor')} ({machine.get('device')}, {machine.get('dtype')})",
            "threads": machine.get("torch_threads"),
            "command": facts.get("command"),
        }
    return ours, {**meta, "file": str(path)}


def _measures(method: str, head_dir: Path) -> bool:
    found = head_kinds.draft_kind(method.split("@")[0])
    folder = found[1].split("#")[0] if found else ""
    return bool(folder) and Path(folder).resolve() == head_dir.resolve()


def model_card(facts: CardFacts) -> str:
    meta = {
        "base_model": facts.target,
        "library_name": "draftsmith",
        "license": facts.license,
        "pipeline_tag": "text-generation",
        "tags": ["speculative-decoding", facts.head_type, "draftsmith", f"{facts.format}-layout"],
    }
    if facts.precision:  # fp8 / int8: a quantized export says so in its Hub tags too
        meta["tags"].append(facts.precision.split()[0])
    source = facts.run.get("config", {}).get("data", {}).get("source")
    if source in DATASETS:
        meta["datasets"] = [DATASETS[source]]
    parts = [
        "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n",
        f"# {_title(facts)}\n",
        _summary(facts),
        _training(facts.run),
        _measured(facts),
        _serving(facts),
    ]
    return "\n".join(p for p in parts if p)


def _title(facts: CardFacts) -> str:
    kind = head_kinds.get(facts.head_type, "head_type").title
    return f"{kind} for {facts.target} ({facts.format} layout)"


def _summary(facts: CardFacts) -> str:
    lines = [
        f"A speculative-decoding {facts.head_type} head trained with draftsmith for `{facts.target}`.",
        "Speculative decoding with it is lossless: the output distribution is the target's.",
        "",
        f"- layout: `{facts.format}`"
        + (f" (aux-layer ids written in {facts.engine}'s convention)" if facts.engine else ""),
    ]
    if facts.size:
        lines.append(f"- size: {facts.size}")
    lines.append(f"- precision: {_precision(facts)}")
    lines += [f"- {d}" for d in facts.details]
    if facts.trained_for:
        lines.append(_template_line(facts.trained_for))
    return "\n".join(lines) + "\n"


def _template_line(record: dict) -> str:
    """What prompts looked like in training: serve it with the same template and thinking mode."""
    mode = record.get("thinking")
    thinking = f", thinking {mode} (`--thinking {mode}`)" if mode else ""
    return (
        f"- trained on prompts rendered with the chat template `{record.get('template_hash')}` of "
        f"`{record.get('target')}`{thinking}: draftsmith refuses to serve it with another template or "
        "thinking mode (exit 2) unless `--allow-template-mismatch`; engines render prompts their own way, so "
        "keep the target's chat template and mode there too"
    )


def _precision(facts: CardFacts) -> str:
    """A quantized export's precision, else the dtypes it was trained and written in."""
    if facts.precision:
        return facts.precision
    dtypes = facts.size.rpartition(", ")[2] if facts.size else "the trained dtype"
    return f"{dtypes} as trained (not quantized)"


def _training(run: dict) -> str:
    if not run:
        return "## Training\n\nNot recorded (the head was exported from a folder outside a draftsmith run).\n"
    cfg = run["config"]
    data, train = cfg.get("data", {}), cfg.get("train", {})
    lines = [
        "## Training\n",
        f"- data: `{data.get('source')}`, up to {data.get('max_samples')} conversations of at most "
        f"{data.get('max_length')} tokens ({data.get('mode')} mode)",
        f"- steps: {train.get('max_steps')} x batch {train.get('batch_size')} "
        f"(grad accum {train.get('grad_accum')}), lr {train.get('lr')}",
        f"- config: `draftsmith train --config {run.get('config_file', run['dir'] + '/config.yaml')}`",
    ]
    ev = run.get("eval") or {}
    if ev:
        acc = ev.get("accuracy_per_step") or ev.get("accuracy_per_module")
        lines.append(
            f"- validation at step {ev.get('step')}: accuracy per draft position {acc}, "
            f"simulated tau {ev.get('simulated_tau')}"
        )
    return "\n".join(lines) + "\n"


def _measured(facts: CardFacts) -> str:
    lines = ["## Measured\n"]
    if facts.bench:
        lines += [
            "| method | temperature | batch | tokens/s | speedup vs plain | tau | acceptance per position "
            "| draft ms/cycle |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in facts.bench:
            lines.append(
                f"| {r.get('method')} | {r.get('temperature')} | {r.get('batch_size', 1)} "
                f"| {r.get('tokens_per_s')} | "
                f"{r.get('speedup_vs_plain')} | {r.get('mean_accepted', 1.0)} | "
                f"{r.get('accept_rate_per_position', [])} | {r.get('draft_ms_per_cycle', '-')} |"
            )
        lines.append("")
        meta = facts.bench_meta
        where = ", ".join(f"{k} {meta[k]}" for k in ("prompt_set", "date", "machine", "threads") if k in meta)
        lines.append(f"Measured side by side in one run ({where}); results: `{meta.get('file')}`.")
        if meta.get("command"):
            lines.append(f"Command: `{meta['command']}`")
        lines.append("")
    else:
        lines.append("Speedup and tau: not measured for this export (pass `--bench FILE` to include them).\n")
    if facts.vllm:
        lines.append(_vllm_lines(facts.vllm))
    return "\n".join(lines)


def _vllm_lines(summary: dict) -> str:
    """scripts/check_vllm.sh's summary: did vLLM load the export, and does it agree with draftsmith."""
    ours = summary.get("draftsmith", {})
    lines = [
        f"### Served by vLLM {summary.get('vllm_version')} (scripts/check_vllm.sh)\n",
        f"{summary.get('prompts')} prompts x {summary.get('max_tokens')} tokens, greedy, fp32, "
        f"chain of {summary.get('k')}; acceptance counts side by side with draftsmith's:\n",
        "| run | loaded | drafts | accepted per position | tau |",
        "|---|---|---|---|---|",
        f"| draftsmith | yes | {ours.get('drafts')} | {ours.get('accepted_per_pos')} | {ours.get('tau')} |",
    ]
    for name, run in summary.get("runs", {}).items():
        loaded = "yes" if run.get("loaded") else "no"
        counts = f"{run.get('drafts')} | {run.get('accepted_per_pos')} | {run.get('tau')}"
        lines.append(f"| vLLM {name} | {loaded} | {counts} |")
    worst = max((g.get("mismatching_prompts", 0) for g in summary.get("greedy", [])), default=None)
    lines.append(f"\nGreedy outputs differing between any two of them: {worst} prompts.")
    control = summary.get("control")
    if control and "drafts" in control:
        verdict = "different counts, as it must" if control.get("discriminates") else "the same counts"
        lines.append(
            f"Control: this head exported with SGLang's aux-layer ids, which vLLM reads one layer off: "
            f"{control['drafts']} drafts, {control['accepted_per_pos']} accepted ({verdict})."
        )
    lines.append("")
    return "\n".join(lines)


def _serving(facts: CardFacts) -> str:
    """The serve section of the export's layout (each layout writes its own: runtime/*_kind.py)."""
    kind = head_kinds.get(facts.head_type, "head_type")
    layouts = kind.all_layouts()
    args = ServeArgs(
        repo=facts.repo_id or "PATH_TO_THIS_FOLDER",
        target=facts.target,
        kind=kind.name,
        engine=facts.engine,
        speculative_tokens=facts.speculative_tokens,
        formats=tuple(name for name in layouts if name != facts.format),
    )
    return layouts[facts.format].serve(args)
