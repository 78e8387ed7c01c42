"""The acceptance record `draftsmith eval` writes (AIPerf's SpecDecodeAcceptanceRecord, vLLM's per-request
spec-decode metrics), from the engine's own per-cycle counts, and the pins of the harness it came from.

    record = acceptance_record(results)    # GenerationResults of one draft, one temperature
    record["mean_acceptance_length"]       # 1 + accepted / steps: tokens a verification step commits
    pins = harness_pins(target, {"top_p": 1.0, "seed": 0, ...}, max_new_tokens=128, chat=True, sets=[pin])

Fields: `steps` (verification cycles after the prefills), `drafted_tokens`, `accepted_tokens`,
`mean_acceptance_length` (1 + accepted / steps; tree- and adaptive-safe: it counts what was accepted, not
what could have been), `draft_acceptance_rate` (accepted / drafted: it falls by arithmetic as K grows),
`accept_rate_per_position` (P(k-th drafted token accepted | drafted), runtime/core/engine.py
accept_rates), `accepted_length_counts` (the histogram: cycles that accepted exactly n drafted tokens) and
`tau` (new tokens / target forwards with the prefill, what generate and bench call mean_accepted).
"""

from __future__ import annotations

from draftsmith.runtime.bench.types import SpecCounters
from draftsmith.runtime.core.artifacts import content_hash, template_hash, tokenizer_hash
from draftsmith.runtime.core.chat_template import chat_identity


def acceptance_record(results) -> dict:
    """GenerationResults, or prompt rows (prompt_row's dicts), of any number of requests -> their pooled
    acceptance record."""
    counters = SpecCounters()
    for r in results:
        counters.add(SpecCounters.from_cycles(_get(r, "accepted_lengths"), _get(r, "draft_depths")))
    new = sum(_get(r, "new_tokens") for r in results)
    forwards = sum(_get(r, "target_forwards") for r in results)
    steps, drafted, accepted = counters.cycles, counters.drafted_tokens, counters.accepted_tokens
    return {
        "requests": len(results),
        "new_tokens": new,
        "target_forwards": forwards,
        "steps": steps,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "mean_acceptance_length": round(1 + accepted / steps, 4) if steps else None,
        "draft_acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "accept_rate_per_position": [round(r, 4) for r in counters.accept_rates()],
        "accepted_length_counts": counters.accepted_length_counts or [],
        "tau": round(new / forwards, 4) if forwards else None,
    }


def _get(result, name: str):
    return result[name] if isinstance(result, dict) else getattr(result, name)


def pool_records(entries: list[dict]) -> dict:
    """Entries (eval_run's, each with its prompt rows) -> one record over all their prompts."""
    return acceptance_record([row for e in entries for row in e["prompts"]])


def prompt_row(prompt, result) -> dict:
    """One prompt's record, with the per-cycle counts it came from (what the runtime's --json rows carry)."""
    return {
        "id": prompt.id,
        "category": prompt.category,
        **acceptance_record([result]),
        "finish_reason": result.finish_reason,
        "accepted_lengths": result.accepted_lengths,
        "draft_depths": result.draft_depths,
    }


def records(prompts, results) -> dict:
    """One set's results -> {"overall", "categories", "prompts"}: the record at each grain."""
    return {
        "overall": acceptance_record(results),
        "categories": category_records(prompts, results),
        "prompts": [prompt_row(p, r) for p, r in zip(prompts, results, strict=True)],
    }


def category_records(prompts, results) -> dict[str, dict]:
    """category -> the record pooled over its prompts (in the order categories first appear)."""
    groups: dict[str, list] = {}
    for prompt, result in zip(prompts, results, strict=True):
        groups.setdefault(prompt.category or "-", []).append(result)
    return {category: acceptance_record(rs) for category, rs in groups.items()}


def target_pins(target) -> dict:
    """What identifies the target a record was measured on: name, config, tokenizer and chat template (and
    its thinking mode, only where the template has one: other harness ids stay as they were)."""
    config = target.config.to_dict() if hasattr(target.config, "to_dict") else vars(target.config)
    pins = {
        "name": target.name,
        "config_hash": content_hash(config),
        "tokenizer_hash": tokenizer_hash(target.tokenizer),
        "chat_template_hash": template_hash(target.tokenizer),
        "dtype": str(target.dtype).removeprefix("torch."),
        "device": target.device.type,
        "quantization": getattr(target, "quantization", None),
    }
    mode = chat_identity(target)["thinking"]
    return (pins | {"thinking": mode}) if mode else pins


def harness_pins(target, sampling: dict, max_new_tokens: int, chat: bool, sets: list[dict]) -> dict:
    """Everything a number depends on besides the draft; `id` hashes it, so two records compare only where
    their harness ids are equal (the leaderboard ranks drafts on one id)."""
    from draftsmith.runtime.bench.run import versions

    pins = {
        "target": target_pins(target),
        "sampling": sampling,
        "max_new_tokens": max_new_tokens,
        "chat": chat,
        "turns": "first user turn of each prompt",
        "sets": sets,
    }
    pins["id"] = content_hash(pins)
    pins["versions"] = versions()  # beside the id: a new torch does not make a new harness
    return pins
