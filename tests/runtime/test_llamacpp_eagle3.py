"""llama.cpp's speculative decoding as a bench row (runtime/bench/llamacpp_spec.py,
runtime/bench/llamacpp_eagle3_method.py) without llama.cpp: names parse or are refused naming the field; the
tool's output parses into text, per-step counts and timers, and a changed output is an error, not a wrong
row; a fake tool exercises the command line, the prompt's round trip and the row. The real tool runs in
scripts/check_llamacpp.py (the interop step), against draftsmith's own accepted counts."""

import json
import stat
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.runtime.bench.llamacpp_eagle3_method import (
    LlamaCppEagle3Method,
    is_llamacpp_eagle3,
    parse_llamacpp_eagle3,
)
from draftsmith.runtime.bench.llamacpp_spec import parse_spec, spec_tool
from draftsmith.runtime.bench.types import is_baseline
from draftsmith.runtime.errors import BadInputError, DraftsmithError
from draftsmith.runtime.verify.sampling import SamplingParams

PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
LOG = """0.00.090.000 D spec        draft:  - seq_id 0, draft candidate   0, pos   0:     21 (   0.266) 'a'
0.00.090.000 D spec        draft:  - seq_id 0, draft candidate   1, pos   0:     99 (   0.183) 'z'
0.00.091.000 D spec        draft:  - seq_id 0, draft candidate   0, pos   1:     22 (   0.257) 'b'
0.00.100.000 D accepted 1/2 draft tokens, the last target token is: (12)
0.00.190.000 D spec        draft:  - seq_id 0, draft candidate   0, pos   0:     31 (   0.477) 'c'
0.00.191.000 D spec        draft:  - seq_id 0, draft candidate   0, pos   1:     32 (   0.477) 'd'
0.00.200.000 D accepted 0/2 draft tokens, the last target token is: (13)
0.00.290.000 D spec        draft:  - seq_id 0, draft candidate   0, pos   0:      3 (   0.477) 'e'
0.00.291.000 D spec        draft:  - seq_id 0, draft candidate   0, pos   1:      4 (   0.477) 'f'
0.00.300.000 D accepted 2/2 draft tokens, the last target token is: (14)
0.00.400.000 I encoded   11 tokens in    0.250 seconds, speed:   44.000 t/s
0.00.400.000 I decoded    9 tokens in    1.500 seconds, speed:    6.000 t/s
0.00.400.000 I n_draft   = 2
0.00.400.000 I n_predict = 9
0.00.400.000 I n_drafted = 6
0.00.400.000 I n_accept  = 3
"""


def test_names_parse_or_are_refused():
    assert parse_llamacpp_eagle3("llamacpp+eagle3:exports/h@chain:3") == (None, "exports/h", 3)
    assert parse_llamacpp_eagle3("llamacpp:t.F32.gguf+eagle3:h") == ("t.F32.gguf", "h", 2)
    assert is_llamacpp_eagle3("llamacpp+eagle3:h") and is_baseline("llamacpp+eagle3:h")
    assert is_baseline("llamacpp:t.gguf+eagle3:h@chain:2") and not is_llamacpp_eagle3("llamacpp:t.gguf")
    for bad in (
        "llamacpp+eagle3:",
        "llamacpp+eagle3:h@tree:3",
        "llamacpp:+eagle3:h",
        "llamacpp+eagle3:h@chain:0",
    ):
        with pytest.raises(BadInputError, match="--baselines"):
            parse_llamacpp_eagle3(bad)


def test_output_parses_into_text_steps_and_timers():
    run = parse_spec(f"\n\n{PROMPT}Hello there!\n\n\n\n", LOG, PROMPT)
    assert run.text == "Hello there!" and run.prompt_tokens == 11 and run.new_tokens == 9
    assert run.accepted == [1, 0, 2] and run.drafted == [2, 2, 2] and run.steps == 3
    assert (run.n_accept, run.n_drafted, run.encode_s, run.decode_s) == (3, 6, 0.25, 1.5)
    assert run.token_ids == [21, 12, 13, 3, 4, 14]  # each step: its accepted drafts, then its own token
    quiet = parse_spec(f"\n\n{PROMPT}Hello there!\n\n\n\n", LOG.split("\n", 10)[10], PROMPT, per_step=False)
    assert (
        quiet.accepted == [] and quiet.token_ids == [] and quiet.steps == 9 - 3
    )  # one verify forward per step: new - accepted


