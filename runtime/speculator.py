"""One speculation builder: a `SpecConfig` (what to draft, how deep, on which engine path) -> a `Speculator`
that decodes prompts. `generate`, `bench` (and the demo through it) and SSD all build their speculation here.

    cfg = SpecConfig(draft="eagle3:runs/head/final", tree="auto:3", batch_sizes=[1, 4]).validate()
    cfg.rows_plan = prepare_target(target, quant=None, attention="sdpa", cpu_linears="auto")
    speculator = build_speculator(target, cfg)
    results = speculator.generate(prompt_ids, SamplingParams(), max_new_tokens=64, batch_size=4)
    speculator.finish()  # a drafter process stops; -> SSD's per-batch metrics

Layering: above the serving core (`core`, `verify`, `heads`, `drafters`; none of them imports this module),
below the CLI and bench. Its heavy imports are function-local, so the CLI reads SpecConfig without torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from draftsmith.runtime.errors import BadInputError

if TYPE_CHECKING:
    from draftsmith.runtime.core.engine import GenerationResult
    from draftsmith.runtime.core.quantize import QuantSpec
    from draftsmith.runtime.core.target import Target
    from draftsmith.runtime.drafters.drafter import Drafter
    from draftsmith.runtime.verify.adaptive import AdaptiveVerify
    from draftsmith.runtime.verify.load_aware import LoadAwareDepth, VerifyCosts
    from draftsmith.runtime.verify.sampling import SamplingParams
    from draftsmith.runtime.verify.tree import TreeSpec

log = logging.getLogger("draftsmith")
CHAINED = "SSD or a drafter process (--ssd, +ssd, --draft-process)"  # what errors say needs a chain


@dataclass(frozen=True)
class DraftProcess:
    """The drafter in its own process (runtime/drafters/draft_process.py); it loads the target again."""

    target: str  # the target's spec (alias, folder, Hub id), as this process loaded it
    dtype: str = "auto"  # the dtype it loads the target in (generate --dtype)
    device: str = "cpu"  # its device: cpu or cuda[:INDEX] (generate --draft-device)
    fallback: bool = False  # if it dies, go on with the drafter in this process (else: an error)


@dataclass
class SpecConfig:
    """What to speculate with. Every default is what `generate` does without the flag."""

    draft: str = "none"  # --draft spec (runtime/drafters/drafting.py); none: plain decoding
    # --tree spec: chain:K, static:..., dynamic:..., or auto:K (load-aware: a chain of depth 0..K chosen per
    # cycle from the verify-cost curve and the observed acceptance); None: the drafter's default chain
    tree: str | None = None
    static: bool = False  # the static engine path: preallocated caches, CUDA graphs on a GPU (--cuda-graphs)
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # auto:K measures its verify costs at these
    # speculative speculative decoding (runtime/drafters/ssd.py): pre-draft the next cycle's likely outcomes
    ssd: bool = False
    ssd_fanout: int = 8  # outcomes pre-drafted per cycle (>= K+1)
    ssd_saguaro: float = 1.0  # draft-law adjustment in (0, 1]; 1 = off
    draft_process: DraftProcess | None = None  # None: the drafter runs in this process
    draft_device: str = "auto"  # where a head or draft LM loads in this process (auto: the target's device)
    draft_dtype: str = "auto"  # its dtype (auto: the target's)
    quantize_draft: str = "none"  # weight-only quantization of the drafter's own linears: int8, int4, fp8
    draft_group_size: int | None = None  # int4 inputs per scale (None: picked per model)
    weightless_ok: bool = False  # bench: a drafter without weights of its own runs unquantized, not refused
    rows_plan: frozenset[int] = frozenset()  # the target's CPU-linears plan (prepare_target), for the drafter

    @property
    def auto_depth(self) -> int | None:
        """auto:K's K; None for any other tree."""
        from draftsmith.runtime.verify.load_aware import parse_auto

        return parse_auto(self.tree or "")

    @property
    def chained(self) -> bool:
        """SSD and a drafter process draft a fixed chain."""
        return self.ssd or self.draft_process is not None

    def tree_spec(self) -> TreeSpec | None:
        """The tree the drafter is built with: a chain of K for auto:K (the policy drafts shorter ones) and
        for SSD or a drafter process; None leaves the default to the drafter (a kind may read its own)."""
        from draftsmith.runtime.heads.head_kinds import parse_tree
        from draftsmith.runtime.verify.tree import chain

        depth = self.chain_depth() if self.chained else self.auto_depth
        if depth:
            return chain(depth)
        return parse_tree(self.draft, self.tree) if self.tree else None

    def chain_depth(self) -> int:
        """SSD's and a drafter process's chain depth K: a chain:K tree (or the draft's default chain) on the
        dynamic engine path."""
        from draftsmith.runtime.drafters.drafting import default_depth
        from draftsmith.runtime.heads.head_kinds import parse_tree
        from draftsmith.runtime.verify.tree import chain

        if self.draft == "none":
            raise BadInputError("--draft", "none", f"a drafter with {CHAINED}")
        if self.auto_depth or self.static:
            flag, got = ("--tree", self.tree) if self.auto_depth else ("--cuda-graphs", True)
            raise BadInputError(flag, got, f"a chain:K tree on the dynamic engine path with {CHAINED}")
        tree = parse_tree(self.draft, self.tree) if self.tree else None
        depth = tree.max_depth if tree is not None else default_depth(self.draft)
        if tree is not None and tree != chain(depth):
            raise BadInputError("--tree", self.tree, f"a chain:K tree with {CHAINED}")
        return depth

    def validate(self) -> SpecConfig:
        """Check everything that needs no target (bad input exits 2 before anything loads); -> self."""
        from draftsmith.runtime.core.quantize import parse_quantize
        from draftsmith.runtime.drafters.draft_process import check_draft_device, check_process_spec
        from draftsmith.runtime.verify.ssd_fanout import check_budget

        tree = self.tree_spec()
        if self.ssd:  # a chain
            check_budget(self.ssd_fanout, tree.max_depth)
            if not 0.0 < self.ssd_saguaro <= 1.0:  # NaN fails too
                raise BadInputError("--ssd-saguaro", self.ssd_saguaro, "a number in (0, 1] (1 = off)")
        if self.draft_process is not None:
            check_draft_device(self.draft_process.device)
            check_process_spec(self.draft)
        parse_quantize(self.quantize_draft, self.draft_group_size, "--quantize-draft")
        check_survival(self.draft, self.tree)
        return self


