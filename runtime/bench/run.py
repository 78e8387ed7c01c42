"""One `draftsmith bench` run: build the methods, time them per temperature and batch size, write the report.

    from draftsmith.runtime.bench.run import BenchRequest, run_bench
    result = run_bench(BenchRequest(drafts=["ngram"], prompts="humaneval", batch_sizes=[1, 4]))
    result["rows"], result["meta"]

Methods: `plain` always (the reference), the `baselines`, and each draft combined with each tree (a draft
given as DRAFT@TREE keeps its own tree). Methods that cannot run at a batch size (transformers' assisted
generation at batch > 1) are listed in `skipped` with the reason. OUT gets results.json (the rows),
meta.json (versions, machine, seeds, command, roofline), report.md and PNG plots (bench_report.py).
"""

from __future__ import annotations

import logging
import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from draftsmith.runtime.bench.compare import check_request_inputs
from draftsmith.runtime.core.chat_template import chat_identity, thinking_arg, use_thinking
from draftsmith.runtime.core.quantize import parse_quantize
from draftsmith.runtime.core.row_linear import check_mode
from draftsmith.runtime.drafters.drafting import default_trees
from draftsmith.runtime.errors import BadInputError, check_output_dir
from draftsmith.runtime.heads.trained_for import check_drafts
from draftsmith.runtime.speculator import SpecConfig, prepare_target

log = logging.getLogger("draftsmith")
GPU_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64]
CPU_BATCH_SIZES = [1, 4, 16]


@dataclass
class BenchRequest:
    target: str = "smollm2-135m"
    drafts: list[str] = field(default_factory=list)  # --draft specs, optionally DRAFT@TREE
    trees: list[str] | None = None  # None: chain:2 and auto:2, shallower for a shallower drafter
    prompts: str = "sharegpt"
    num_prompts: int = 8
    categories: list[str] | None = None
    max_new_tokens: int = 64
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    batch_sizes: list[int] | None = None  # None: 1..64 in powers of 2 on a GPU, 1, 4, 16 on a CPU
    baselines: list[str] = field(default_factory=lambda: ["plain", "hf", "hf-prompt-lookup"])
    repeats: int = 1
    seed: int = 0
    chat: bool = True
    out: str = "runs/bench"
    plots: bool = True
    roofline: bool = True
    device: str = "auto"
    dtype: str = "auto"
    attention: str = (
        "sdpa"  # the target's masked attention: sdpa, triton or flex (runtime/core/kernel_attention.py)
    )
    command: str = ""
    cpu_linears: str = "auto"  # auto: W @ x^T where it measured faster (runtime/core/row_linear.py); torch
    # weight-only quantization (runtime/core/quantize.py) of the target (every method's) and of the drafts
    quantize: str = "none"
    group_size: int | None = None
    quantize_draft: str = "none"
    draft_group_size: int | None = None
    sync_timing: bool = False  # synchronize CUDA around each timed draft / verify phase (cycle_timing.py)
    vllm_tp_size: int = 1  # the vLLM rows' tensor parallelism (GPUs); CUDA graphs on a GPU
    thinking: str | None = None  # on | off: the chat template's thinking mode (None: its default)
    allow_template_mismatch: bool = False  # a head trained on another template / mode: warn, not exit 2

    def method_specs(self) -> list[str]:
        specs = ["plain", *[b for b in self.baselines if b != "plain"]]
        for draft in self.drafts:
            trees = self.trees or default_trees(draft)
            specs += [draft] if "@" in draft else [f"{draft}@{tree}" for tree in trees]
        if len(set(specs)) != len(specs):
            raise BadInputError("--draft/--baselines", specs, "each method once")
        return specs


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("draftsmith", "torch", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def machine_facts(target) -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": __import__("os").cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(target.device),
        "gpu": torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else None,
        "dtype": str(target.dtype).removeprefix("torch."),
    }