@pytest.mark.parametrize(
    "stdout, log, error",
    [
        ("\n\nanother prompt\n\n\n\n", LOG, "printed prompt differs"),
        (f"\n\n{PROMPT}x\n\n\n\n", LOG.replace("n_accept", "n_acc"), "no timers or counts"),
        (f"\n\n{PROMPT}x\n\n\n\n", LOG.replace("accepted 2/2", "accepted 1/2"), "do not add up"),
    ],
)
def test_a_changed_output_is_an_error(stdout, log, error):
    with pytest.raises(DraftsmithError, match=error):
        parse_spec(stdout, log, PROMPT)


def test_missing_tool_names_the_setup_command(tmp_path):
    with pytest.raises(BadInputError, match="setup_llamacpp.sh"):
        spec_tool(tmp_path)


FAKE_TOOL = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps(args) + "\\n")
prompt = args[args.index("-p") + 1]
sys.stdout.write("\\n\\n" + prompt + " one two three\\n\\n\\n\\n")
sys.stderr.write({log!r})
"""


def gguf_file(path: Path, file_type: int) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_file_type(file_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


class WordTokenizer:
    """Ids are word indices in a fixed list: enough to check the prompt's round trip."""

    words = ["<s>", "Hi"]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_a_fake_tool_makes_a_row(tmp_path, monkeypatch):
    setup = tmp_path / "setup"
    (setup / "bin").mkdir(parents=True)
    tool = setup / "bin" / "llama-speculative-simple"
    log = LOG.replace("encoded   11", "encoded    2")
    tool.write_text(textwrap.dedent(FAKE_TOOL.format(python=sys.executable, log=log)))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    target_file, head = gguf_file(tmp_path / "t.gguf", 7), tmp_path / "export"
    head.mkdir()
    gguf_file(head / "head.gguf", 0)
    target = SimpleNamespace(tokenizer=WordTokenizer(), path=str(tmp_path), eos_token_ids=[3])
    method = LlamaCppEagle3Method(f"llamacpp:{target_file}+eagle3:{head}@chain:3", target, setup=str(setup))
    assert method.facts["weights"] == "Q8_0" and method.facts["gguf"] == "t.gguf"
    assert method.unsupported(1, SamplingParams(temperature=1.0)) and method.unsupported(2, SamplingParams())
    out = method.run([[0, 1]], SamplingParams(), max_new_tokens=8, seed=5)
    assert out.token_ids == [[21, 12, 13, 3]]  # the log's ids, cut after the end-of-generation token 3
    assert method.run([[0, 1]], SamplingParams(), max_new_tokens=2, seed=5).token_ids == [[21, 12]]
    assert out.wall_s == pytest.approx(1.75) and out.target_forwards == 1 + 3
    assert (out.spec.cycles, out.spec.drafted_tokens, out.spec.accepted_tokens) == (3, 6, 3)
    args = json.loads(record.read_text().splitlines()[0])
    assert args[args.index("-p") + 1] == "<s> Hi" and args[args.index("--spec-draft-n-max") + 1] == "3"
    assert args[args.index("-n") + 1] == "7" and args[args.index("-md") + 1] == str(head / "head.gguf")
    assert args[args.index("-lv") + 1] == "5"  # debug logging: the ids
    assert args[args.index("--spec-draft-p-min") + 1] == "0" and args[args.index("--temp") + 1] == "0"
    with pytest.raises(DraftsmithError, match="tokenized the prompt into 2 tokens, not 3"):
        method.run([[0, 1, 1]], SamplingParams(), max_new_tokens=2, seed=5)
