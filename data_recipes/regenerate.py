"""`draftsmith data regenerate`: replace every assistant turn with the target's own answer.

Self-distillation (the EAGLE-3 / SpecForge recipe): a head learns to predict what *the target* says, so
the training answers should be the target's. Turn by turn: answer j is generated from the conversation
with answers 1..j-1 already replaced, the user (and system) turns kept as they were.

    draftsmith data regenerate --data data/sg --out data/sg-regen --batch-size 8 --max-new-tokens 512

- Batched through draftsmith's own decoding engine (`engine.decode_batch`), rows grouped by turn and, within
  a turn, by prompt length (less padding in each batch's prefill).
- Deterministic under a seed: each (conversation id, turn) samples with its own generator seeded from
  (seed, id, turn), so answers do not depend on batch size, order, or on where a killed run resumed.
- Sharded with `--num-shards N --shard-index K` (one process or machine each): part K regenerates a
  contiguous N-th of the conversations into OUT/part-0000K-of-0000N/; the parts read as one folder, rows
  in their original order, in every later step (draftsmith.data_recipes.parts).
- Resumable: every finished batch is appended to OUT.partial/answers-NNNNN.jsonl (written atomically);
  a restart reads them and generates only what is missing. The finished folder has the prepared format
  (the same train/validation membership as the input) and records the sampling settings.
- A conversation with a turn whose prompt (the history with the regenerated answers) does not fit the
  target's context is left out and counted as dropped; its later turns are not asked (as with vLLM).
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.data_recipes.common import (
    RECORD_FILE,
    StepRecord,
    Summary,
    check_same_target,
    content_hash,
    fingerprint,
    follow_thinking,
    is_done,
)
from draftsmith.data_recipes.parts import (
    check_shard_args,
    load_prepared,
    part_folder,
    require_whole,
    shard_range,
    whole_done,
)
from draftsmith.runtime.core.chat_template import thinking_kwargs
from draftsmith.runtime.core.config import atomic_write_text
from draftsmith.runtime.core.engine import decode_batch
from draftsmith.runtime.errors import BadInputError, check_output_dir
from draftsmith.runtime.verify.sampling import SamplingParams

log = logging.getLogger("draftsmith")


def row_generator(seed: int, row_id: str, turn: int, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(content_hash([seed, row_id, turn]), 16) % (2**63))
    return g


def assistant_turns(messages: list[dict]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def load_answers(partial: Path) -> dict[tuple[str, int], str]:
    """(row id, message index) -> regenerated text, from every complete chunk of a previous run."""
    answers = {}
    for chunk in sorted(partial.glob("answers-*.jsonl")):
        for line in chunk.read_text().splitlines():
            item = json.loads(line)
            answers[(item["id"], item["index"])] = item["text"]
    return answers


def generate_turns(
    target,
    conversations: dict[str, list[dict]],
    params: SamplingParams,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
    partial: Path,
    summary: Summary,
    progress: bool = True,
) -> dict[str, list[dict]]:
    """Regenerate every assistant turn, round by round; returns the new conversations."""
    answers = load_answers(partial)
    if answers:
        log.info("resuming: %d answers from a previous run in %s", len(answers), partial)
    chunk_id = len(list(partial.glob("answers-*.jsonl")))
    rounds = max((len(assistant_turns(m)) for m in conversations.values()), default=0)
    total = sum(len(assistant_turns(m)) for m in conversations.values())
    bar = tqdm(total=total, initial=len(answers), desc="regenerate", unit="turn", disable=not progress)
    # Rows with a turn whose prompt did not fit: their later turns are not asked (their history would
    # lack that answer) and the row is left out, counted once, as vllm_regenerate.turn_request does.
    dropped: set[str] = set()
    for r in range(rounds):
        todo = []  # (row id, message index, prompt ids)
        for row_id, messages in conversations.items():
            turns = assistant_turns(messages)
            if r >= len(turns) or (row_id, turns[r]) in answers or row_id in dropped:
                continue
            history = [_with_answer(m, i, row_id, answers) for i, m in enumerate(messages[: turns[r]])]
            todo.append((row_id, turns[r], chat_prompt_ids(target, history)))
        # Batch prompts of similar length: a static batch prefills every row at the longest prompt's
        # width, and prefill is most of the work when answers are short (BENCHMARKS.md, issue 22). The
        # answers do not change: each depends only on its own prompt and (seed, id, turn).
        todo.sort(key=lambda item: len(item[2]))
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            batch = [b for b in batch if _fits(target, b, summary, dropped)]
            if not batch:
                continue
            gens = None
            if not params.greedy:
                gens = [row_generator(seed, row_id, index, target.device) for row_id, index, _ in batch]
            results = decode_batch(target, [ids for _, _, ids in batch], params, max_new_tokens, gens)
            lines = []
            for (row_id, index, _), res in zip(batch, results, strict=True):
                tokens = [t for t in res.token_ids if t not in target.eos_token_ids]
                answers[(row_id, index)] = target.tokenizer.decode(tokens, skip_special_tokens=True)
                summary.notes[f"answers ending by {res.finish_reason}"] += 1
                lines.append(json.dumps({"id": row_id, "index": index, "text": answers[(row_id, index)]}))
            atomic_write_text(partial / f"answers-{chunk_id:05d}.jsonl", "\n".join(lines) + "\n")
            chunk_id += 1
            bar.update(len(batch))
    bar.close()
    return answered(conversations, answers)


def answered(conversations: dict[str, list[dict]], answers: dict) -> dict[str, list[dict]]:
    """The conversations whose every assistant turn has an answer, with those answers."""
    return {
        row_id: [_with_answer(m, i, row_id, answers) for i, m in enumerate(messages)]
        for row_id, messages in conversations.items()
        if all((row_id, i) in answers for i in assistant_turns(messages))
    }


def _with_answer(message: dict, index: int, row_id: str, answers: dict) -> dict:
    if message["role"] != "assistant":
        return message
    return {"role": "assistant", "content": answers[(row_id, index)]}


def chat_prompt_ids(target, messages: list[dict]) -> list[int]:
    """The history + the assistant header, in the thinking mode of the prepared data (follow_thinking)."""
    kwargs = thinking_kwargs(getattr(target, "thinking", None))
    text = target.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return target.tokenizer(text, add_special_tokens=False)["input_ids"]


def _fits(target, item, summary: Summary, dropped: set[str]) -> bool:
    if len(item[2]) >= target.max_context:
        summary.drop("prompt longer than the target's context")
        dropped.add(item[0])
        return False
    return True


def open_partial(partial: Path, inputs: dict) -> Path:
    """The folder of a run's answers so far, stamped with its inputs: one left by a run with other inputs
    (another seed, length, target...) is cleared, so no answer of theirs is reused."""
    stamp = partial / "inputs.json"
    if stamp.is_file() and json.loads(stamp.read_text()) != inputs:
        log.info("%s holds answers made with other inputs: starting over", partial)
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stamp, json.dumps(inputs, indent=1))
    return partial


def part_conversations(data_dir, num_shards: int, shard_index: int):
    """A prepared folder (its DatasetDict), its conversations {id: messages}, only part `shard_index` of
    `num_shards` (a contiguous range: the parts concatenated keep every split's row order), and that range
    (None if whole)."""
    dataset = load_prepared(data_dir)
    conversations = {
        row["id"]: json.loads(row["messages"])
        for split in dataset
        for row in dataset[split].select_columns(["id", "messages"])
    }
    if num_shards <= 1:
        return dataset, conversations, None
    if num_shards > len(conversations):
        raise BadInputError("--num-shards", num_shards, f"at most {len(conversations)} (the rows of --data)")
    lo, hi = shard_range(len(conversations), shard_index, num_shards)
    return dataset, dict(list(conversations.items())[lo:hi]), (lo, hi)


def check_counts(*named: tuple[str, object]) -> None:
    """Each (flag, value) an integer >= 1."""
    for name, value in named:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadInputError(name, value, "an integer >= 1")


def regeneration_record(target, source: dict, params: SamplingParams, max_new_tokens: int, seed: int,
                        **more) -> StepRecord:  # fmt: skip
    """The record of regenerating the prepared folder recorded as `source`: what makes its answers
    (`more`: the engine's own inputs)."""
    return StepRecord(
        "regenerate",
        inputs={
            "fingerprint": fingerprint(target),
            "data_hash": source["inputs_hash"],
            "sampling": {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k},
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "max_length": source["inputs"].get("max_length"),
            **more,
        },
    )


def done_before(out: Path, record: StepRecord, num_shards: int, shard_index: int) -> tuple[dict | None, Path]:
    """The record `out` already holds for this regeneration (whole, or this part; None if none) and the
    part's folder."""
    whole = whole_done(out, record.inputs_hash, "regenerate")  # made before, in one run or in parts
    if whole is not None:
        log.info("%s already holds this regeneration (inputs %s): nothing to do", out, record.inputs_hash)
        return whole, out
    part = part_folder(out, record, num_shards, shard_index, "regenerate")
    if num_shards > 1 and is_done(part, record):
        log.info("%s already holds this part (inputs %s): nothing to do", part, record.inputs_hash)
        return json.loads((part / RECORD_FILE).read_text()), part
    return None, part


def regenerate(
    target,
    data_dir: str | Path,
    out: str | Path,
    params: SamplingParams,
    max_new_tokens: int = 512,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = True,
    num_shards: int = 1,
    shard_index: int = 0,
) -> dict:
    """Regenerate a prepared folder into `out` (prepared format); a no-op when already done.

    With num_shards > 1 it regenerates part `shard_index` (a contiguous N-th of the conversations,
    `parts.shard_range`) into OUT/part-K-of-N/; the parts read as one folder (`parts.load_prepared`)."""
    from draftsmith.data_recipes.prepare import write_prepared

    params.validate()
    check_counts(("--max-new-tokens", max_new_tokens), ("--batch-size", batch_size))
    check_shard_args(num_shards, shard_index)
    source = require_whole(data_dir, "--data", ("prepare", "regenerate"))
    follow_thinking(target, source)  # the mode prepare rendered with (--thinking), recorded again here
    check_same_target(source, target, "--target")
    out = check_output_dir("--out", out)  # a file there, or above it
    record = regeneration_record(target, source, params, max_new_tokens, seed)
    done, part = done_before(out, record, num_shards, shard_index)
    if done is not None:
        return done
    partial = open_partial(Path(f"{part}.partial"), record.inputs)
    dataset, conversations, rows_range = part_conversations(data_dir, num_shards, shard_index)
    if rows_range is not None:
        lo, hi = rows_range
        command = _part_command(target, data_dir, out, params, max_new_tokens, seed, batch_size, num_shards)
        record.outputs["part"] = {"rows": [lo, hi], "command": command}
    summary = Summary(read=len(conversations))
    new = generate_turns(
        target, conversations, params, max_new_tokens, seed, batch_size, partial, summary, progress
    )
    rows = {
        split: [(row_id, new[row_id]) for row_id in dataset[split]["id"] if row_id in new]
        for split in dataset
    }
    # Rows keep their source split, so validation stays held out from what heads train on.
    done = write_prepared(target, rows, part, record, summary, record.inputs["max_length"], progress=progress)
    shutil.rmtree(partial, ignore_errors=True)
    return done


def _part_command(target, data_dir, out, params, max_new_tokens, seed, batch_size, num_shards) -> str:
    """The `draftsmith data regenerate` line that makes a part of this run (its --shard-index appended)."""
    words = ["draftsmith", "data", "regenerate", "--target", getattr(target, "path", None) or target.name]
    words += ["--dtype", str(target.dtype).removeprefix("torch."), "--data", str(data_dir), "--out", str(out)]
    options = {"--temperature": params.temperature, "--top-p": params.top_p, "--top-k": params.top_k}
    options |= {"--max-new-tokens": max_new_tokens, "--seed": seed, "--batch-size": batch_size}
    options |= {"--engine": "draftsmith", "--num-shards": num_shards}  # every part on this engine
    return shlex.join(words + [str(w) for option in options.items() for w in option])


def run_from_args(args) -> None:
    from draftsmith.data_recipes.step_summary import StepTimer
    from draftsmith.data_recipes.tp_steps import run_step

    timer = StepTimer()
    check_shard_args(args.num_shards, args.shard_index)  # before loading the target
    params = SamplingParams(args.temperature, args.top_p, args.top_k)

    def work(target, num_shards: int, shard_index: int) -> dict:
        return regenerate(
            target,
            args.data,
            args.out,
            params,
            args.max_new_tokens,
            args.seed,
            args.batch_size,
            num_shards=num_shards,
            shard_index=shard_index,
        )

    # one process, or this rank's share under torchrun (--target-placement tp: its group's part; the
    # group's rank 0 samples, the others run each forward with it)
    done = run_step(args, "regenerate", work)
    if done is None:  # a TP follower: its leader logs
        return
    summary = done.get("summary") or {}
    shard = done["inputs"].get("shard")
    where = f"{args.out} (part {shard['index']} of {shard['count']})" if shard else args.out
    log.info("regenerated into %s: %s", where, json.dumps(summary))
    log.info(timer.line(done, args.out))
