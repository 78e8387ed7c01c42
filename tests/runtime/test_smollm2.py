"""Integration on the embedded SmolLM2-135M (fp32): `draftsmith generate --json` emits exactly the tokens
transformers `generate(do_sample=False)` emits continuing `prompt_token_ids`, on 20 varied prompts one
at a time and in a batch of 8 (left padding). Zero mismatches allowed."""

import json

import pytest

from draftsmith.runtime.bench.side_by_side import hf_generate, hf_generate_batch
from draftsmith.runtime.cli.main import main

PROMPTS = [
    "What is 2+2?",
    "Write a haiku about autumn leaves.",
    "Explain recursion to a beginner.",
    "List three uses of baking soda.",
    "def is_prime(n):",
    "Translate 'good morning' into Spanish and German.",
    "Why do cats purr?",
    "Give me a name for a coffee shop.",
    "Summarize the causes of World War I in two sentences.",
    "What is the capital of Australia?",
    "Write a SQL query that counts rows in a table called users.",
    "How do vaccines work?",
    "Tell me a joke about programmers.",
    "What is the difference between weather and climate?",
    "Suggest a healthy breakfast.",
    "Describe the color blue to someone who cannot see.",
    "How many legs does a spider have?",
    "Write the first line of a mystery novel.",
    "What does HTTP stand for?",
    "Explain what a black hole is.",
]
MAX_NEW = 32


def generate_json(tmp_path, capsys, prompts, batch_size):
    path = tmp_path / f"prompts-{batch_size}.txt"
    path.write_text("\n".join(prompts) + "\n")
    argv = [
        "generate",
        "--target",
        "smollm2-135m",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--prompts",
        str(path),
    ]
    code = main(
        [
            *argv,
            "--temperature",
            "0",
            "--max-new-tokens",
            str(MAX_NEW),
            "--batch-size",
            str(batch_size),
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    return [json.loads(line) for line in out.out.splitlines()]


def test_greedy_identity_20_prompts(smollm2, tmp_path, capsys):
    rows = generate_json(tmp_path, capsys, PROMPTS, batch_size=1)
    assert len(rows) == 20
    mismatches = [
        (i, row["token_ids"], expected)
        for i, row in enumerate(rows)
        if row["token_ids"] != (expected := hf_generate(smollm2, row["prompt_token_ids"], MAX_NEW))
    ]
    assert mismatches == []
    assert rows[0]["prompt_token_ids"] == smollm2.encode(PROMPTS[0])
    assert all(row["new_tokens"] > 0 and row["text"] for row in rows)


def test_greedy_identity_batch_of_8(smollm2, tmp_path, capsys):
    batch = PROMPTS[:8]
    rows = generate_json(tmp_path, capsys, batch, batch_size=8)
    prompt_ids = [row["prompt_token_ids"] for row in rows]
    assert len({len(p) for p in prompt_ids}) > 1, "prompts of different lengths exercise the padding"
    expected = hf_generate_batch(smollm2, prompt_ids, MAX_NEW)
    assert [row["token_ids"] for row in rows] == expected
    for row in rows:
        assert len(row["token_ids"]) == MAX_NEW or row["token_ids"][-1] in smollm2.eos_token_ids
    # Padded rows give the same tokens as unpadded ones (each prompt alone).
    for row in rows:
        assert row["token_ids"] == hf_generate(smollm2, row["prompt_token_ids"], MAX_NEW)


SPECULATIVE = [
    ("ngram", "chain:4", 1),
    ("self:layers=27", "dynamic:depth=3,topk=2,tokens=6", 8),
    ("self:layers=24", "chain:3", 1),
    ("model:smollm2-135m", "static:binary-3", 3),  # the target drafting for itself: all accepted
]


def test_speculative_greedy_identity(smollm2):
    """Every drafter, chain / static / dynamic trees, batch 1 and ragged batches: zero mismatches
    against plain greedy decoding on the real model."""
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.core.speculative import generate_speculative
    from draftsmith.runtime.drafters.drafting import build_drafter
    from draftsmith.runtime.verify.sampling import SamplingParams
    from draftsmith.runtime.verify.tree import parse_tree_spec

    prompts = [smollm2.encode(p) for p in PROMPTS[:8]]
    plain = [r.token_ids for r in generate_plain(smollm2, prompts, SamplingParams(), MAX_NEW)]
    for draft, tree, batch_size in SPECULATIVE:
        drafter = build_drafter(draft, smollm2, parse_tree_spec(tree))
        results = generate_speculative(
            smollm2, drafter, prompts, SamplingParams(), MAX_NEW, batch_size=batch_size
        )
        mismatches = [i for i, (r, ref) in enumerate(zip(results, plain)) if r.token_ids != ref]
        assert mismatches == [], f"{draft} {tree} batch {batch_size}: rows {mismatches} differ"
        tau = sum(r.new_tokens for r in results) / sum(r.target_forwards for r in results)
        assert tau > (2.5 if draft.startswith("model") else 1.0), f"{draft} {tree}: tau {tau:.2f}"


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 7])
@pytest.mark.parametrize("draft", ["ngram", "self:layers=27"])
def test_speculative_greedy_identity_chain_grid(smollm2, draft, batch_size):
    """Chains K = 1..8 and three trees (one dynamic) on the real model, 7 prompts: zero mismatches."""
    from draftsmith.runtime.core.engine import generate_plain
    from draftsmith.runtime.core.speculative import generate_speculative
    from draftsmith.runtime.drafters.drafting import build_drafter
    from draftsmith.runtime.verify.sampling import SamplingParams
    from draftsmith.runtime.verify.tree import parse_tree_spec

    prompts = [smollm2.encode(p) for p in PROMPTS[8:15]]
    plain = [r.token_ids for r in generate_plain(smollm2, prompts, SamplingParams(), 24)]
    trees = [f"chain:{k}" for k in range(1, 9)] + ["dynamic:depth=4,topk=2,tokens=8"]
    if draft != "ngram":
        trees += ["static:binary-3", "static:wide-4"]
    for tree in trees:
        drafter = build_drafter(draft, smollm2, parse_tree_spec(tree))
        results = generate_speculative(smollm2, drafter, prompts, SamplingParams(), 24, batch_size=batch_size)
        assert [r.token_ids for r in results] == plain, f"{draft} {tree} batch {batch_size}"
