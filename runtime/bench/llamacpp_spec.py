"""llama.cpp's own speculative decoding with an EAGLE-3 GGUF head: one run of its `llama-speculative-simple`
tool per prompt, parsed into text, accepted tokens per step and its own timers.

    tool = spec_tool(".venv-llamacpp")                  # built by bash scripts/setup_llamacpp.sh
    run = run_spec(tool, SpecRequest("target.F32.gguf", "head.gguf", prompt_text, max_new_tokens=48, k=2))
    run.text, run.accepted, run.decode_s                # the generated text, per step, seconds

The tool is llama.cpp's (examples/speculative-simple, from the llama.cpp vendored in llama-cpp-python 0.3.36):
it drafts up to K tokens a step with the head (`--spec-type draft-eagle3`), verifies them in one target
batch and keeps the greedy sampler's agreeing prefix. Its draft-confidence cut (`--spec-draft-p-min`) is off
and its minimum draft 0, so each step drafts exactly min(K, what the budget leaves), as draftsmith's chain
does. It prints the prompt and the generated pieces on stdout (framed by blank lines), its counts and timers
on stderr and, with debug logging (`per_step`: `-lv 5`), one `accepted A/D draft tokens` line per step; the
text is what comparisons use (the tool prints no ids). It tokenizes the prompt text itself (special tokens
parsed), so a caller passes the chat-templated text and checks `prompt_tokens` against its own count. It
stops once more than `-n` tokens are out, so a run yields at least max_new_tokens + 1 tokens (or stops at
the end of generation).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.runtime.errors import BadInputError, DraftsmithError

TOOL = "llama-speculative-simple"
SETUP = "bash scripts/setup_llamacpp.sh"
STEP = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)")
DRAFTED = re.compile(r"draft candidate\s+0, pos\s+\d+:\s+(\d+)")  # the chain's token at each position
TIMER = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
COUNT = re.compile(r"\b(n_drafted|n_accept|n_predict)\s*=\s*(\d+)")


@dataclass
class SpecRequest:
    target: str  # the target's GGUF (F32 for weights equal to draftsmith's fp32 target)
    head: str  # the EAGLE-3 GGUF (`draftsmith export --format gguf`)
    prompt: str  # chat-templated text; llama.cpp tokenizes it, special tokens included
    max_new_tokens: int = 48
    k: int = 2  # tokens drafted per step
    threads: int = 2
    seed: int = 0
    n_ctx: int = 2048
    per_step: bool = (
        False  # debug logging (-lv 5) for the accepted count of each step: slower, not for timing
    )


@dataclass
class SpecRun:
    text: str  # the generated text (after the prompt)
    prompt_tokens: int  # as llama.cpp tokenized the prompt
    new_tokens: int
    n_accept: int  # drafted tokens accepted, all steps
    n_drafted: int
    accepted: list[int] = field(default_factory=list)  # per verify step (with per_step)
    drafted: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # per_step: each step's accepted drafts + its token
    encode_s: float = 0.0  # the prompt's prefill, llama.cpp's own timer
    decode_s: float = 0.0

    @property
    def steps(self) -> int:
        """Target verify forwards: each step yields its accepted tokens plus the target's own one."""
        return len(self.accepted) if self.accepted else self.new_tokens - self.n_accept


def spec_tool(setup: str | Path) -> Path:
    """The tool in the llama.cpp setup's bin/, or bad input naming the setup command."""
    tool = Path(setup) / "bin" / TOOL
    if not tool.is_file():
        raise BadInputError(
            "--llamacpp", str(setup), f"a llama.cpp setup with {TOOL} ({tool} is missing)", f"run `{SETUP}`"
        )
    return tool


def spec_command(tool: Path, req: SpecRequest) -> list[str]:
    return [
        str(tool), "-m", req.target, "-md", req.head, "--spec-type", "draft-eagle3",
        "--spec-draft-n-max", str(req.k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
        "--temp", "0", "--seed", str(req.seed), "-n", str(req.max_new_tokens), "-c", str(req.n_ctx),
        "-t", str(req.threads), "-td", str(req.threads), "-lv", "5" if req.per_step else "3",
        "-p", req.prompt,
    ]  # fmt: skip


def run_spec(tool: Path, req: SpecRequest, timeout_s: float = 600.0) -> SpecRun:
    """One prompt through llama.cpp's speculative decoding; a failed run raises with its last lines."""
    # bytes, decoded leniently: the debug log prints token pieces, which may split a UTF-8 character
    done = subprocess.run(spec_command(tool, req), capture_output=True, timeout=timeout_s)
    stdout, stderr = (done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
    if done.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-8:])
        raise DraftsmithError(f"{TOOL} failed (exit {done.returncode}):\n{tail}")
    return parse_spec(stdout, stderr, req.prompt, req.per_step)


def parse_spec(stdout: str, stderr: str, prompt: str, per_step: bool = True) -> SpecRun:
    """The tool's output -> SpecRun. stdout is "\\n\\n" + prompt pieces + generated pieces + "\\n\\n" (and a
    closing "\\n\\n"); the prompt's pieces are its text when llama.cpp's tokens round-trip it."""
    body = stdout.removeprefix("\n\n")
    if not body.startswith(prompt):
        raise DraftsmithError(f"{TOOL}: the printed prompt differs from the one given: {body[:80]!r}")
    text = body[len(prompt) :].removesuffix("\n\n\n\n")
    timers = {kind: (int(n), float(s)) for kind, n, s in TIMER.findall(stderr)}
    counts = {name: int(value) for name, value in COUNT.findall(stderr)}
    if "encoded" not in timers or "n_accept" not in counts:
        raise DraftsmithError(f"{TOOL}: no timers or counts in its log (a changed tool?)")
    steps, ids = step_tokens(stderr)
    if per_step and sum(a for a, _, _ in steps) != counts["n_accept"]:
        raise DraftsmithError(f"{TOOL}: per-step accepted counts do not add up to n_accept")
    return SpecRun(
        text=text,
        prompt_tokens=timers["encoded"][0],
        new_tokens=counts["n_predict"],
        n_accept=counts["n_accept"],
        n_drafted=counts["n_drafted"],
        accepted=[a for a, _, _ in steps],
        drafted=[d for _, d, _ in steps],
        token_ids=ids,
        encode_s=timers["encoded"][1],
        decode_s=timers["decoded"][1],
    )


def step_tokens(stderr: str) -> tuple[list[tuple[int, int, int]], list[int]]:
    """The debug log's steps (accepted, drafted, the target's token) and the ids they emitted: each step's
    first `accepted` drafted tokens (the chain: candidate 0 at each position, logged before the step's
    `accepted` line), then the target's own token. The tool stops at an end-of-generation token, which the
    caller cuts at (it may sit among a step's accepted drafts)."""
    steps, ids, chain = [], [], []
    for line in stderr.splitlines():
        if (drafted := DRAFTED.search(line)) is not None:
            chain.append(int(drafted.group(1)))
        elif (step := STEP.search(line)) is not None:
            accepted, size, last = (int(g) for g in step.groups())
            steps.append((accepted, size, last))
            ids += chain[:accepted] + [last]
            chain = []
    return steps, ids