def gives_survival(drafter) -> bool:
    """Whether the drafter fills DraftBatch.survival (a confidence head: HeadKind.confidence)."""
    return bool(getattr(drafter, "gives_survival", False))


def check_survival(draft: str, tree: str | None) -> None:
    """`adaptive:K,survival=confidence` asks for a confidence head: refused (exit 2) for a draft without one,
    naming the kinds that have one."""
    from draftsmith.runtime.heads.head_kinds import KINDS, draft_kind
    from draftsmith.runtime.verify.adaptive import parse_adaptive

    if not (tree or "").startswith("adaptive:") or parse_adaptive(tree)[1] != "confidence":
        return
    found = draft_kind(draft)
    if found is None or not found[0].confidence:
        kinds = [f"{k.name}:DIR" for k in KINDS.values() if k.confidence]
        raise BadInputError(
            "--tree", f"{tree} with --draft {draft}",
            f"survival=confidence with a draft that has a confidence head ({', '.join(kinds)}); "
            "survival=observed or auto for the others",
        )  # fmt: skip


@dataclass
class Speculator:
    """A target and its drafter, ready to decode: what `generate_speculative` (or, without a drafter,
    `generate_plain`) takes besides the prompts, plus one load-aware policy per batch size, which keeps
    learning acceptance across requests as a server would."""

    target: Target
    drafter: Drafter | None  # None: plain decoding
    static: bool = False  # the static engine path (SpecConfig.static)
    max_depth: int | None = None  # auto:K's K; None: a fixed tree
    costs: VerifyCosts | None = None  # auto:K: the target's verify-cost curve, measured at build
    draft_quantization: str | None = None  # what the drafter's linears hold: int8, int4-g64, fp8; None: none
    policies: dict[int, LoadAwareDepth] = field(default_factory=dict)  # batch size -> its policy
    # adaptive:K (confidence-driven verification) rather than auto:K, with the drafter's own per-row survival
    # estimates (a confidence head). Without them every row's estimates are the same observed rates, known
    # before drafting: the depth is then chosen before drafting (LoadAwareDepth, which counts the draft's
    # cost too), so no token is drafted that is not verified (BENCHMARKS.md: cutting after drafting K cost
    # 0.83x / 0.76x plain at batch 4 / 16)
    adaptive: bool = False
    survival: str = "auto"  # adaptive:K,survival=SOURCE (runtime/verify/adaptive.py)

    def policy(self, batch: int) -> LoadAwareDepth | AdaptiveVerify | None:
        """auto:K / adaptive:K: the policy of this batch size (made on first use); else None."""
        from draftsmith.runtime.verify.adaptive import AdaptiveVerify
        from draftsmith.runtime.verify.load_aware import LoadAwareDepth

        if self.max_depth is None:
            return None
        if batch not in self.policies:
            if self.adaptive and self.survival != "observed" and gives_survival(self.drafter):
                self.policies[batch] = AdaptiveVerify(
                    self.costs, self.max_depth, self.survival, step_cost=self.drafter.step_cost
                )
            else:
                self.policies[batch] = LoadAwareDepth(
                    self.costs, self.max_depth, step_cost=self.drafter.step_cost
                )
        return self.policies[batch]

    def reset(self) -> None:
        """Forget the acceptance learned so far (a new temperature or batch-size block of a bench)."""
        self.policies.clear()

    def generate(self, prompts: list[list[int]], params: SamplingParams, **run) -> list[GenerationResult]:
        """Decode every prompt (token ids) with `run` as generate_plain / generate_speculative take it
        (max_new_tokens, seed, batch_size, progress; sync_timing and calibration with a drafter); a drafter
        process never outlives an error here."""
        from draftsmith.runtime.core.engine import generate_plain
        from draftsmith.runtime.core.speculative import generate_speculative

        if self.drafter is None:
            run.pop("sync_timing", None)  # plain decoding has no draft/verify split to time
            return generate_plain(self.target, prompts, params, static=self.static, **run)
        policy = self.policy(run.get("batch_size", 1))
        try:
            return generate_speculative(
                self.target, self.drafter, prompts, params, policy=policy, static=self.static, **run
            )
        except BaseException:
            self.abort()
            raise

    def finish(self) -> list[dict]:
        """Stop a drafter process (its trace comes back with it) -> SSD's per-batch metrics ([] without)."""
        from draftsmith.runtime.drafters.draft_process import RemoteDrafter

        if isinstance(self.drafter, RemoteDrafter):
            return self.drafter.close()
        return self.drafter.batch_metrics() if hasattr(self.drafter, "batch_metrics") else []

    def abort(self) -> None:
        """After an error: kill a drafter process."""
        from draftsmith.runtime.drafters.draft_process import RemoteDrafter

        if isinstance(self.drafter, RemoteDrafter) and self.drafter.process is not None:
            self.drafter.close(kill=True)

    @property
    def trace(self) -> list[dict]:
        """SSD: one record per verified cycle (runtime/bench/ssd_replay.py reads them); [] without SSD."""
        return getattr(self.drafter, "trace", None) or []


