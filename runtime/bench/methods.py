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
    llamacpp[:GGUF]+eagle3:HEAD[@chain:K]  llama.cpp's own speculative decoding with an EAGLE-3 head exported
                          `--format gguf` (runtime/bench/llamacpp_eagle3_method.py), greedy, batch 1
    plain+graphs, DRAFT@TREE+graphs   draftsmith's GPU engine path: static KV cache, CUDA graphs for the
                          target's forwards (runtime/core/static_forward.py; eager on a CPU)
    METHOD+torch-linears  the same draftsmith method with F.linear in every target linear (--cpu-linears
                          torch for this row alone): the before of runtime/core/row_linear.py, side by side
    DRAFT@chain:K+ssd[:F] speculative speculative decoding in process (runtime/drafters/ssd.py, `generate
                          --ssd`), fan-out budget F (8 by default); ngram, self: and model: drafts
draftsmith's rows build their speculation with runtime/speculator.py (as `generate` does); speculative rows
also carry draft and verify time per cycle (runtime/bench/cycle_fields.py).
transformers' assisted and prompt-lookup generation decode one sequence at a time (its `generate()` raises
for batch > 1), so those rows exist at batch size 1 only; `supports_batch` says so before anything runs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from types import MappingProxyType

import torch

from draftsmith.runtime.bench.llamacpp_eagle3_method import is_llamacpp_eagle3
from draftsmith.runtime.bench.llamacpp_method import is_llamacpp_method
from draftsmith.runtime.bench.types import BASELINE_KINDS, BatchOutput, Method, SpecCounters, is_baseline
from draftsmith.runtime.core.forwarding import forwarded
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.speculator import SpecConfig, Speculator, build_speculator

HF_LOOKUP_TOKENS = 10  # transformers' documented example value for prompt_lookup_num_tokens
GRAPHS = "+graphs"  # suffix: the same method on the static / CUDA-graph engine path
SSD = "+ssd"  # suffix: the same draft through SsdDrafter, `+ssd:F` with fan-out budget F
SSD_FANOUT = SpecConfig.ssd_fanout  # `generate --ssd-fanout`'s default
TORCH_LINEARS = "+torch-linears"  # suffix: the method with F.linear in the target (row_linear.py off)


class DraftsmithMethod(Method):
    """`plain` or `DRAFT@TREE` on draftsmith's engine: a Speculator (runtime/speculator.py), whose load-aware
    policy per batch size keeps learning acceptance across requests as a server would."""

    def __init__(self, spec: str, speculator: Speculator):
        self.name, self.speculator = spec, speculator

    drafter = forwarded("speculator.drafter")
    static = forwarded("speculator.static")
    policies = forwarded("speculator.policies")

    def reset(self) -> None:
        self.speculator.reset()

    def run(self, prompts, params, max_new_tokens, seed) -> BatchOutput:
        from draftsmith.runtime.verify.calibration import SurvivalTally

        batch, tally = len(prompts), SurvivalTally()  # sums on the device; read once the clock has stopped
        run = dict(max_new_tokens=max_new_tokens, seed=seed, batch_size=batch, sync_timing=self.sync_timing)
        if self.drafter is not None:
            run["calibration"] = tally  # drafts with survival estimates: their calibration
        results = self.speculator.generate(prompts, params, **run)
        spec, timing = None, {}
        if self.drafter is not None:
            from draftsmith.runtime.bench.cycle_fields import batch_timing

            spec, timing = SpecCounters(), batch_timing(results)
            timing["calibration"] = None if tally.sums is None else tally.sums.cpu()
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

    # the inner method's, where it is a draftsmith method (plain rows have none)
    speculator = forwarded("inner.speculator", default=None)
    policies = forwarded("inner.policies", default=MappingProxyType({}))  # shared: read-only
    drafter = forwarded("inner.drafter", default=None)

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


