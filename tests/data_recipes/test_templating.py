"""Loss-mask golden tests (as SpecForge's): the masked-in tokens decode to exactly the assistant texts
(plus the end-of-turn token), user and system text never enter the mask, multi-turn and system turns, for
the tiny template, SmolLM2's ChatML and Llama-3 / Gemma / Mistral-style templates; an explicit golden
ids/mask pair; templates that are not prefix-stable are refused; the mask shifts with the labels."""

import copy

import pytest
import torch
from tiny_models import tiny_tokenizer

from draftsmith.data_recipes.templating import (
    TemplateError,
    assistant_spans,
    render_and_mask,
    shift_for_training,
)

SYSTEM = "You answer in one line."
CONVERSATION = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "That makes 6, as you can check."},
    {"role": "user", "content": "Write a loop."},
    {"role": "assistant", "content": "for i in range(3):\n    print(i)"},
]
ANSWERS = [m["content"] for m in CONVERSATION if m["role"] == "assistant"]
PROMPTS = [m["content"] for m in CONVERSATION if m["role"] != "assistant"]

LLAMA3 = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
GEMMA = (  # Gemma folds the system turn into the first user turn and calls the assistant "model"
    "<bos>{% set offset = 0 %}{% if messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] + '\n\n' %}{% set offset = 1 %}"
    "{% else %}{% set first = '' %}{% endif %}"
    "{% for m in messages[offset:] %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ (first if loop.first else '') + m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
MISTRAL = (  # no generation prompt at all: the answer follows [/INST] directly
    "<s>{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}</s>{% endif %}{% endfor %}"
)
REAL_WORLD = {  # name -> (template, special tokens it needs, end-of-turn text)
    "llama3": (
        LLAMA3,
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|eot_id|>",
    ),
    "gemma": (GEMMA, ["<bos>", "<start_of_turn>", "<end_of_turn>"], "<end_of_turn>"),
    "mistral": (MISTRAL, ["<s>", "</s>"], "</s>"),
}


def masked_runs(enc) -> list[list[int]]:
    """Maximal runs of supervised token ids, one per answer."""
    runs, current = [], []
    for tok, m in zip(enc.input_ids, enc.loss_mask, strict=True):
        if m:
            current.append(tok)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def check_golden(tokenizer, messages, end_of_turn: str) -> None:
    enc = render_and_mask(tokenizer, messages)
    assert len(enc.input_ids) == len(enc.loss_mask)
    assert enc.input_ids == tokenizer(enc.text, add_special_tokens=False)["input_ids"]
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    runs = masked_runs(enc)
    assert [tokenizer.decode(r) for r in runs] == [a + end_of_turn for a in answers]
    unmasked = tokenizer.decode([t for t, m in zip(enc.input_ids, enc.loss_mask) if not m])
    for m in messages:
        if m["role"] != "assistant":
            assert m["content"] in unmasked  # every prompt text is there, and none of it is supervised
    assert enc.straddling == 0


# ---- the tiny word-level template ------------------------------------------------------------------


def test_tiny_template_golden_ids_and_mask():
    tok = tiny_tokenizer()  # ids: <unk> 0, <pad> 1, <eos> 2, <bos> 3, <|user|> 4, <|assistant|> 5, w_i 6+i
    messages = [
        {"role": "user", "content": "w1 w2"},
        {"role": "assistant", "content": "w3 w4"},
        {"role": "user", "content": "w5"},
        {"role": "assistant", "content": "w6"},
    ]
    enc = render_and_mask(tok, messages)
    assert enc.text == "<|user|> w1 w2 <|assistant|> w3 w4 <|user|> w5 <|assistant|> w6 "
    assert enc.input_ids == [4, 7, 8, 5, 9, 10, 4, 11, 5, 12]
    assert enc.loss_mask == [0, 0, 0, 0, 1, 1, 0, 0, 0, 1]
    # Spans are cut at their last non-space character: the template's trailing " " is glue.
    assert [enc.text[a:b] for a, b in enc.spans] == [" w3 w4", " w6"]


def test_tiny_template_multi_turn_with_system():
    tok = tiny_tokenizer()
    messages = [{"role": "system", "content": "w90 w91"}]
    for k in range(3):
        messages += [
            {"role": "user", "content": f"w{10 + k} w{20 + k}"},
            {"role": "assistant", "content": f"w{30 + k} w{40 + k} w{50 + k}"},
        ]
    enc = render_and_mask(tok, messages)
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [tok.decode(r) for r in masked_runs(enc)] == answers and len(answers) == 3
    supervised = {t for t, m in zip(enc.input_ids, enc.loss_mask) if m}
    prompts = [m["content"] for m in messages if m["role"] != "assistant"]
    prompt_ids = {tok.convert_tokens_to_ids(w) for text in prompts for w in text.split()}
    assert not supervised & prompt_ids


def test_boundary_straddling_tokens():
    """A token that begins in the header is prompt; one that begins in the answer is supervised."""
    tok = tiny_tokenizer()  # WhitespaceSplit: text glued without spaces becomes one (unknown) token
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}<|user|> {{ m['content'] }} "
        "{% else %}w90 {{ m['content'] }}w91 {% endif %}{% endfor %}"
        "{% if add_generation_prompt %}w90 {% endif %}"
    )
    messages = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2 w3"}]
    enc = render_and_mask(tok, messages)
    # "<|user|> w1 w90 w2 w3w91 ": the last word "w3w91" starts in the answer and runs into the template.
    assert enc.text == "<|user|> w1 w90 w2 w3w91 "
    assert tok.convert_ids_to_tokens(enc.input_ids) == ["<|user|>", "w1", "w90", "w2", "<unk>"]
    assert enc.loss_mask == [0, 0, 0, 1, 1] and enc.straddling == 0  # answer span is "w2 w3w91"

    tok.chat_template = tok.chat_template.replace("w90 {{ m['content'] }}", "w90{{ m['content'] }}").replace(
        "w90 {% endif %}", "w90{% endif %}"
    )
    enc = render_and_mask(tok, messages)
    # "w90w2" begins in the header: not supervised, and counted as straddling.
    assert enc.text == "<|user|> w1 w90w2 w3w91 "
    assert enc.loss_mask == [0, 0, 0, 1] and enc.straddling == 1


