"""Chat templating and assistant-only loss masks, right by construction (the render-boundary method).

    enc = render_and_mask(tokenizer, messages)      # messages: normalized (data_recipes.sources)
    enc.input_ids, enc.loss_mask                   # aligned: loss_mask[t] = 1 -> token t is supervised
    inputs, labels, label_mask = shift_for_training(enc.input_ids, enc.loss_mask)

How the assistant spans are found (as vllm-project/speculators' preprocessing does): for each
assistant turn j the template renders `messages[:j]` with the generation prompt and `messages[:j+1]`
without it. The first must be a prefix of the second; the rest is exactly what the model writes in that
turn: the answer plus the template's end-of-turn text (`<|im_end|>\\n` in ChatML). The whole conversation's
render must in turn start with every `messages[:j+1]` render, so the spans are positions in one string.
A template that fails either check is not prefix-stable at assistant boundaries (it numbers turns,
rewrites earlier turns, ...): that is a `TemplateError`, never a fallback to an all-ones mask. A
tokenizer without a chat template is a `TemplateError` too.

Decisions, each tested in tests/data_recipes/test_templating.py:
- The end-of-turn token is supervised (a head must learn where answers stop); whitespace after it is
  not: each span is cut at its last non-space character, so ChatML's "\\n" after `<|im_end|>` (and
  Gemma's after `<end_of_turn>`) stays unsupervised. Generation stops at the end-of-turn token, so that
  newline is never something the target writes; it belongs to the template's glue between turns.
- The full render is tokenized once (`add_special_tokens=False`: templates write their own BOS) with
  character offsets. Token t is supervised when its first character lies inside an assistant span.
  So a token straddling the start of an answer (it begins in the template's header) is not
  supervised: it belongs to the prompt the model was given. A token straddling the end (it begins in
  the answer and runs into the template's glue) is supervised: the model chose it while answering.
  Templates whose headers end in a newline or a special token (ChatML, Llama 3, Gemma, Mistral) never
  straddle; the count of straddling tokens is returned so callers can report it.
- Shifting: `loss_mask[t]` belongs to token t, which is predicted from positions < t. Training pairs
  position t with label t+1, so the mask must move with the labels: `label_mask = loss_mask[1:]`
  (SpecForge #885 shifted labels but not the mask and lost each answer's first token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.runtime.core.chat_template import thinking_kwargs
from draftsmith.runtime.errors import BadInputError


class TemplateError(BadInputError):
    """The target's chat template cannot give exact assistant spans (exit code 2)."""

    def __init__(self, got: object, expected: str, hint: str | None = None):
        super().__init__("chat template", got, expected, hint)


@dataclass
class Encoded:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where token t is written by the assistant (end-of-turn token included)
    text: str  # the full render
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) characters per answer
    straddling: int = 0  # tokens crossing a span boundary (see the module docstring)

    @property
    def num_supervised(self) -> int:
        return sum(self.loss_mask)


def render(
    tokenizer, messages: list[dict], add_generation_prompt: bool = False, thinking: bool | None = None
) -> str:
    """The template's text for `messages`; `thinking`: enable_thinking (None: the template's default)."""
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(
            None,
            "a tokenizer with a chat template",
            "base models have none: use an instruct model, or set tokenizer.chat_template",
        )
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **thinking_kwargs(thinking)
        )
    except Exception as err:  # jinja2 errors, raise_exception() in templates
        roles = [m["role"] for m in messages]
        raise TemplateError(
            f"an error rendering roles {roles}: {err}", "a template that renders them"
        ) from None
    if not isinstance(text, str):
        raise TemplateError(type(text).__name__, "apply_chat_template(tokenize=False) to return a string")
    return text


def assistant_spans(
    tokenizer, messages: list[dict], thinking: bool | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """The full render and the [start, end) character span of every assistant turn in it."""
    full = render(tokenizer, messages, thinking=thinking)
    spans = []
    for j, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:j], add_generation_prompt=True, thinking=thinking)
        upto = render(tokenizer, messages[: j + 1], thinking=thinking)
        if not upto.startswith(before):
            raise TemplateError(
                f"a render of turns 0..{j} that does not start with the render of turns 0..{j - 1} plus "
                f"the generation prompt ({_first_difference(before, upto)})",
                "a template that is prefix-stable at assistant boundaries",
                "without that, assistant spans cannot be located exactly; refusing to guess a mask",
            )
        if not full.startswith(upto):
            raise TemplateError(
                f"a render of the whole conversation that does not start with the render of turns 0..{j} "
                f"({_first_difference(upto, full)})",
                "a template that renders earlier turns the same whatever follows them",
                "templates that number turns or rewrite earlier turns cannot give exact masks",
            )
        answer = upto[len(before) :].rstrip()
        content = message["content"].strip()
        if content and content not in answer:
            raise TemplateError(
                f"an assistant span {answer[:60]!r} that does not contain the answer {content[:60]!r}",
                "a template that writes assistant content verbatim after the generation prompt",
            )
        spans.append((len(before), len(before) + len(answer)))
    return full, spans


def _first_difference(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"they differ at character {i}: {a[i : i + 30]!r} vs {b[i : i + 30]!r}"


def render_and_mask(tokenizer, messages: list[dict], thinking: bool | None = None) -> Encoded:
    """Token ids of the templated conversation and its assistant-only loss mask (aligned with the ids);
    `thinking`: the template's enable_thinking (runtime/core/chat_template.py; None: its default)."""
    text, spans = assistant_spans(tokenizer, messages, thinking)
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:  # slow (Python) tokenizers have no offsets
        raise TemplateError(
            type(tokenizer).__name__, "a fast tokenizer (character offsets are needed for the mask)"
        ) from None
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    mask = [0] * len(ids)
    straddling = 0
    k = 0  # spans are sorted and disjoint; offsets are non-decreasing
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        lo, hi = spans[k]
        if lo <= start < hi:
            mask[t] = 1
            straddling += end > hi
        elif start < lo < end:
            straddling += 1
    return Encoded(ids, mask, text, spans, straddling)


def shift_for_training(input_ids, loss_mask):
    """(inputs, labels, label_mask): position t reads inputs[t] and is trained to predict labels[t].

    labels = input_ids[1:] and label_mask = loss_mask[1:]: the mask moves with the labels. Works on
    lists and on tensors/arrays (shifting the last dimension).
    """
    if hasattr(input_ids, "shape"):
        if tuple(input_ids.shape) != tuple(loss_mask.shape):
            raise ValueError(
                f"input_ids shape {tuple(input_ids.shape)} != loss_mask {tuple(loss_mask.shape)}"
            )
        return input_ids[..., :-1], input_ids[..., 1:], loss_mask[..., 1:]
    if len(input_ids) != len(loss_mask):
        raise ValueError(f"input_ids has {len(input_ids)} tokens but loss_mask has {len(loss_mask)}")
    return list(input_ids[:-1]), list(input_ids[1:]), list(loss_mask[1:])
