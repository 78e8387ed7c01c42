"""What every `draftsmith bench` method returns for one batch of requests, whoever decoded it.

A method (draftsmith's engine, transformers `generate()`, vLLM in its own process) decodes a batch of
prompts given as token ids and returns one `BatchOutput`: the new tokens and the timing of each request,
and, for speculative methods, the verification counters the bench pools into tau and acceptance rates.

    out = method.run([[1, 2, 3], [4, 5]], SamplingParams(), max_new_tokens=64, seed=0)
    out.token_ids[0], out.wall_s, out.ttft_s[0], out.spec

Counting conventions (the same for every method, so rows compare):
  - a cycle is one verification forward after the prefill; the prefill produces the first token;
  - target forwards of a request = 1 (prefill) + its cycles; tau (mean_accepted) = new tokens / forwards;
  - accepted_per_position[k] counts the cycles whose (k+1)-th drafted token was accepted,
    drafted_per_position[k] the cycles that drafted one; their ratio is the acceptance rate at k+1;
  - accepted_length_counts[n] counts the cycles that accepted exactly n drafted tokens (when known).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftsmith.runtime.verify.calibration import CalibrationSums
    from draftsmith.runtime.verify.sampling import SamplingParams


@dataclass
class SpecCounters:
    cycles: int = 0  # verification forwards after the prefills, summed over requests
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_length_counts: list[int] | None = None  # None: the method reports no per-cycle lengths

    def add(self, other: SpecCounters) -> None:
        """Pool another batch's counters into these."""
        self.cycles += other.cycles
        self.drafted_tokens += other.drafted_tokens
        self.accepted_tokens += other.accepted_tokens
        self.accepted_per_position = _add_lists(self.accepted_per_position, other.accepted_per_position)
        self.drafted_per_position = _add_lists(self.drafted_per_position, other.drafted_per_position)
        if other.accepted_length_counts is not None:
            mine = self.accepted_length_counts or []
            self.accepted_length_counts = _add_lists(mine, other.accepted_length_counts)

    @classmethod
    def from_cycles(cls, accepted_lengths: list[int], draft_depths: list[int]) -> SpecCounters:
        """Counters of a request whose per-cycle accepted lengths and draft depths are known."""
        depth = max(draft_depths, default=0)
        counts = [0] * (max(accepted_lengths, default=0) + 1)
        for n in accepted_lengths:
            counts[n] += 1
        return cls(
            cycles=len(accepted_lengths),
            drafted_tokens=sum(draft_depths),
            accepted_tokens=sum(accepted_lengths),
            accepted_per_position=[sum(a >= k for a in accepted_lengths) for k in range(1, depth + 1)],
            drafted_per_position=[sum(d >= k for d in draft_depths) for k in range(1, depth + 1)],
            accepted_length_counts=counts,
        )

    def accept_rates(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    width = max(len(a), len(b))
    return [x + y for x, y in zip(a + [0] * (width - len(a)), b + [0] * (width - len(b)), strict=True)]


@dataclass
class BatchOutput:
    token_ids: list[list[int]]  # per request: new tokens only (EOS kept when generated)
    wall_s: float  # the whole batch, prefill included: every request's latency in a batch run
    ttft_s: list[float | None]  # per request: time to its first new token (None: not measurable)
    spec: SpecCounters | None = None  # None for methods that do not speculate or do not say
    target_forwards: int | None = None  # summed over requests (prefills included); None when unknown
    # draftsmith's speculative engine only (None elsewhere; runtime/bench/cycle_fields.py pools them):
    # the batch's cycles (verify forwards of the whole batch) and their summed draft / verify seconds
    timed_cycles: int | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    ssd: dict | None = None  # `+ssd` methods: this batch's SsdDrafter.batch_metrics() entry
    # drafts with survival estimates (a DSpark confidence head): this batch's calibration sums (CPU)
    calibration: CalibrationSums | None = None


BASELINE_KINDS = (  # what `--baselines` takes (runtime/bench/methods.py runs them)
    "plain",
    "plain+graphs",
    "plain+torch-linears",
    "hf",
    "hf-prompt-lookup",
    "hf-assisted:MODEL",
    "vllm",
    "vllm-KIND:DIR[@chain:K]",  # KIND: a head kind vLLM serves (runtime/bench/vllm_method.py)
    "llamacpp[:GGUF]",
    "llamacpp-lookup[:GGUF]",
    "llamacpp[:GGUF]+eagle3:HEAD[@chain:K]",  # llama.cpp's speculative decoding (llamacpp_eagle3_method.py)
)


def is_baseline(name: str) -> bool:
    """A method `draftsmith bench` takes as a baseline, not as a DRAFT@TREE of draftsmith's engine."""
    kind, _, arg = name.partition(":")
    plain_kinds = (
        "plain",
        "plain+graphs",
        "plain+torch-linears",
        "hf",
        "hf-prompt-lookup",
        "vllm",
        "llamacpp",
        "llamacpp-lookup",
    )
    with_arg = ("hf-assisted", "llamacpp", "llamacpp-lookup")
    llamacpp_draft = kind == "llamacpp+eagle3" and bool(arg)
    return (
        name in plain_kinds
        or llamacpp_draft
        or ((kind in with_arg or kind.startswith("vllm-")) and bool(arg))
    )


class Method:
    """A bench method: decodes a batch of token-id prompts with its own `run(prompts, params, max_new_tokens,
    seed) -> BatchOutput` (runtime/bench/methods.py builds them; runtime/bench/vllm_method.py is one). The
    base keeps only the shared, optional parts: batch limits, reset, close."""

    name: str
    max_batch: int | None = None  # None: any batch size
    sync_timing: bool = False  # draftsmith's engine: synchronize CUDA around each timed phase
    facts: dict = {}  # copied into each of its rows (another engine's name, its weights' precision)

    def unsupported(self, batch: int, params: SamplingParams) -> str | None:
        """None if this method runs at this batch size and temperature, else why not."""
        if self.max_batch is not None and batch > self.max_batch:
            return f"{self.name} decodes one sequence at a time (transformers' assisted generation)"
        return None

    def reset(self) -> None:
        """Forget what was learned from earlier requests (a new temperature / batch-size block)."""

    def close(self) -> None:
        pass