# ---- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template, what",
    [
        (  # announces the turn count up front: every earlier render changes when a turn is added
            "w{{ messages | length }} "
            "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}",
            "does not start with",
        ),
        (  # drops earlier answers' content (as reasoning templates do with <think> blocks)
            "{% for m in messages %}<|{{ m['role'] }}|> "
            "{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}{% endif %} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}",
            "whole conversation",
        ),
        (  # the generation prompt is not how an answer starts
            "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> w99{% endif %}",
            "plus the generation prompt",
        ),
        (  # answers are not written verbatim
            "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] | upper }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}",
            "does not contain the answer",
        ),
    ],
)
def test_template_not_prefix_stable_is_refused(template, what):
    tok = tiny_tokenizer()
    tok.chat_template = template
    messages = [
        {"role": "user", "content": "w1"},
        {"role": "assistant", "content": "w2"},
        {"role": "user", "content": "w3"},
        {"role": "assistant", "content": "w4"},
    ]
    with pytest.raises(TemplateError, match=what) as err:
        render_and_mask(tok, messages)
    assert err.value.field == "chat template" and err.value.exit_code == 2


def test_tokenizer_without_template_is_refused():
    tok = tiny_tokenizer()
    tok.chat_template = None
    with pytest.raises(TemplateError, match="a tokenizer with a chat template"):
        render_and_mask(tok, [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}])


def test_template_that_raises_is_explained():
    tok = tiny_tokenizer()
    tok.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="no system"):
        assistant_spans(tok, [{"role": "system", "content": "w1"}, {"role": "assistant", "content": "w2"}])


