"""The methods `draftsmith bench` times side by side: each decodes a batch of token-id prompts.

    method = build_method("eagle3:runs/head/final@auto:3", target, batch_sizes=[1, 4])
    out = method.run(prompt_ids, SamplingParams(), max_new_tokens=64, seed=0)    # -> BatchOutput

Method specs:
    plain                 draftsmith's engine without a draft (the reference every speedup divides by)
    DRAFT@TREE            draftsmith's engine with a `--draft` spec and a `--tree` spec; TREE = auto:K is
                          load-aware speculation (runtime/verify/load_aware.py): chain depth 0..K chosen per
                          cycle
                          from the verify-cost curve measured at start-up and the acceptance observed
    hf                    transformers `generate()` (batched, left padding)
    hf-prompt-lookup      `generate(prompt_lookup_num_tokens=10)`: transformers' n-gram drafting
    hf-assisted:MODEL     `generate(assistant_model=MODEL)`: transformers' assisted generation
    vllm                  vLLM's engine (runtime/bench/vllm_method.py), in its own process
    vllm-KIND:DIR[@chain:K]  vLLM's speculative decoding with a head of a kind vLLM serves (K = 2 by default)
    llamacpp[:GGUF]       llama.cpp on a GGUF file (runtime/bench/llamacpp_method.py), in its own process;
                          without GGUF the one the target was converted from (the embedded target's Q4_1)
    llamacpp-lookup[:GGUF]  the same with llama-cpp-python's prompt-lookup draft (10 tokens)
    plain+graphs, DRAFT@TREE+graphs   draftsmith's GPU engine path: static KV cache, CUDA graphs for the
                          target's forwards (runtime/static/forward.py; eager on a CPU)
    METHOD+torch-linears  the same draftsmith method with F.linear in every target linear (--cpu-linears
                          torch for this row alone): the before of runtime/core/row_linear.py, side by side
    DRAFT@chain:K+ssd[:F] speculative speculative decoding in process (runtime/drafters/ssd.py, `generate
                          --ssd`), fan-out budget F (8 by default); ngram, self: and model: drafts
Speculative rows also carry draft and verify time per cycle (runtime/bench/cycle_fields.py).
transformers' assisted and prompt-lookup generation decode one sequence at a time (its `generate()` raises
for batch > 1), so those rows exist at batch size 1 only; `supports_batch` says so before anything runs.
"""

from __future__ import annotations

import logging
import time

import torch

from draftsmith.runtime.bench.llamacpp_method import is_llamacpp_method
from draftsmith.runtime.bench.types import BASELINE_KINDS, BatchOutput, Method, SpecCounters, is_baseline
from draftsmith.runtime.core.errors import BadInputError

log = logging.getLogger("draftsmith")
HF_LOOKUP_TOKENS = 10  # transformers' documented example value for prompt_lookup_num_tokens
GRAPHS = "+graphs"  # suffix: the same method on the static / CUDA-graph engine path
SSD = "+ssd"  # suffix: the same draft through SsdDrafter, `+ssd:F` with fan-out budget F
SSD_FANOUT = 8  # `generate --ssd-fanout`'s default
TORCH_LINEARS = "+torch-linears"  # suffix: the method with F.linear in the target (row_linear.py off)


class DraftsmithMethod(Method):
    """`plain` or `DRAFT@TREE` on draftsmith's engine; one drafter (and one load-aware policy per batch
    size, which keeps learning acceptance across requests as a server would)."""

    def __init__(
        self,
        spec: str,
        target,
        batch_sizes: list[int],
        drafter=None,
        max_depth: int | None = None,
        static: bool = False,
    ):
        self.name, self.target, self.drafter, self.max_depth = spec, target, drafter, max_depth
        self.static = static
        self.policies: dict[int, object] = {}
        if max_depth is not None:
            self.costs = verify_costs(target, batch_sizes, max_depth + 1)

    def reset(self) -> None:
        self.policies.clear()

    def policy(self, batch: int):
        if self.max_depth is None:
            return None
        from draftsmith.runtime.verify.load_aware import LoadAwareDepth

        if batch not in self.policies:
            self.policies[batch] = LoadAwareDepth(
                self.costs, self.max_depth, step_cost=self.drafter.step_cost
            )
        return self.policies[batch]

    def run(self, prompts, params, max_new_tokens, seed) -> BatchOutput:
        from draftsmith.runtime.core.engine import generate_plain
        from draftsmith.runtime.core.speculative import generate_speculative

        run = (max_new_tokens, seed, len(prompts))
        if self.drafter is None:
            results = generate_plain(self.target, prompts, params, *run, static=self.static)
        else:
            policy = self.policy(len(prompts))
            results = generate_speculative(
                self.target,
                self.drafter,
                prompts,
                params,
                *run,
                policy=policy,
                static=self.static,
                sync_timing=self.sync_timing,
            )
        spec, timing = None, {}
        if self.drafter is not None:
            from draftsmith.runtime.bench.cycle_fields import batch_timing

            spec, timing = SpecCounters(), batch_timing(results)
            for r in results:
                spec.add(SpecCounters.from_cycles(r.accepted_lengths, r.draft_depths))
            if hasattr(self.drafter, "batch_metrics"):  # +ssd: this call was one batch, the last one
                timing["ssd"] = self.drafter.batch_metrics()[-1]
        return BatchOutput(
            token_ids=[r.token_ids for r in results],
            wall_s=max(r.wall_s for r in results),
            ttft_s=[r.ttft_s for r in results],
            spec=spec,
            target_forwards=sum(r.target_forwards for r in results),
            **timing,
        )


