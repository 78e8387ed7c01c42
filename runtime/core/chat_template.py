"""The chat template's thinking mode: which templates have one, the mode a target renders with, and the
chat identity (template hash + mode) that data records and heads carry.

    use_thinking(target, thinking_arg("off", "--thinking"))   # exit 2 where the template has no such mode
    target.encode("Hi")                                       # renders with enable_thinking=False
    chat_identity(target)                                     # {"template_hash": "...", "thinking": "off"}

A template has a thinking mode when its text reads `enable_thinking` (Qwen3 and its kin): transformers
passes extra keywords of `apply_chat_template` into the template, so the mode is that one keyword. The
mode a target renders with is `target.thinking`: True / False, or None for the template's own default.
What is recorded is the mode in effect, "on" or "off", found for the default by rendering one user turn
each way (Qwen3 writes an empty `<think></think>` block only when the mode is off); None means the
template has no thinking mode. A draft trained on one mode runs far below plain decoding on the other
(z-lab/dflash#60), so data steps record it and heads carry it (runtime/heads/trained_for.py).
"""

from __future__ import annotations

from draftsmith.runtime.core.artifacts import template_hash
from draftsmith.runtime.errors import BadInputError

KEYWORD = "enable_thinking"  # the template variable Qwen3-style templates read
MODES = {"on": True, "off": False}
PROBE = [{"role": "user", "content": "Hi"}]  # one user turn: where the mode shows in a generation prompt


def thinking_arg(value: str | None, field: str) -> bool | None:
    """`--thinking on|off` (or a config's `data.thinking`) -> True / False; None: the template's default."""
    if value is None:
        return None
    if value not in MODES:
        raise BadInputError(field, value, "on or off (or leave it out: the template's default)")
    return MODES[value]


def has_thinking(tokenizer) -> bool:
    """Whether the tokenizer's chat template takes `enable_thinking` (a dict of named templates: any)."""
    return KEYWORD in str(getattr(tokenizer, "chat_template", None) or "")


def thinking_kwargs(thinking: bool | None) -> dict:
    """The extra `apply_chat_template` keywords for a mode (none for the template's default)."""
    return {} if thinking is None else {KEYWORD: thinking}


def use_thinking(target, thinking: bool | None, field: str = "--thinking") -> None:
    """Render `target`'s prompts with `thinking`; a mode asked of a template without one is exit 2."""
    if thinking is not None and not has_thinking(target.tokenizer):
        lack = "no chat template" if not target.tokenizer.chat_template else f"no {KEYWORD} variable"
        raise BadInputError(
            field,
            "on" if thinking else "off",
            f"a target whose chat template has a thinking mode (reads {KEYWORD}, as Qwen3's does)",
            f"{target.name}'s tokenizer has {lack}: leave {field} out",
        )
    target.thinking = thinking


def thinking_mode(tokenizer, thinking: bool | None) -> str | None:
    """The mode in effect, "on" or "off"; None where the template has none. The default is found by
    rendering one user turn with and without the mode."""
    if not has_thinking(tokenizer):
        return None
    if thinking is None:
        default = _probe(tokenizer, {})
        thinking = default != _probe(tokenizer, thinking_kwargs(False)) or default == _probe(
            tokenizer, thinking_kwargs(True)
        )
    return "on" if thinking else "off"


def _probe(tokenizer, kwargs: dict) -> str:
    return tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True, **kwargs)


def chat_identity(target) -> dict:
    """What a prompt's rendering depends on besides the text: the template's hash and the mode in effect."""
    tokenizer = target.tokenizer
    return {
        "template_hash": template_hash(tokenizer),
        "thinking": thinking_mode(tokenizer, getattr(target, "thinking", None)),
    }


def describe(identity: dict) -> str:
    """ "chat template 1a2b... (thinking off)": one side of a mismatch, in an error message."""
    mode = identity.get("thinking")
    return f"chat template {identity.get('template_hash')}" + (f" (thinking {mode})" if mode else "")
