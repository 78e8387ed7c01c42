"""`data regenerate` on the tiny target: answers are the target's own (greedy identity with the engine),
multi-turn rounds see the regenerated history, seeded sampling does not depend on batch size, a killed
run resumes to the same result, a finished run is a no-op, and data for another tokenizer is refused."""

import json

import datasets
import pytest

from draftsmith.data_recipes import regenerate as regen
from draftsmith.data_recipes.common import read_record
from draftsmith.data_recipes.prepare import prepare
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.verify.sampling import SamplingParams

CONVERSATIONS = [
    [{"role": "user", "content": "w1 w2 w3"}, {"role": "assistant", "content": "w4 w5"}],
    [
        {"role": "user", "content": "w7"},
        {"role": "assistant", "content": "w8 w9"},
        {"role": "user", "content": "w10 w11"},
        {"role": "assistant", "content": "w12"},
    ],
    [{"role": "user", "content": "w20 w21 w22 w23"}, {"role": "assistant", "content": "w24"}],
    [{"role": "user", "content": "w30"}, {"role": "assistant", "content": "w31 w32 w33"}],
    [{"role": "user", "content": "w40 w41"}, {"role": "assistant", "content": "w42"}],
]


@pytest.fixture
def prepared(tmp_path, tiny_target):
    source = tmp_path / "conv.jsonl"
    source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    out = tmp_path / "prepared"
    prepare(tiny_target, str(source), out, max_length=256, validation_fraction=0.2, progress=False)
    return out


def messages_by_id(folder):
    ds = datasets.load_from_disk(str(folder))
    return {row["id"]: json.loads(row["messages"]) for split in ds for row in ds[split]}


def test_greedy_answers_are_the_targets_own(tiny_target, prepared, tmp_path):
    out = tmp_path / "regen"
    regen.regenerate(
        tiny_target, prepared, out, SamplingParams(), max_new_tokens=6, batch_size=2, progress=False
    )
    before, after = messages_by_id(prepared), messages_by_id(out)
    assert set(after) == set(before)
    for row_id, messages in after.items():
        assert [m["role"] for m in messages] == [m["role"] for m in before[row_id]]
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                assert m == before[row_id][i]  # user turns kept
                continue
            prompt = regen.chat_prompt_ids(tiny_target, messages[:i])  # history with regenerated answers
            [res] = generate_plain(tiny_target, [prompt], SamplingParams(), 6)
            tokens = [t for t in res.token_ids if t not in tiny_target.eos_token_ids]
            assert m["content"] == tiny_target.tokenizer.decode(tokens, skip_special_tokens=True)
    # Rows keep their split; the record names the sampling settings.
    src, new = datasets.load_from_disk(str(prepared)), datasets.load_from_disk(str(out))
    assert {s: sorted(src[s]["id"]) for s in src} == {s: sorted(new[s]["id"]) for s in new}
    record = read_record(out)
    assert record["step"] == "regenerate" and record["inputs"]["sampling"]["temperature"] == 0.0
    assert not (tmp_path / "regen.partial").exists()


def test_seeded_sampling_is_independent_of_batch_size(tiny_target, prepared, tmp_path):
    params = SamplingParams(temperature=1.0)
    runs = []
    for batch_size in (1, 3):
        out = tmp_path / f"regen-{batch_size}"
        regen.regenerate(tiny_target, prepared, out, params, 6, seed=4, batch_size=batch_size, progress=False)
        runs.append(messages_by_id(out))
    assert runs[0] == runs[1]
    other = tmp_path / "regen-other-seed"
    regen.regenerate(tiny_target, prepared, other, params, 6, seed=5, batch_size=3, progress=False)
    assert messages_by_id(other) != runs[0]