def build_speculator(target: Target, cfg: SpecConfig) -> Speculator:
    """A SpecConfig -> the drafter (heads loaded; in its own process where asked), adapted to the target's
    setup, with auto:K's verify-cost curve measured now, before any clock starts (a server's start-up)."""
    from draftsmith.runtime.verify.adaptive import parse_adaptive

    drafter = make_drafter(target, cfg)
    quantization = adapt_drafter(drafter, target, cfg)
    depth = cfg.auto_depth if drafter is not None else None
    costs = verify_costs(target, cfg.batch_sizes, depth + 1) if depth else None
    adaptive = (cfg.tree or "").startswith("adaptive:")
    survival = parse_adaptive(cfg.tree)[1] if adaptive else "auto"
    return Speculator(
        target, drafter, cfg.static, depth, costs, quantization, adaptive=adaptive, survival=survival
    )


def make_drafter(target: Target, cfg: SpecConfig) -> Drafter | None:
    """The drafter of `cfg.draft` on `cfg.tree_spec()`; with SSD, SsdDrafter over clones of it; with a
    drafter process, the process's proxy (whose fallback, when asked, is the in-process drafter)."""
    from draftsmith.runtime.drafters.draft_process import DraftConfig, RemoteDrafter
    from draftsmith.runtime.drafters.drafting import build_drafter
    from draftsmith.runtime.drafters.ssd import SsdDrafter, clone_factory

    tree = cfg.tree_spec()

    def in_process() -> Drafter | None:
        drafter = build_drafter(cfg.draft, target, tree, cfg.draft_device, cfg.draft_dtype)
        if not cfg.ssd:
            return drafter
        return SsdDrafter(clone_factory(drafter), tree.max_depth, cfg.ssd_fanout, saguaro=cfg.ssd_saguaro)

    process = cfg.draft_process
    if process is None:
        return in_process()
    fanout = cfg.ssd_fanout if cfg.ssd else 0
    config = DraftConfig(
        process.target,
        cfg.draft,
        tree.max_depth,
        fanout,
        process.device,
        process.dtype,
        saguaro=cfg.ssd_saguaro,
    )
    return RemoteDrafter(config, fallback=in_process if process.fallback else None)