# ---- shifting ----------------------------------------------------------------------------------------


def test_shift_moves_the_mask_with_the_labels():
    ids, mask = [10, 11, 12, 13, 14], [0, 0, 1, 1, 0]
    inputs, labels, label_mask = shift_for_training(ids, mask)
    assert inputs == [10, 11, 12, 13] and labels == [11, 12, 13, 14] and label_mask == [0, 1, 1, 0]
    # Position 1 (the last prompt token) is trained to predict the first answer token, 12 (SpecForge #885).
    assert [lab for lab, m in zip(labels, label_mask) if m] == [t for t, m in zip(ids, mask) if m]

    batch_ids, batch_mask = torch.tensor([ids, ids]), torch.tensor([mask, mask])
    t_inputs, t_labels, t_mask = shift_for_training(batch_ids, batch_mask)
    assert t_inputs.tolist() == [inputs] * 2 and t_labels.tolist() == [labels] * 2
    assert t_mask.tolist() == [label_mask] * 2
    with pytest.raises(ValueError, match="loss_mask"):
        shift_for_training(ids, mask[:-1])
    with pytest.raises(ValueError, match="loss_mask"):
        shift_for_training(batch_ids, batch_mask[:, :-1])


def test_shift_on_a_rendered_conversation():
    tok = tiny_tokenizer()
    enc = render_and_mask(tok, [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2 w3"}])
    inputs, labels, label_mask = shift_for_training(enc.input_ids, enc.loss_mask)
    # <|user|> w1 <|assistant|> w2 w3: the position of <|assistant|> predicts w2, and w2 predicts w3.
    assert [
        (tok.convert_ids_to_tokens(i), tok.convert_ids_to_tokens(lab))
        for i, lab, m in zip(inputs, labels, label_mask)
        if m
    ] == [
        ("<|assistant|>", "w2"),
        ("w2", "w3"),
    ]


# ---- real tokenizers (SmolLM2's BPE) -----------------------------------------------------------------


def test_smollm2_chatml_golden(smollm2):
    tok = smollm2.tokenizer
    check_golden(tok, CONVERSATION, "<|im_end|>")
    enc = render_and_mask(tok, CONVERSATION)
    # The newline after <|im_end|> is template glue: the token right after each answer is unsupervised.
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ends = [t for t, (tok_id, m) in enumerate(zip(enc.input_ids, enc.loss_mask)) if m and tok_id == im_end]
    assert len(ends) == 3 and all(enc.loss_mask[t + 1] == 0 for t in ends)
    assert tok.decode([enc.input_ids[ends[0] + 1]]) == "\n"
    # Without a system turn the template adds its default one; it is never supervised either.
    check_golden(tok, CONVERSATION[1:], "<|im_end|>")
    assert "SmolLM" in render_and_mask(tok, CONVERSATION[1:]).text
    # An answer with leading spaces: "\n " straddles the header boundary and stays unsupervised.
    enc = render_and_mask(tok, [CONVERSATION[1], {"role": "assistant", "content": "  indented"}])
    assert enc.straddling == 1 and tok.decode(masked_runs(enc)[0]) == " indented<|im_end|>"


@pytest.mark.parametrize("name", sorted(REAL_WORLD))
def test_real_world_templates_golden(smollm2, name):
    template, specials, end_of_turn = REAL_WORLD[name]
    tok = copy.deepcopy(smollm2.tokenizer)
    tok.add_special_tokens({"additional_special_tokens": specials}, replace_extra_special_tokens=False)
    tok.chat_template = template
    check_golden(tok, CONVERSATION, end_of_turn)
    check_golden(tok, CONVERSATION[1:3], end_of_turn)
    if name == "gemma":  # the folded system text sits in the first user turn, unsupervised
        enc = render_and_mask(tok, CONVERSATION)
        assert enc.text.startswith(f"<bos><start_of_turn>user\n{SYSTEM}\n\n{PROMPTS[1]}<end_of_turn>")