def test_batches_group_prompts_of_similar_length(tiny_target, prepared, tmp_path, monkeypatch):
    """Within a round, batches take the prompts shortest first (less padding in each static batch's
    prefill); the answers equal a batch-size-1 run's."""
    real, widths = regen.decode_batch, []

    def recording(target, prompts, *args, **kwargs):
        widths.append(sorted(len(p) for p in prompts))
        return real(target, prompts, *args, **kwargs)

    monkeypatch.setattr(regen, "decode_batch", recording)
    out = tmp_path / "sorted"
    regen.regenerate(tiny_target, prepared, out, SamplingParams(), 6, batch_size=2, progress=False)
    first_round = widths[:3]  # five conversations, one first turn each: batches of 2, 2, 1
    assert [len(w) for w in first_round] == [2, 2, 1]
    assert all(a[-1] <= b[0] for a, b in zip(first_round, first_round[1:]))
    flat = [n for w in first_round for n in w]
    assert flat == sorted(flat) and flat[0] < flat[-1]  # the prompts differ, so the order is a real check
    monkeypatch.setattr(regen, "decode_batch", real)
    one = tmp_path / "batch-1"
    regen.regenerate(tiny_target, prepared, one, SamplingParams(), 6, batch_size=1, progress=False)
    assert messages_by_id(out) == messages_by_id(one)


def test_killed_run_resumes_to_the_same_result(tiny_target, prepared, tmp_path, monkeypatch):
    params = SamplingParams(temperature=1.0)
    straight = tmp_path / "straight"
    regen.regenerate(tiny_target, prepared, straight, params, 6, seed=1, batch_size=2, progress=False)

    real, calls = regen.decode_batch, []

    def dies_on_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    out = tmp_path / "resumed"
    monkeypatch.setattr(regen, "decode_batch", dies_on_third_batch)
    with pytest.raises(KeyboardInterrupt):
        regen.regenerate(tiny_target, prepared, out, params, 6, seed=1, batch_size=2, progress=False)
    assert read_record(out) is None and len(list((tmp_path / "resumed.partial").glob("answers-*"))) == 2
    monkeypatch.setattr(regen, "decode_batch", real)
    regen.regenerate(tiny_target, prepared, out, params, 6, seed=1, batch_size=2, progress=False)
    assert messages_by_id(out) == messages_by_id(straight)
    a, b = datasets.load_from_disk(str(out)), datasets.load_from_disk(str(straight))
    for split in a:
        assert (
            a[split]["input_ids"] == b[split]["input_ids"] and a[split]["loss_mask"] == b[split]["loss_mask"]
        )


def test_finished_run_is_a_noop(tiny_target, prepared, tmp_path, monkeypatch):
    out = tmp_path / "regen"
    regen.regenerate(tiny_target, prepared, out, SamplingParams(), 4, progress=False)
    stamp = (out / "draftsmith_data.json").stat().st_mtime_ns
    monkeypatch.setattr(regen, "decode_batch", lambda *a, **k: pytest.fail("should not generate"))
    regen.regenerate(tiny_target, prepared, out, SamplingParams(), 4, progress=False)
    assert (out / "draftsmith_data.json").stat().st_mtime_ns == stamp


def test_bad_inputs(tiny_target, prepared, tmp_path):
    with pytest.raises(BadInputError, match="--data"):
        regen.regenerate(tiny_target, tmp_path / "nowhere", tmp_path / "o", SamplingParams(), progress=False)
    with pytest.raises(BadInputError, match="--batch-size"):
        regen.regenerate(
            tiny_target, prepared, tmp_path / "o", SamplingParams(), batch_size=0, progress=False
        )
    with pytest.raises(BadInputError, match="temperature"):
        regen.regenerate(
            tiny_target, prepared, tmp_path / "o", SamplingParams(temperature=-1), progress=False
        )
    record = json.loads((prepared / "draftsmith_data.json").read_text())
    record["inputs"]["fingerprint"]["tokenizer_hash"] = "0" * 16
    (prepared / "draftsmith_data.json").write_text(json.dumps(record))
    with pytest.raises(BadInputError, match="tokenizer_hash"):
        regen.regenerate(tiny_target, prepared, tmp_path / "o", SamplingParams(), progress=False)


