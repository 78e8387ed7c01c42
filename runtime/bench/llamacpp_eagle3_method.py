"""`llamacpp[:TARGET.gguf]+eagle3:HEAD[@chain:K]`: the bench row of an EAGLE-3 head served by llama.cpp's own
speculative decoding, beside the same head in draftsmith's engine (`eagle3:DIR@chain:K`) and llama.cpp plain
(`llamacpp[:TARGET.gguf]`).

    bench --baselines plain,llamacpp:runs/gguf/smollm2-135m.F32.gguf,\
llamacpp:runs/gguf/smollm2-135m.F32.gguf+eagle3:exports/eagle3-gguf@chain:2 --draft eagle3:HEAD --tree chain:2

HEAD is `draftsmith export --format gguf`'s folder (or its head.gguf); TARGET.gguf defaults to the GGUF the
target folder was converted from, as for `llamacpp` (name an F32 file for weights equal to draftsmith's fp32
target: only then are the rows' acceptances comparable token for token). Each prompt runs llama.cpp's
`llama-speculative-simple` once (runtime/bench/llamacpp_spec.py; `bash scripts/setup_llamacpp.sh` builds it):
the row's time is llama.cpp's own prefill and decode timers (its model loads are not timed, like the worker
rows'), greedy only (T = 0), one sequence at a time. The row's ids are read from the tool's debug log (each
step's accepted drafts and its own token: exact ids, so the bench's greedy identity holds them against plain
decoding's). llama.cpp stops once more than its budget is out: it runs with max_new_tokens - 1 and its ids
are cut at max_new_tokens (the few overshoot tokens are inside its time).
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.runtime.bench.llamacpp_method import check_gguf_file, target_gguf
from draftsmith.runtime.bench.llamacpp_spec import SpecRequest, run_spec, spec_tool
from draftsmith.runtime.bench.types import BatchOutput, Method, SpecCounters
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.runtime.verify.sampling import SamplingParams

FIELD = "--baselines"
SYNTAX = (
    "llamacpp[:TARGET.gguf]+eagle3:HEAD[@chain:K] (HEAD: an `export --format gguf` folder or its head.gguf)"
)
HEAD_FILE = "head.gguf"


def is_llamacpp_eagle3(spec: str) -> bool:
    return spec.startswith("llamacpp") and "+eagle3:" in spec


def parse_llamacpp_eagle3(spec: str) -> tuple[str | None, str, int]:
    """-> (target GGUF or None for the default, head path, K)."""
    engine, _, draft = spec.partition("+eagle3:")
    kind, colon, gguf = engine.partition(":")
    head, at, tree = draft.partition("@")
    k = tree.removeprefix("chain:") if at else "2"
    if kind != "llamacpp" or (colon and not gguf) or not head or not k.isdigit() or int(k) < 1:
        raise BadInputError(FIELD, spec, SYNTAX)
    return gguf or None, head, int(k)


def head_gguf(spec: str, head: str) -> Path:
    path = Path(head).expanduser()
    return check_gguf_file(spec, path / HEAD_FILE if path.is_dir() else path)


class LlamaCppEagle3Method(Method):
    """llama.cpp's speculative decoding with an EAGLE-3 GGUF head, one tool run per prompt."""

    engine = "llama.cpp"
    max_batch = 1

    def __init__(self, spec: str, target, setup: str = ".venv-llamacpp", max_model_len: int = 2048):
        gguf, head, self.k = parse_llamacpp_eagle3(spec)
        self.name = spec
        self.target_file = (
            check_gguf_file(spec, Path(gguf).expanduser()) if gguf else target_gguf(spec, target)
        )
        self.head_file = head_gguf(spec, head)
        self.tool = spec_tool(setup)
        self.tokenizer, self.n_ctx = target.tokenizer, max_model_len
        self.eos = set(getattr(target, "eos_token_ids", None) or ())
        self.threads = torch.get_num_threads()  # the same threads as draftsmith's own rows
        self.facts = {
            "engine": "llama.cpp (llama-speculative-simple, llama-cpp-python 0.3.36's llama.cpp)",
            "weights": file_type(self.target_file),
            "gguf": self.target_file.name,
        }

    def unsupported(self, batch: int, params: SamplingParams) -> str | None:
        if batch > 1:
            return f"{self.name}: llama.cpp's speculative tool decodes one sequence"
        if params.temperature != 0:
            return (
                f"{self.name}: greedy only (its sampler's acceptance is not draftsmith's rejection sampling)"
            )
        return None

    def run(
        self, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> BatchOutput:
        out, wall, forwards, counters = [], 0.0, 0, SpecCounters()
        for ids in prompts:
            text = self.tokenizer.decode(ids)  # special tokens spelled out; llama.cpp parses them back
            req = SpecRequest(str(self.target_file), str(self.head_file), text, max(max_new_tokens - 1, 1))
            req.k, req.threads, req.seed, req.n_ctx = self.k, self.threads, seed, self.n_ctx
            req.per_step = True  # the ids from its debug log (no measurable cost to its timers)
            run = run_spec(self.tool, req)
            if run.prompt_tokens != len(ids):
                raise DraftsmithError(
                    f"{self.name}: llama.cpp tokenized the prompt into {run.prompt_tokens} tokens, "
                    f"not {len(ids)}"
                )
            out.append(until_eos(run.token_ids, self.eos)[:max_new_tokens])
            wall += run.encode_s + run.decode_s
            forwards += 1 + run.steps  # the prefill, then one verify forward a step
            counters.add(SpecCounters(run.steps, drafted_tokens=run.n_drafted, accepted_tokens=run.n_accept))
        return BatchOutput(out, wall, [None] * len(prompts), spec=counters, target_forwards=forwards)


def until_eos(ids: list[int], eos: set[int]) -> list[int]:
    """The ids up to and with the first end-of-generation token (as draftsmith's rows keep EOS)."""
    for i, token in enumerate(ids):
        if token in eos:
            return ids[: i + 1]
    return ids


def file_type(path: Path) -> str:
    """The GGUF's precision as its `general.file_type` names it (F32, Q8_0, ...)."""
    import gguf

    field = gguf.GGUFReader(path).fields.get("general.file_type")
    try:
        return gguf.LlamaFileType(int(field.contents())).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (AttributeError, ValueError, TypeError):
        return "unknown"