_COSTS: dict = {}  # (target, batch sizes, nodes) -> VerifyCosts: one measurement per bench run


def verify_costs(target, batch_sizes: list[int], nodes: int):
    """The target's verify-cost curve, measured once and shared by every load-aware method."""
    from draftsmith.runtime.verify.load_aware import measure_verify_costs

    key = (id(target), tuple(sorted(set(batch_sizes))), nodes)
    if key not in _COSTS:
        log.info(
            "bench: measuring verification cost for %d..%d tokens per row at batch sizes %s", 1, nodes, key[1]
        )
        _COSTS[key] = measure_verify_costs(target, batch_sizes, max_nodes=nodes)
    return _COSTS[key]


class _FirstTokenClock:
    """A transformers streamer that notes when generate() hands out its first new tokens (TTFT)."""

    def __init__(self, start: float):
        self.start, self.calls, self.ttft = start, 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.ttft is None:  # the first call carries the prompt
            self.ttft = time.perf_counter() - self.start

    def end(self) -> None:
        pass


class HfMethod(Method):
    """transformers `generate()`: plain, with prompt lookup, or with an assistant model."""

    def __init__(self, spec: str, target, assistant=None):
        self.name, self.target, self.assistant = spec, target, assistant
        if spec != "hf":
            self.max_batch = 1

    def generate_kwargs(self) -> dict:
        if self.name == "hf-prompt-lookup":
            return {"prompt_lookup_num_tokens": HF_LOOKUP_TOKENS}
        if self.assistant is not None:
            return {"assistant_model": self.assistant.model}
        return {}

    @torch.inference_mode()
    def run(self, prompts, params, max_new_tokens, seed) -> BatchOutput:
        from draftsmith.runtime.bench.side_by_side import hf_generate_batch

        torch.manual_seed(seed)
        start = time.perf_counter()
        clock = _FirstTokenClock(start)
        rows = hf_generate_batch(
            self.target, prompts, max_new_tokens, params, streamer=clock, **self.generate_kwargs()
        )
        wall = time.perf_counter() - start
        return BatchOutput(rows, wall, [clock.ttft] * len(rows))


class TorchLinearsMethod(Method):
    """A draftsmith method run with F.linear in every target linear (runtime/core/row_linear.py's plan off
    for its calls only): the same run before and after the small-row linears, interleaved in one bench."""

    def __init__(self, name: str, inner: Method, target):
        self.name, self.inner, self.target = name, inner, target
        self.max_batch, self.facts = inner.max_batch, {"cpu_linears": "torch"}

    @property
    def policies(self) -> dict:
        return getattr(self.inner, "policies", {})

    @property
    def drafter(self):
        return getattr(self.inner, "drafter", None)

    def unsupported(self, batch: int, params) -> str | None:
        return self.inner.unsupported(batch, params)

    def reset(self) -> None:
        self.inner.reset()

    def run(self, prompts, params, max_new_tokens, seed) -> BatchOutput:
        from draftsmith.runtime.core.row_linear import drafter_roots, torch_linears

        self.inner.sync_timing = self.sync_timing
        with torch_linears(self.target.model, *drafter_roots(self.drafter, self.target)):
            return self.inner.run(prompts, params, max_new_tokens, seed)

    def close(self) -> None:
        self.inner.close()