def test_cli_regenerate(tiny_dir, prepared, tmp_path, capsys):
    from draftsmith.runtime.cli.main import main

    argv = ["data", "regenerate", "--target", str(tiny_dir), "--data", str(prepared), "--max-new-tokens", "4"]
    assert main([*argv, "--out", str(tmp_path / "regen")]) == 0
    assert read_record(tmp_path / "regen")["step"] == "regenerate"
    assert main([*argv, "--out", str(tmp_path / "bad"), "--batch-size", "0"]) == 2
    assert "--batch-size" in capsys.readouterr().err


def test_prompt_lists_get_answers(tiny_target, tmp_path):
    """prompts:FILE rows carry an empty assistant placeholder; regenerate fills it and supervises it."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2\nw3 w4 w5\nw6\n")
    prepare(
        tiny_target,
        f"prompts:{prompts}",
        tmp_path / "p",
        max_length=128,
        validation_fraction=0.0,
        progress=False,
    )
    regen.regenerate(tiny_target, tmp_path / "p", tmp_path / "r", SamplingParams(), 5, progress=False)
    after = datasets.load_from_disk(str(tmp_path / "r"))
    rows = [row for split in after for row in after[split]]
    assert len(rows) == 3
    for row in rows:
        messages = json.loads(row["messages"])
        assert messages[-1]["role"] == "assistant" and messages[-1]["content"]
        assert row["num_supervised"] > 0


def test_answers_left_by_other_inputs_are_not_reused(tiny_target, prepared, tmp_path):
    """A partial folder from a run with other inputs (another seed, length, ...) starts over."""
    straight = tmp_path / "straight"
    regen.regenerate(tiny_target, prepared, straight, SamplingParams(), 4, progress=False)
    row_id = next(iter(messages_by_id(prepared)))
    partial = tmp_path / "other.partial"
    partial.mkdir()
    (partial / "inputs.json").write_text("{}")
    bogus = {"id": row_id, "index": regen.assistant_turns(messages_by_id(prepared)[row_id])[0], "text": "w99"}
    (partial / "answers-00000.jsonl").write_text(json.dumps(bogus) + "\n")
    regen.regenerate(tiny_target, prepared, tmp_path / "other", SamplingParams(), 4, progress=False)
    assert messages_by_id(tmp_path / "other") == messages_by_id(straight)


# A conversation whose SECOND turn's prompt outgrows the tiny target's 256-token context (a long user
# turn after the first answer); prepare keeps it (clipped after its first, supervised, answer).
TOO_LONG = [
    {"role": "user", "content": "w1"},
    {"role": "assistant", "content": "w4 w5"},
    {"role": "user", "content": " ".join(["w9"] * 260)},
    {"role": "assistant", "content": "w6"},
    {"role": "user", "content": "w7"},
    {"role": "assistant", "content": "w8"},
]


def test_a_turn_that_does_not_fit_leaves_its_conversation_out(tiny_target, tmp_path):
    """A non-final turn that does not fit: its later turns are not asked (no KeyError on the missing
    answer), the row is left out and counted once, as the vLLM path does; every other row is what a run
    without that conversation makes."""

    def run(conversations, name):
        source = tmp_path / f"{name}.jsonl"
        source.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations))
        prepared = tmp_path / f"{name}-prepared"
        prepare(tiny_target, str(source), prepared, max_length=256, validation_fraction=0.0, progress=False)
        assert read_record(prepared)["summary"]["kept"] == len(conversations)
        out = tmp_path / f"{name}-regen"
        done = regen.regenerate(tiny_target, prepared, out, SamplingParams(), 6, batch_size=2, progress=False)
        return done["summary"], sorted(json.dumps(m) for m in messages_by_id(out).values())

    summary, rows = run(CONVERSATIONS[:2] + [TOO_LONG] + CONVERSATIONS[2:], "with")
    assert summary["dropped"] == {"prompt longer than the target's context": 1}
    assert summary["kept"] == len(CONVERSATIONS)
    base, want = run(CONVERSATIONS, "without")
    assert rows == want and base["dropped"] == {}