def run_bench(req: BenchRequest, target=None) -> dict:
    """Time every method at every temperature and batch size; results.json and meta.json are rewritten
    after each block (an interrupted run keeps what it measured), report.md and plots at the end."""
    from draftsmith.runtime.bench.prompt_sets import load_bench_prompts
    from draftsmith.runtime.bench.report import write_report
    from draftsmith.runtime.core.target import Target

    check_output_dir("--out", req.out)  # before the work: a run that cannot write its rows loses them all
    if target is not None and target.tp_size > 1:
        check_split_methods(req)
    check_request_inputs(req.temperatures, req.batch_sizes or [1], req.max_new_tokens, req.repeats)
    check_mode("--cpu-linears", req.cpu_linears)
    convs = load_bench_prompts(req.prompts, req.num_prompts, req.categories)
    specs = req.method_specs()
    quant, draft_quant = check_quantize(req, specs)
    target = target or Target.load(req.target, device=req.device, dtype=req.dtype)
    use_thinking(target, thinking_arg(req.thinking, "--thinking"))  # runtime/core/chat_template.py
    check_drafts(req.drafts, target, req.allow_template_mismatch, req.chat)  # runtime/heads/trained_for.py
    # before the methods: their verify costs and drafters see the quantized target and its linears
    rows_plan = prepare_target(target, quant, req.attention, req.cpu_linears)
    if req.batch_sizes is None:
        req.batch_sizes = GPU_BATCH_SIZES if target.device.type == "cuda" else CPU_BATCH_SIZES
    check_request_inputs(req.temperatures, req.batch_sizes, req.max_new_tokens, req.repeats)
    log.info("bench: %d prompts from %s; methods: %s", len(convs), req.prompts, ", ".join(specs))
    methods, drafts = build_methods(req, specs, target, rows_plan)
    if draft_quant is not None and not drafts:
        raise BadInputError(
            "--quantize-draft", req.quantize_draft, "a --draft with weights (a head, model:TARGET)"
        )
    meta = run_meta(req, target, convs)
    meta["quantization"] = {"target": target.quantization, "drafts": drafts}
    meta["cpu_linears"] = {"mode": req.cpu_linears, "w_xt_rows": sorted(rows_plan)}
    rows: list[dict] = []
    try:
        for temperature in req.temperatures:
            for batch in req.batch_sizes:
                rows += run_block(req, target, methods, convs, temperature, batch, meta)
                write_report(Path(req.out), rows, meta, plots=False, final=False)
    finally:
        for method in methods.values():
            method.close()
    if req.roofline:  # after the timed runs: the measurement loads the machine
        meta["roofline"] = roofline_lines(target, req, meta["prompt_tokens_mean"])
    return write_report(Path(req.out), rows, meta, plots=req.plots)


def check_split_methods(req: BenchRequest) -> None:
    """A split target runs draftsmith's rows only: the baselines hold a copy of the target of their own."""
    others = [b for b in req.baselines if b != "plain"]
    if others:
        raise BadInputError(
            "--baselines",
            ",".join(others),
            "plain only with --target-placement tp|ep",
            "transformers, vLLM and llama.cpp rows load their own copy of the target; bench them apart "
            "(vllm rows take --tensor-parallel-size)",
        )
    if req.quantize not in (None, "none"):
        raise BadInputError("--quantize", req.quantize, "none with --target-placement tp|ep")


def build_methods(req: BenchRequest, specs: list[str], target, rows_plan: frozenset[int]):
    """-> (method spec -> method, method spec -> its draft's quantization). Drafters without weights of their
    own (ngram, self:) run as they are under --quantize-draft; heads and draft models take the target's
    CPU-linears plan."""
    from draftsmith.runtime.bench.methods import build_method

    base = SpecConfig(
        quantize_draft=req.quantize_draft,
        draft_group_size=req.draft_group_size,
        weightless_ok=True,
        rows_plan=rows_plan,
    )
    methods = {
        spec: build_method(spec, target, req.batch_sizes, base=base, vllm_tp=req.vllm_tp_size)
        for spec in specs
    }
    drafts = {}
    for spec, method in methods.items():
        method.sync_timing = req.sync_timing
        label = getattr(getattr(method, "speculator", None), "draft_quantization", None)
        if label is not None:
            drafts[spec] = label
    return methods, drafts