def build_method(spec: str, target, batch_sizes: list[int], max_model_len: int = 2048) -> Method:
    """A method spec (module docstring) -> a ready method (heads loaded, costs measured)."""
    if spec.endswith(TORCH_LINEARS):
        base = spec.removesuffix(TORCH_LINEARS)
        if is_baseline(base) and base != "plain":
            raise BadInputError("method", spec, f"plain{TORCH_LINEARS} or DRAFT@TREE{TORCH_LINEARS}")
        return TorchLinearsMethod(spec, build_method(base, target, batch_sizes, max_model_len), target)
    base, static = spec.removesuffix(GRAPHS), spec.endswith(GRAPHS)
    base, fanout = split_ssd(base, spec)
    if base == "plain":
        return DraftsmithMethod(spec, target, batch_sizes, static=static)
    if static and is_baseline(base):
        raise BadInputError("method", spec, f"plain{GRAPHS} or DRAFT@TREE{GRAPHS} (draftsmith's engine)")
    if fanout is not None and (static or is_baseline(base) or "@" not in base):
        raise BadInputError("method", spec, f"DRAFT@chain:K{SSD} or DRAFT@chain:K{SSD}:F (no {GRAPHS})")
    if spec in ("hf", "hf-prompt-lookup"):
        return HfMethod(spec, target)
    if spec.startswith("hf-assisted:"):
        from draftsmith.runtime.drafters.lm_drafter import load_draft_model

        model = spec.removeprefix("hf-assisted:")
        assistant = load_draft_model(model, target, field="--baselines", prefix="hf-assisted:")
        return HfMethod(spec, target, assistant=assistant)
    if spec == "vllm" or spec.startswith("vllm-"):  # vllm-KIND:DIR[@chain:K]: the kind declares its layout
        from draftsmith.runtime.bench.vllm_method import build_vllm_method

        return build_vllm_method(spec, target, max(batch_sizes), max_model_len)
    if is_llamacpp_method(spec):
        from draftsmith.runtime.bench.llamacpp_method import LlamaCppMethod

        return LlamaCppMethod(spec, target, max_model_len=max_model_len)
    draft, at, tree = base.partition("@")
    if not at or not draft or draft in ("plain", "none") or draft.startswith(("hf", "vllm")):
        raise BadInputError("method", spec, f"one of {', '.join(BASELINE_KINDS)}, or DRAFT@TREE[{GRAPHS}]")
    return build_draft_method(spec, draft, tree, target, batch_sizes, static, fanout)


def split_ssd(base: str, spec: str) -> tuple[str, int | None]:
    """`DRAFT@TREE+ssd[:F]` -> (DRAFT@TREE, F); without the suffix (base, None)."""
    head, at, fanout = base.rpartition(SSD)
    if not at or (fanout and not fanout.startswith(":")):
        return base, None
    fanout = fanout.removeprefix(":") or str(SSD_FANOUT)
    if not fanout.isdigit():
        raise BadInputError("method", spec, f"DRAFT@chain:K{SSD}:F with F an integer (the fan-out budget)")
    return head, int(fanout)


def build_draft_method(
    spec: str,
    draft: str,
    tree: str,
    target,
    batch_sizes: list[int],
    static: bool = False,
    fanout: int | None = None,
) -> Method:
    from draftsmith.runtime.drafters.drafting import build_drafter
    from draftsmith.runtime.heads.head_kinds import parse_tree
    from draftsmith.runtime.verify.load_aware import parse_auto
    from draftsmith.runtime.verify.tree import chain

    depth = parse_auto(tree)
    drafter = build_drafter(draft, target, chain(depth) if depth else parse_tree(draft, tree))
    if drafter is None:
        raise BadInputError("--draft", draft, "a draft (plain decoding is the `plain` baseline)")
    if fanout is not None:
        drafter = ssd_drafter(spec, drafter, depth, fanout)
    return DraftsmithMethod(spec, target, batch_sizes, drafter=drafter, max_depth=depth, static=static)


def ssd_drafter(spec: str, proto, auto_depth: int, fanout: int):
    """A built chain drafter -> SsdDrafter over clones of it (as `generate --ssd` builds it, cli/ssd.py)."""
    from draftsmith.runtime.drafters.ssd import SsdDrafter, clone_factory
    from draftsmith.runtime.verify.tree import Tree, chain

    tree = proto.tree
    if auto_depth or not isinstance(tree, Tree) or tree != chain(tree.max_depth):
        raise BadInputError("method", spec, f"a chain:K tree with {SSD} (as `generate --ssd`)")
    return SsdDrafter(clone_factory(proto), tree.max_depth, fanout)
