"""One `draftsmith eval` run: the acceptance of drafts on the target's own continuation, without timing.

    from draftsmith.runtime.bench.eval_run import EvalRequest, run_eval
    result = run_eval(EvalRequest(drafts=["eagle3:heads/eagle3-smollm2-135m", "ngram"], sets=["humaneval"]))
    result["leaderboard"], result["entries"], result["harness"]

Each draft (DRAFT@TREE, or combined with each --tree) decodes every set's prompts at each temperature, in
large batches, once: no warm-up, no repeats, no plain-decoding reference, no clock in any number. At T = 0
the target's greedy continuation of each set is decoded once and every draft replays the drafter protocol
against it, with no target forward per cycle (runtime/bench/eval_replay.py: the runtime's acceptance but
for floating-point near-ties); at T > 0, for `auto:K` / `adaptive:K` and with `--engine-at-t0`, each draft
decodes through the runtime's own engine (runtime/speculator.py Speculator.generate), which verifies
losslessly, so what it decodes is the target's own sampled continuation and the per-cycle accepted lengths
it reports are the acceptance; at T = 0 both equal `generate`'s on the same prompts. Records
(runtime/bench/eval_record.py) per prompt, per category and per set; the leaderboard ranks the drafts per
temperature by mean acceptance length pooled over the sets. OUT gets eval.json, report.md and plots
(runtime/bench/eval_report.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.runtime.errors import BadInputError, check_output_dir

log = logging.getLogger("draftsmith")


@dataclass
class EvalRequest:
    target: str = "smollm2-135m"
    drafts: list[str] = field(default_factory=list)  # --draft specs, optionally DRAFT@TREE
    trees: list[str] | None = None  # None: each draft's default chain (generate's)
    sets: list[str] = field(default_factory=lambda: ["humaneval"])  # eval sets or bench prompt sources
    num_prompts: int = 20  # per set
    categories: list[str] | None = None
    max_new_tokens: int = 128
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0  # row i of a batch samples with a generator seeded by (seed, i)
    batch_size: int = 16  # prompts decoded together: throughput only, not a pinned setting at T = 0
    engine_at_t0: bool = False  # T = 0 through the engine, not replayed (runtime/bench/eval_replay.py)
    chat: bool = True
    out: str = "runs/eval"
    plots: bool = True
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "sdpa"
    cpu_linears: str = "auto"
    quantize: str = "none"
    group_size: int | None = None
    quantize_draft: str = "none"  # the drafts' own linears (a drafter without weights runs as it is)
    draft_group_size: int | None = None
    thinking: str | None = None  # on | off: the chat template's thinking mode (None: its default)
    allow_template_mismatch: bool = False  # a head trained on another template / mode: warn, not exit 2
    context_lengths: list[int] | None = None  # acceptance against context length (eval_context.py)
    context_docs: str = "sharegpt"  # the long documents cut to each length
    command: str = ""

    def methods(self) -> list[tuple[str, str | None]]:
        """(draft, tree) pairs: DRAFT@TREE keeps its tree; else each --tree, else the draft's default."""
        if not self.drafts:
            raise BadInputError("--draft", None, "at least one draft spec (repeatable)")
        pairs = []
        for spec in self.drafts:
            draft, at, tree = spec.partition("@")
            pairs += [(draft, tree)] if at else [(draft, t) for t in (self.trees or [None])]
        if len(set(pairs)) != len(pairs):
            raise BadInputError("--draft/--tree", self.drafts, "each draft and tree once")
        if any(d == "none" for d, _ in pairs):
            raise BadInputError("--draft", "none", "a drafter: eval measures a draft's acceptance")
        return pairs