def check_quantize(req: BenchRequest, specs: list[str]):
    """(target spec, draft spec) of --quantize / --quantize-draft (None: off); vLLM's rows would load the
    checkpoint unquantized, so they are refused with a quantized target."""
    quant = parse_quantize(req.quantize, req.group_size)
    draft_quant = parse_quantize(req.quantize_draft, req.draft_group_size, "--quantize-draft")
    engines = [s for s in specs if s.startswith("vllm")]
    if quant is not None and engines:
        raise BadInputError(
            "--baselines",
            engines,
            f"no vLLM rows with --quantize {req.quantize}",
            "vLLM loads the unquantized checkpoint",
        )
    if draft_quant is not None and not req.drafts:
        raise BadInputError("--quantize-draft", req.quantize_draft, "a --draft with a model to quantize")
    return quant, draft_quant


def run_meta(req: BenchRequest, target, convs) -> dict:
    """What makes the run reproducible; `skipped` and `categories` fill in as blocks run."""
    return {
        "request": asdict(req),
        "command": req.command,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "machine": machine_facts(target),
        "target": target.name,
        "chat_template": chat_identity(target) if req.chat else None,  # template hash, thinking mode
        "prompt_tokens_mean": sum(len(target.encode(c.turns[0], chat=req.chat)) for c in convs) / len(convs),
        "skipped": [],
        "categories": [],
    }


def run_block(req: BenchRequest, target, methods: dict, convs, temperature: float, batch: int, meta: dict):
    """One temperature and batch size: the methods that can run, side by side -> rows (printed)."""
    from draftsmith.runtime.bench.compare import category_rows, compare_at, summarize
    from draftsmith.runtime.bench.report import format_table
    from draftsmith.runtime.verify.sampling import SamplingParams

    params = SamplingParams(temperature=temperature).validate()
    runnable = {}
    for name, method in methods.items():
        method.reset()
        why = method.unsupported(batch, params)
        if why:
            meta["skipped"].append(
                {"method": name, "temperature": temperature, "batch_size": batch, "why": why}
            )
        else:
            runnable[name] = method
    max_new, repeats, seed, chat = req.max_new_tokens, req.repeats, req.seed, req.chat
    per = compare_at(runnable, target, convs, params, max_new, batch, repeats, seed, chat)
    block = [summarize(name, runs, per["plain"], params, batch, convs, target) for name, runs in per.items()]
    add_depth_shares(block, methods, batch)
    add_collectives(block, methods, target, convs, params, chat)
    for row in block:
        row.update(methods[row["method"]].facts)
    if batch == 1:
        meta["categories"] += category_rows(per, convs, params)
    print(f"\n{req.prompts}: {len(convs)} prompts, {max_new} new tokens, T={temperature:g}, batch {batch}")
    print(format_table(block), flush=True)
    return block


def add_depth_shares(block: list[dict], methods: dict, batch: int) -> None:
    """Load-aware rows: how often each chain depth was chosen at this batch size (warm-up included)."""
    for row in block:
        policies = getattr(methods[row["method"]], "policies", {})
        if batch in policies:
            counts = policies[batch].depth_counts
            row["depth_share"] = [round(c / max(sum(counts), 1), 4) for c in counts]


def add_collectives(block: list[dict], methods: dict, target, convs, params, chat: bool) -> None:
    """A split target's rows: the collectives per cycle (runtime/core/collectives.py) of one more run of
    the row's first batch, counted apart from the timed runs (counting costs a Python call per op)."""
    if target.tp_size == 1:
        return
    from draftsmith.runtime.bench.compare import WARMUP_TOKENS
    from draftsmith.runtime.core.collectives import CollectiveCounter, per_cycle

    for row in block:
        speculator = methods[row["method"]].speculator
        prompts = [target.encode(c.turns[0], chat=chat) for c in convs[: row["batch_size"]]]
        counter = CollectiveCounter()
        with counter:
            run = dict(max_new_tokens=4 * WARMUP_TOKENS, batch_size=len(prompts), collectives=counter)
            speculator.generate(prompts, params, **run)
        row["collectives"] = per_cycle(counter.report())


def roofline_lines(target, req: BenchRequest, prompt_tokens: float) -> dict:
    from draftsmith.runtime.bench.roofline import machine_rates, roofline

    machine = machine_rates(target.device)
    context = int(prompt_tokens + req.max_new_tokens / 2)
    return {
        "machine": machine,
        "context": context,
        "lines": [roofline(target, machine, b, context) for b in req.batch_sizes],
    }
