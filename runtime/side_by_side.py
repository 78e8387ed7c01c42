"""Side-by-side timing of draftsmith's plain decoding and transformers `generate()` on the same prompts.

Speed is a ratio measured in one run: both methods decode the same prompts, interleaved (the order
alternates every repeat so neither always runs on a warmer machine), after a warm-up of each, and each
prompt's time is the median of the repeats. Greedy outputs are compared token for token.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from draftsmith.runtime.engine import generate_plain
from draftsmith.runtime.sampling import SamplingParams
from draftsmith.runtime.target import Target


def hf_generate(target: Target, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers `generate(do_sample=False)` continuing prompt_ids; returns new tokens (EOS kept)."""
    return hf_generate_batch(target, [prompt_ids], max_new_tokens)[0]


@torch.inference_mode()
def hf_generate_batch(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """`generate(do_sample=False)` on a left-padded batch; new tokens per row, cut after the first EOS."""
    width = max(map(len, prompts))
    pad = target.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=target.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=target.device)
    out = target.model.generate(
        input_ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=target.eos_token_ids,
        pad_token_id=pad,
    )
    rows = []
    for row in out[:, width:].tolist():
        ends = [i for i, tok in enumerate(row) if tok in target.eos_token_ids]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows


@dataclass
class PromptTiming:
    prompt_index: int
    new_tokens: int
    draftsmith_s: float  # median over repeats
    hf_s: float
    identical: bool

    @property
    def ratio(self) -> float:
        return self.hf_s / self.draftsmith_s


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def compare_with_hf(
    target: Target, prompts: list[list[int]], max_new_tokens: int, repeats: int = 3, progress: bool = True
) -> list[PromptTiming]:
    greedy = SamplingParams()
    ours_fn = lambda ids: generate_plain(target, [ids], greedy, max_new_tokens)[0].token_ids
    hf_fn = lambda ids: hf_generate(target, ids, max_new_tokens)
    ours_fn(prompts[0])  # warm-up: allocator, thread pools, lazy init
    hf_fn(prompts[0])
    rows = []
    total = len(prompts) * repeats
    bar = tqdm(total=total, desc="draftsmith vs generate()", unit="run", disable=not progress)
    for index, ids in enumerate(prompts):
        ours_s, hf_s, identical, new = [], [], True, 0
        for rep in range(repeats):
            order = [(ours_fn, ours_s), (hf_fn, hf_s)]
            if (rep + index) % 2:
                order.reverse()
            outputs = []
            for fn, times in order:
                tokens, seconds = _timed(fn, ids)
                times.append(seconds)
                outputs.append(tokens)
            identical &= outputs[0] == outputs[1]
            new = len(outputs[0])
            bar.update()
        rows.append(PromptTiming(index, new, statistics.median(ours_s), statistics.median(hf_s), identical))
    bar.close()
    return rows


def summarize(rows: list[PromptTiming]) -> dict:
    tokens = sum(r.new_tokens for r in rows)
    ours = sum(r.draftsmith_s for r in rows)
    hf = sum(r.hf_s for r in rows)
    return {
        "prompts": len(rows),
        "new_tokens": tokens,
        "draftsmith_tokens_per_s": tokens / ours,
        "hf_generate_tokens_per_s": tokens / hf,
        "speedup_vs_hf_generate": hf / ours,
        "greedy_identical": all(r.identical for r in rows),
        "rows": [asdict(r) | {"ratio": r.ratio} for r in rows],
    }


def format_table(rows: list[PromptTiming], summary: dict) -> str:
    header = f"{'prompt':>6} {'tokens':>6} {'draftsmith tok/s':>17} {'generate() tok/s':>17} {'ratio':>6}"
    lines = [header + " identical"]
    for r in rows:
        lines.append(
            f"{r.prompt_index:>6} {r.new_tokens:>6} {r.new_tokens / r.draftsmith_s:>17.1f}"
            f" {r.new_tokens / r.hf_s:>17.1f} {r.ratio:>6.2f} {'yes' if r.identical else 'NO'}"
        )
    lines.append(
        f"{'all':>6} {summary['new_tokens']:>6} {summary['draftsmith_tokens_per_s']:>17.1f}"
        f" {summary['hf_generate_tokens_per_s']:>17.1f} {summary['speedup_vs_hf_generate']:>6.2f}"
        f" {'yes' if summary['greedy_identical'] else 'NO'}"
    )
    return "\n".join(lines)