def load_sets(req: EvalRequest) -> list[tuple[list, dict]]:
    """Each --set -> (its prompts, its pin); bench's prompt sources (sharegpt, jsonl:FILE, ...) too."""
    from draftsmith.runtime.bench.eval_sets import is_eval_set, load_eval_set, text_hash
    from draftsmith.runtime.bench.prompt_sets import load_bench_prompts

    out = []
    several = len(req.sets) > 1  # --categories may name a category of one set only
    for spec in req.sets:
        if is_eval_set(spec):
            prompts, pin = load_eval_set(spec, req.num_prompts, req.categories, strict=not several)
            out.append((prompts, pin))
            continue
        prompts = load_bench_prompts(spec, req.num_prompts, req.categories)
        pin = {"set": spec, "name": spec, "source": "draftsmith prompt source", "prompts": len(prompts)}
        pin["prompts_hash"] = text_hash(repr([p.turns for p in prompts]))
        out.append((prompts, pin))
    found = {c for prompts, _ in out for c in (p.category for p in prompts)}
    missing = sorted(set(req.categories or ()) - found)
    if missing:
        raise BadInputError("--categories", ",".join(missing), f"categories of the sets: {sorted(found)}")
    return [(prompts, pin) for prompts, pin in out if prompts]  # a set none of whose categories is asked


