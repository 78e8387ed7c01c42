"""The chat template's thinking mode (runtime/core/chat_template.py) and a head's record of the template it
was trained with (runtime/heads/trained_for.py), on the embedded SmolLM2 tokenizer (ChatML, no thinking
mode) and on Qwen3-style variants of its template built here: which templates have a mode, the mode in
effect by default, the error for a mode a template lacks, and the mismatch check's text and override.

    python -m pytest tests/runtime/test_chat_template.py -q
"""

import copy
import json
from types import SimpleNamespace

import pytest

from draftsmith.runtime.core.artifacts import template_hash, tokenizer_hash
from draftsmith.runtime.core.chat_template import chat_identity, has_thinking, thinking_mode, use_thinking
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.head_folder import config_from
from draftsmith.runtime.heads.trained_for import check_trained_for, read_trained_for, record_in, stamp

HEADER = "{{ '<|im_start|>assistant\n' }}"
OFF_BLOCK = (  # Qwen3's: an empty think block when the mode is off
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}"
)
ON_BLOCK = "{% if enable_thinking %}{{ '<think>\n' }}{% endif %}"  # a template whose default is off


@pytest.fixture(scope="module")
def chatml():
    from transformers import AutoTokenizer

    from draftsmith.runtime.core.targets import resolve_target

    return AutoTokenizer.from_pretrained(resolve_target("smollm2-135m").path)


def variant(tokenizer, block: str):
    """The tokenizer with `block` after its generation prompt's assistant header (Qwen3 style)."""
    assert HEADER in tokenizer.chat_template
    out = copy.deepcopy(tokenizer)
    out.chat_template = tokenizer.chat_template.replace(HEADER, HEADER + block)
    return out


def target_of(tokenizer, thinking=None):
    return SimpleNamespace(tokenizer=tokenizer, name="tiny/qwen3-style", thinking=thinking)


def test_only_templates_that_read_enable_thinking_have_a_mode(chatml):
    assert not has_thinking(chatml) and thinking_mode(chatml, None) is None
    qwen = variant(chatml, OFF_BLOCK)
    assert has_thinking(qwen)
    assert thinking_mode(qwen, None) == "on"  # Qwen3's default: the empty think block only when off
    assert thinking_mode(variant(chatml, ON_BLOCK), None) == "off"  # a template that thinks only when asked
    assert (thinking_mode(qwen, True), thinking_mode(qwen, False)) == ("on", "off")


def test_a_mode_changes_the_rendered_prompt(chatml):
    qwen = variant(chatml, OFF_BLOCK)
    messages = [{"role": "user", "content": "Hi"}]
    off = qwen.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    on = qwen.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert off == on + "<think>\n\n</think>\n\n"
    assert chat_identity(target_of(qwen, False)) == {"template_hash": template_hash(qwen), "thinking": "off"}


@pytest.mark.parametrize("asked", [True, False])
def test_a_mode_the_template_lacks_is_bad_input_naming_it(chatml, asked):
    target = target_of(chatml)
    with pytest.raises(BadInputError, match="--thinking: got '(on|off)'.*has no enable_thinking variable"):
        use_thinking(target, asked)
    use_thinking(target, None)  # the default is always fine
    assert target.thinking is None


def record_for(tokenizer, mode):
    return {
        "target": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "template_hash": template_hash(tokenizer),
        "thinking": mode,
    }


def test_mismatch_names_both_sides_and_the_override_warns_instead(chatml):
    qwen = variant(chatml, OFF_BLOCK)
    record = record_for(qwen, "off")
    assert check_trained_for(record, target_of(qwen, False), "--draft eagle3:H") is None
    served = target_of(qwen, None)  # the default: thinking on
    h = template_hash(qwen)
    said = (
        f"head trained with chat template {h} (thinking off); tiny/qwen3-style renders chat template {h} "
        "(thinking on)"
    )
    with pytest.raises(BadInputError) as err:
        check_trained_for(record, served, "--draft eagle3:H")
    assert said in str(err.value) and "--thinking off" in str(err.value)
    assert str(err.value).startswith("--draft eagle3:H: got 'a head trained with chat template")
    warning = check_trained_for(record, served, "--draft eagle3:H", allow=True)
    assert said in warning and "--allow-template-mismatch" in warning
    assert check_trained_for(record, served, "--draft eagle3:H", chat=False) is None  # nothing rendered


def test_another_template_or_tokenizer(chatml):
    record = record_for(variant(chatml, OFF_BLOCK), "off")
    with pytest.raises(
        BadInputError, match=f"renders chat template {template_hash(chatml)}: serve it with the"
    ):
        check_trained_for(record, target_of(chatml), "--draft eagle3:H")
    other = {**record, "tokenizer_hash": "0" * 16}
    with pytest.raises(BadInputError, match="tokenizer 0000000000000000"):  # no override for other ids
        check_trained_for(other, target_of(chatml), "--draft eagle3:H", allow=True)


def test_record_in_a_head_config_is_stamped_read_and_not_a_config_field(chatml, tmp_path):
    from dataclasses import dataclass

    @dataclass
    class Config:
        head_type: str

    (tmp_path / "config.json").write_text(json.dumps({"head_type": "eagle3"}))
    assert read_trained_for(tmp_path) is None  # no record: nothing to check
    record = record_for(chatml, None)
    stamp(tmp_path, record)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert read_trained_for(tmp_path) == record == raw["trained_for"]
    assert config_from(raw, Config, "config.json") == Config("eagle3")  # the strict reader skips it
    with pytest.raises(BadInputError, match="trained_for.thinking: got 'maybe'"):
        record_in({"trained_for": {**record, "thinking": "maybe"}}, "config.json")
    with pytest.raises(BadInputError, match="trained_for: got \\['target'\\]"):
        record_in({"trained_for": {"target": "x"}}, "config.json")