def build_method(
    spec: str,
    target,
    batch_sizes: list[int],
    max_model_len: int = 2048,
    base: SpecConfig | None = None,
    vllm_tp: int = 1,
) -> Method:
    """A method spec (module docstring) -> a ready method (heads loaded, costs measured). `base` holds what
    every draftsmith method shares (draft quantization, the CPU-linears plan); the spec sets the rest;
    `vllm_tp` is the vLLM rows' tensor-parallel size."""
    if spec.endswith(TORCH_LINEARS):
        base_spec = spec.removesuffix(TORCH_LINEARS)
        if is_baseline(base_spec) and base_spec != "plain":
            raise BadInputError("method", spec, f"plain{TORCH_LINEARS} or DRAFT@TREE{TORCH_LINEARS}")
        inner = build_method(base_spec, target, batch_sizes, max_model_len, base)
        return TorchLinearsMethod(spec, inner, target)
    name, static = spec.removesuffix(GRAPHS), spec.endswith(GRAPHS)
    name, fanout = split_ssd(name, spec)
    if static and is_baseline(name) and name != "plain":
        raise BadInputError("method", spec, f"plain{GRAPHS} or DRAFT@TREE{GRAPHS} (draftsmith's engine)")
    if fanout is not None and (static or is_baseline(name) or "@" not in name):
        raise BadInputError("method", spec, f"DRAFT@chain:K{SSD} or DRAFT@chain:K{SSD}:F (no {GRAPHS})")
    draft, tree = "none", None  # plain: the engine without a draft
    if name != "plain":
        method = build_baseline(spec, target, batch_sizes, max_model_len, vllm_tp)
        if method is not None:
            return method
        draft, at, tree = name.partition("@")
        if not at or not draft or draft in ("plain", "none") or draft.startswith(("hf", "vllm")):
            raise BadInputError(
                "method", spec, f"one of {', '.join(BASELINE_KINDS)}, or DRAFT@TREE[{GRAPHS}]"
            )
    ssd = {} if fanout is None else {"ssd": True, "ssd_fanout": fanout}
    cfg = replace(base or SpecConfig(), draft=draft, tree=tree, static=static, batch_sizes=batch_sizes, **ssd)
    return DraftsmithMethod(spec, build_speculator(target, cfg.validate()))


def build_baseline(
    spec: str, target, batch_sizes: list[int], max_model_len: int, vllm_tp: int = 1
) -> Method | None:
    """transformers, vLLM or llama.cpp: another engine's decoding of the same prompts (None: not theirs)."""
    if spec in ("hf", "hf-prompt-lookup"):
        return HfMethod(spec, target)
    if spec.startswith("hf-assisted:"):
        from draftsmith.runtime.drafters.lm_drafter import load_draft_model

        model = spec.removeprefix("hf-assisted:")
        assistant = load_draft_model(model, target, field="--baselines", prefix="hf-assisted:")
        return HfMethod(spec, target, assistant=assistant)
    if spec == "vllm" or spec.startswith("vllm-"):  # vllm-KIND:DIR[@chain:K]: the kind declares its layout
        from draftsmith.runtime.bench.vllm_method import build_vllm_method

        return build_vllm_method(spec, target, max(batch_sizes), max_model_len, vllm_tp)
    if is_llamacpp_eagle3(spec):
        from draftsmith.runtime.bench.llamacpp_eagle3_method import LlamaCppEagle3Method

        return LlamaCppEagle3Method(spec, target, max_model_len=max_model_len)
    if is_llamacpp_method(spec):
        from draftsmith.runtime.bench.llamacpp_method import LlamaCppMethod

        return LlamaCppMethod(spec, target, max_model_len=max_model_len)
    return None


def split_ssd(base: str, spec: str) -> tuple[str, int | None]:
    """`DRAFT@TREE+ssd[:F]` -> (DRAFT@TREE, F); without the suffix (base, None)."""
    head, at, fanout = base.rpartition(SSD)
    if not at or (fanout and not fanout.startswith(":")):
        return base, None
    fanout = fanout.removeprefix(":") or str(SSD_FANOUT)
    if not fanout.isdigit():
        raise BadInputError("method", spec, f"DRAFT@chain:K{SSD}:F with F an integer (the fan-out budget)")
    return head, int(fanout)