def check_request(req: EvalRequest):
    """Everything that needs no target -> the sampling parameters per temperature (bad input exits 2)."""
    from draftsmith.runtime.verify.sampling import SamplingParams

    check_output_dir("--out", req.out)
    for name in ("num_prompts", "max_new_tokens", "batch_size"):
        value = getattr(req, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadInputError(f"--{name.replace('_', '-')}", value, "an integer >= 1")
    if not req.temperatures:
        raise BadInputError("--temperatures", req.temperatures, "at least one temperature")
    return [SamplingParams(t, req.top_p, req.top_k).validate() for t in req.temperatures]


def run_eval(req: EvalRequest, target=None) -> dict:
    """Every draft x tree x temperature over every set -> the result (also written to OUT)."""
    from draftsmith.runtime.bench.eval_context import context_result, context_sets, read_documents
    from draftsmith.runtime.bench.eval_record import harness_pins
    from draftsmith.runtime.bench.eval_report import leaderboard, write_eval_report
    from draftsmith.runtime.core.chat_template import thinking_arg, use_thinking
    from draftsmith.runtime.core.quantize import parse_quantize
    from draftsmith.runtime.core.target import Target
    from draftsmith.runtime.heads.trained_for import check_drafts
    from draftsmith.runtime.speculator import SpecConfig, prepare_target

    all_params = check_request(req)
    draft_quant = dict(
        quantize_draft=req.quantize_draft, draft_group_size=req.draft_group_size, weightless_ok=True
    )
    configs = {
        m: SpecConfig(m[0], m[1], batch_sizes=[1, req.batch_size], **draft_quant).validate()
        for m in req.methods()
    }
    quant = parse_quantize(req.quantize, req.group_size)
    docs = read_documents(req.context_docs) if req.context_lengths else None  # runtime/bench/eval_context.py
    sets = load_sets(req) if docs is None else []  # before the target loads: a missing file costs nothing
    target = target or Target.load(req.target, device=req.device, dtype=req.dtype)
    use_thinking(target, thinking_arg(req.thinking, "--thinking"))  # runtime/core/chat_template.py
    check_drafts(req.drafts, target, req.allow_template_mismatch, req.chat)  # runtime/heads/trained_for.py
    rows_plan = prepare_target(target, quant, req.attention, req.cpu_linears)
    if docs is None:
        prompt_ids = [[target.encode(p.turns[0], chat=req.chat) for p in prompts] for prompts, _ in sets]
    else:  # one set per context length, the same documents cut to each
        sets, prompt_ids, context = context_sets(req, target, docs)
    sampling = {"top_p": req.top_p, "top_k": req.top_k, "seed": req.seed, "batch_size": req.batch_size}
    harness = harness_pins(target, sampling, req.max_new_tokens, req.chat, [pin for _, pin in sets])
    harness["temperatures"] = req.temperatures  # beside the id: each entry names its own temperature
    harness["t0"] = "engine" if req.engine_at_t0 else "teacher-forced replay"
    start = time.perf_counter()
    entries, forced = (
        [],
        Continuations(req, target, prompt_ids, max(default_depth(c) for c in configs.values())),
    )
    for cfg in configs.values():
        cfg.rows_plan = rows_plan
        entries += eval_method(req, target, cfg, sets, prompt_ids, all_params, forced)
    result = {
        "harness": harness,
        "request": asdict(req),
        "command": req.command,
        "entries": entries,
        "leaderboard": leaderboard(entries),
        "wall_s": round(time.perf_counter() - start, 3),  # the run's cost, never a measured number
    }
    if docs is not None:
        result["context"] = context_result(context, entries, sets)
    return write_eval_report(Path(req.out), result, plots=req.plots)


def eval_method(req: EvalRequest, target, cfg, sets, prompt_ids, all_params, forced) -> list[dict]:
    """One draft and tree: build it once, decode every set at every temperature -> one entry per pair."""
    from draftsmith.runtime.bench.eval_record import records
    from draftsmith.runtime.speculator import build_speculator

    speculator = build_speculator(target, cfg)
    depth = default_depth(cfg)
    method = cfg.draft + (f"@{cfg.tree}" if cfg.tree else f"@chain:{depth}")
    entries = []
    try:
        for params in all_params:
            for s, ((prompts, pin), ids) in enumerate(zip(sets, prompt_ids, strict=True)):
                speculator.reset()  # a load-aware policy learns per (method, T, set), as a new server
                if params.greedy and forced.replays(speculator):
                    results = forced.replay(s, speculator.drafter)
                else:
                    run = dict(max_new_tokens=req.max_new_tokens, seed=req.seed, batch_size=req.batch_size)
                    results = speculator.generate(ids, params, **run, progress=False)
                entries.append(
                    {
                        "method": method,
                        "draft": draft_pins(cfg.draft),
                        "tree": cfg.tree or f"chain:{depth}",
                        "K": depth,
                        "draft_quantization": speculator.draft_quantization,  # None: unquantized
                        "temperature": params.temperature,
                        "set": pin["set"],
                        **records(prompts, results),
                    }
                )
                log.info(
                    "eval %s T=%g %s: mean acceptance length %s",
                    method, params.temperature, pin["set"], entries[-1]["overall"]["mean_acceptance_length"],
                )  # fmt: skip
    finally:
        speculator.finish()
    return entries


def default_depth(cfg) -> int:
    """The deepest draft of a method: its tree's, else the draft's default chain (generate's)."""
    from draftsmith.runtime.drafters.drafting import default_depth as chain_depth

    tree = cfg.tree_spec()
    return tree.max_depth if tree is not None else chain_depth(cfg.draft)


class Continuations:
    """The target's greedy continuation of each set, decoded on first use and shared by every draft (and
    its features per capture-layer tuple), `lookahead` tokens past the budget for the last cycles' paths."""

    def __init__(self, req: EvalRequest, target, prompt_ids: list[list[list[int]]], lookahead: int):
        self.req, self.target, self.prompt_ids, self.lookahead = req, target, prompt_ids, lookahead
        self.forced: dict[tuple[int, tuple[int, ...]], object] = {}

    def replays(self, speculator) -> bool:
        """Whether this method's T = 0 run is replayed: not asked otherwise, no depth policy (auto:K /
        adaptive:K read measured times), not the static path."""
        return not self.req.engine_at_t0 and speculator.max_depth is None and not speculator.static

    def replay(self, s: int, drafter) -> list:
        from draftsmith.runtime.bench.eval_replay import TeacherForced, replay

        layers, size = tuple(drafter.capture_layers), self.req.batch_size
        if (s, layers) not in self.forced:  # the first draft's layers are captured while decoding
            decoded = next((tf for (k, _), tf in self.forced.items() if k == s), None)
            if decoded is None:
                ids, budget = self.prompt_ids[s], self.req.max_new_tokens
                tf = TeacherForced.decode(self.target, ids, budget, self.lookahead, size, layers)
            else:  # another draft's layers: one prefill over prompt + continuation
                tf = decoded.with_features(self.target, layers, size)
            self.forced[s, layers] = tf
        return replay(drafter, drafter.tree, self.forced[s, layers], size)


def draft_pins(spec: str) -> dict:
    """The draft spec and, for a folder, a hash of its files' names, sizes and JSON contents (a retrained
    head in the same folder gets a new hash)."""
    from draftsmith.runtime.core.artifacts import content_hash

    kind, _, arg = spec.partition(":")
    folder = Path(arg.split(",")[0]).expanduser() if arg else None
    if folder is None or not folder.is_dir():
        return {"spec": spec}
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    listing = [
        [str(p.relative_to(folder)), p.stat().st_size, p.read_text() if p.suffix == ".json" else None]
        for p in files
    ]
    return {"spec": spec, "kind": kind, "folder_hash": content_hash(listing)}
