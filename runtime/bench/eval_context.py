"""Acceptance against context length: `draftsmith eval --context-lengths 2048,4096,8192`.

    draftsmith eval --draft eagle3:heads/eagle3-smollm2-135m --context-lengths 2048,4096,8192 \
        --num-prompts 3 --max-new-tokens 32 --out runs/eval-context
    docs = read_documents("speed-bench/throughput_8k:FILE")      # before the target loads
    sets, prompt_ids, context = context_sets(req, target, docs)  # one "set" per length, for eval_method

Long acceptance collapses (2.0 -> 1.0 between 8k and 128k, tokenspeed#1132), and a head only saw its
recipe's `data.max_length` in training: this measures where it falls. Documents come from `--context-docs`:
`sharegpt` (held-out ShareGPT conversations, whole, as text), `text:FILE` (a long local text, its blank-
line paragraphs in order) or an eval set (each row's first turn: SPEED-Bench's long `throughput_*` splits,
from the Hub or a local file in their schema, runtime/bench/eval_sets.py). Texts are joined in order into
`--num-prompts` documents, each long enough for the longest length; every length cuts the same documents.

A context length L is the whole window: the prompt (the document's first tokens, then QUESTION, in the chat
template) has exactly L - max_new_tokens tokens, so prompt and continuation fit L. L above the target's
context (max_position_embeddings, capped by a sliding window) exits 2 naming it. The head's training
length (its run's `data.max_length`: the head folder's train_config.yaml, or config.yaml of the run the
folder sits in; else "unknown") is recorded beside the numbers and drawn on the plot.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

from draftsmith.runtime.bench.bench_prompt import BenchPrompt
from draftsmith.runtime.errors import BadInputError, read_text

QUESTION = "Summarize the text above in a few sentences."
DOC_SOURCES = "sharegpt, text:FILE or an eval set (e.g. speed-bench/throughput_8k[:FILE])"


def read_documents(spec: str) -> tuple[Callable[[], Iterator[tuple[str, str]]], dict]:
    """A document source -> (a function yielding its (id, text) in order, its pin). Files are checked
    and read here, before any model loads; ShareGPT streams when iterated."""
    from draftsmith.runtime.bench.eval_sets import file_hash, is_eval_set, load_eval_set, text_hash

    kind, _, arg = spec.partition(":")
    if spec == "sharegpt":
        return sharegpt_conversations, {"docs": spec, "source": "held-out ShareGPT conversations"}
    if kind == "text" and arg:
        path = Path(arg).expanduser()
        if not path.is_file():
            raise BadInputError("--context-docs", spec, "text:FILE with an existing text file")
        paragraphs = [p.strip() for p in read_text(path, "--context-docs").split("\n\n") if p.strip()]
        pin = {"docs": spec, "source": "file", "file": str(path), "file_sha256": file_hash(path)}
        return (lambda: ((f"p{i}", p) for i, p in enumerate(paragraphs))), pin
    if is_eval_set(spec):
        prompts, pin = load_eval_set(spec, 10**9)  # every row: how many a document needs depends on L
        rows = [(p.id, p.turns[0]) for p in prompts]
        read = {
            k: v for k, v in pin.items() if k not in ("set", "name", "prompts", "categories", "prompts_hash")
        }
        pin = {"docs": spec, **read, "docs_hash": text_hash(repr(rows))}  # what each length's pin carries
        return (lambda: iter(rows)), pin
    raise BadInputError("--context-docs", spec, DOC_SOURCES)


def sharegpt_conversations() -> Iterator[tuple[str, str]]:
    """Held-out ShareGPT conversations (never trained on: data_recipes/sources.py), each as one text."""
    from draftsmith.data_recipes.common import Summary
    from draftsmith.data_recipes.sources import SHAREGPT_HELD_OUT_START, iter_raw_rows, normalize

    for row_id, row in itertools.islice(iter_raw_rows("sharegpt"), SHAREGPT_HELD_OUT_START, None):
        conv = normalize(row_id, row, Summary())
        if conv is not None:
            yield row_id, "\n\n".join(f"{m['role']}: {m['content'].strip()}" for m in conv.messages)


def long_documents(texts: Iterator[tuple[str, str]], tokenizer, count: int, tokens: int, spec: str):
    """`count` documents of at least `tokens` tokens, each the next texts joined in order -> a list of
    (token ids, the ids of the texts it joins)."""
    docs, ids, parts = [], [], []
    for text_id, text in texts:
        ids += tokenizer(text + "\n\n", add_special_tokens=False)["input_ids"]
        parts.append(text_id)
        if len(ids) >= tokens:
            docs.append((ids, parts))
            ids, parts = [], []
            if len(docs) == count:
                return docs
    raise BadInputError(
        "--context-docs",
        spec,
        f"text for {count} documents of {tokens} tokens (--num-prompts x the longest context)",
        f"it fills {len(docs)}",
    )


def fit_prompt(target, doc_ids: list[int], budget: int, chat: bool) -> list[int]:
    """The document's first tokens, then QUESTION, rendered as the prompt: exactly `budget` tokens where
    re-tokenizing the cut text allows, else the longest fit below it."""
    n = budget - len(target.encode("\n\n" + QUESTION, chat=chat))
    best: list[int] = []
    for _ in range(8):  # a cut text re-tokenizes to within a few tokens of n
        text = target.tokenizer.decode(doc_ids[: max(n, 1)], skip_special_tokens=True)
        ids = target.encode(text + "\n\n" + QUESTION, chat=chat)
        if len(ids) <= budget and len(ids) > len(best):
            best = ids
        if len(ids) == budget or n > len(doc_ids):
            break
        n += budget - len(ids)
    return best


def check_lengths(lengths: list[int], target, max_new_tokens: int, chat: bool) -> None:
    """Each length: an integer, given once, above --max-new-tokens + the question, within the target's
    context (exit 2 naming the target's limit)."""
    limit = target.max_context
    floor = max_new_tokens + len(target.encode("\n\n" + QUESTION, chat=chat)) + 1
    if len(set(lengths)) != len(lengths):
        raise BadInputError("--context-lengths", lengths, "each length once")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length < floor:
            raise BadInputError(
                "--context-lengths",
                length,
                f"an integer >= {floor} (--max-new-tokens {max_new_tokens} + the question + 1 token)",
            )
        if length > limit:
            positions = getattr(target.config, "max_position_embeddings", None)
            raise BadInputError(
                "--context-lengths",
                length,
                f"at most {limit}, the context of the target {target.name} "
                f"(max_position_embeddings {positions})",
            )


def context_sets(req, target, docs) -> tuple[list, list, dict]:
    """-> (one (prompts, pin) per length, their prompt ids, the context record without its rows)."""
    from draftsmith.runtime.bench.eval_sets import text_hash

    lengths = sorted(req.context_lengths)
    check_lengths(lengths, target, req.max_new_tokens, req.chat)
    iterate, pin = docs
    longest = lengths[-1] - req.max_new_tokens
    found = long_documents(iterate(), target.tokenizer, req.num_prompts, longest, pin["docs"])
    sets, prompt_ids = [], []
    for length in lengths:
        ids = [fit_prompt(target, doc, length - req.max_new_tokens, req.chat) for doc, _ in found]
        prompts = [BenchPrompt(("",), f"ctx{length}", "+".join(parts)[:80]) for _, parts in found]
        tokens = [len(i) for i in ids]
        set_pin = {**pin, "set": f"ctx{length}", "name": "context", "context_length": length}
        set_pin |= {"prompts": len(ids), "prompt_tokens": tokens, "prompts_hash": text_hash(repr(ids))}
        set_pin |= {"question_hash": text_hash(QUESTION)}  # the docs' pin too: all in the harness id
        sets.append((prompts, set_pin))
        prompt_ids.append(ids)
    record = {
        "lengths": lengths,
        "docs": pin,
        "question": QUESTION,
        "target_context": target.max_context,
        "training": {spec: training_length(spec) for spec in req.drafts},
    }
    return sets, prompt_ids, record


def training_length(spec: str) -> dict:
    """A draft's training context: its run's data.max_length, and the file it came from ("unknown" where
    no run config sits with the head, or the draft has no head)."""
    import yaml

    from draftsmith.runtime.heads.trained_for import head_folder_of

    folder = head_folder_of(spec.partition("@")[0])
    candidates = [folder / "train_config.yaml", folder.parent / "config.yaml"] if folder else []
    for path in candidates:
        if path.is_file():
            data = (yaml.safe_load(path.read_text()) or {}).get("data") or {}
            if isinstance(data.get("max_length"), int):
                return {"max_length": data["max_length"], "source": str(path)}
    return {"max_length": "unknown", "source": None}


def context_result(context: dict, entries: list[dict], sets: list) -> dict:
    """The context record with its rows; each entry gets its context length and mean prompt tokens."""
    pins = {pin["set"]: pin for _, pin in sets}
    keep = ("mean_acceptance_length", "draft_acceptance_rate", "accept_rate_per_position", "steps")
    rows = []
    for e in entries:
        pin = pins[e["set"]]
        e["context_length"] = pin["context_length"]
        e["mean_prompt_tokens"] = round(sum(pin["prompt_tokens"]) / len(pin["prompt_tokens"]), 1)
        rows.append(
            {
                "method": e["method"],
                "temperature": e["temperature"],
                "context_length": e["context_length"],
                "mean_prompt_tokens": e["mean_prompt_tokens"],
                **{k: e["overall"][k] for k in keep},
                "accepted_length_counts": e["overall"]["accepted_length_counts"],
            }
        )
    return {**context, "rows": rows}