def adapt_drafter(drafter: Drafter | None, target: Target, cfg: SpecConfig) -> str | None:
    """--quantize-draft, then the target's CPU-linears plan, on the drafter's own modules -> the draft's
    quantization as its modules now hold it (None: unquantized), an int8 folder's included."""
    from draftsmith.runtime.core.quantize import (
        draft_quantization,
        own_linears,
        parse_quantize,
        quantize_draft,
    )
    from draftsmith.runtime.core.row_linear import drafter_roots, use_rows_linear

    quant = parse_quantize(cfg.quantize_draft, cfg.draft_group_size, "--quantize-draft")
    if quant is not None and not (cfg.weightless_ok and not own_linears(drafter, target)[1]):
        quantize_draft(drafter, target, quant, cfg.draft)  # a module transform, as torchao's quantize_
    if cfg.rows_plan:  # heads and draft models have the target's widths; quantized linears keep their own
        for root in drafter_roots(drafter, target):
            use_rows_linear(root, cfg.rows_plan)
    return draft_quantization(drafter, target)


_COSTS: dict = {}  # (target, batch sizes, nodes) -> VerifyCosts: one measurement per process and target


def verify_costs(target: Target, batch_sizes: list[int], nodes: int) -> VerifyCosts:
    """The target's verify-cost curve over 1..nodes tokens per row, measured once and shared by every
    load-aware speculator (and the demo's reading)."""
    from draftsmith.runtime.verify.load_aware import measure_verify_costs

    key = (id(target), tuple(sorted(set(batch_sizes))), nodes)
    if key not in _COSTS:
        log.info("measuring verification cost for 1..%d tokens per row at batch sizes %s", nodes, key[1])
        _COSTS[key] = measure_verify_costs(target, batch_sizes, max_nodes=nodes)
    return _COSTS[key]


def prepare_target(
    target: Target, quant: QuantSpec | None = None, attention: str = "sdpa", cpu_linears: str = "auto"
) -> frozenset[int]:
    """The target's serving setup, before any drafter or cost curve sees it: weight-only quantization (a
    self: drafter runs the quantized layers too), the masked-attention kernel, and on an fp32 CPU the
    small-row linears plan -> that plan (SpecConfig.rows_plan: the drafter's linears take it too)."""
    from draftsmith.runtime.core.quantize import quantize_target

    if quant is not None:
        quantize_target(target, quant)
    if attention != "sdpa":
        from draftsmith.runtime.core.kernel_attention import use_kernel_attention

        use_kernel_attention(target, attention)
    if cpu_linears != "auto":  # torch: F.linear everywhere
        return frozenset()
    from draftsmith.runtime.core.row_linear import tune_rows_plan

    return tune_rows_plan(target)  # fp32 on a CPU only; a quantized target keeps its own linears
