"""EAGLE-3 heads for the MoE, Gemma and MLA targets (runtime/core/families.py), end to end on each
family's tiny random model (tests/family_models.py, sharded safetensors folders; issue 24, item 2).

Per family:
- `data capture` (data_recipes/capture.py) on the tiny target: every prepared row is captured, and its
  stored aux and last hidden states equal the target's own forward over that row (fp32 storage, fp32
  rounding of the longest chain of sums as the bound).
- A 4-step offline EAGLE-3 run (the trainer's own prepare and capture, then TargetParts for the
  embedding and logits: Gemma's scaled embedding and soft-cap included) with finite losses.
- The trained head loads against its target and is refused (BadInputError on `target_model_type`;
  `draftsmith generate --draft` exits 2) against another family's tiny target, which shares the
  vocabulary, hidden size and tokenizer, so the family is the only thing told apart.
- Greedy speculative decoding with the trained head (a chain and a dynamic tree, batch 1 and 2) equals
  plain decoding with zero mismatches.
- Every export layout (draftsmith, official/SGLang, vLLM ids, speculators) names the verifier: its
  architecture (the target's own class: Gemma3ForConditionalGeneration for the vision-language one) and
  model_type (the text model's, which the head's hidden states come from), read from config.json; the
  folder reads back to the same tensors and is refused by another family's target. With no verifier
  folder at hand, the speculators verifier is the class transformers maps the head's model_type to.
- Gemma: the head's input norm makes the raw embedding table (what engines share) and the scaled one
  draftsmith trains on equivalent, to eps.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/train/test_family_heads.py -q    # ~15 s on 1 core
"""

import json
import math

import pytest
import torch
from engine_checks import make_prompts
from family_models import FAMILY_NAMES
from tiny_mla import mla_sums
from tolerances import model_sums, rounding_atol
from train_data import read_metrics, run_overrides

from draftsmith.data_recipes.capture import capture
from draftsmith.data_recipes.capture_reader import CaptureFolder
from draftsmith.data_recipes.prepare import prepare
from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.eagle3_drafter import eagle3_drafter
from draftsmith.runtime.errors import BadInputError
from draftsmith.runtime.heads.eagle3 import load_head
from draftsmith.runtime.heads.layouts import load_eagle3, to_speculators
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec
from draftsmith.train.config import load_train_config
from draftsmith.train.loop.trainer import train

AUX = [0, 1, 2]  # every family's tiny model has at least 3 decoder layers
# What transformers names each tiny model's class and text model_type: written here, not read from the
# folders, so an export that copied the wrong config would fail.
VERIFIER = {
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "mixtral": ("MixtralForCausalLM", "mixtral"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3_text": ("Gemma3ForCausalLM", "gemma3_text"),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "deepseek_v3"),
    "gemma3": ("Gemma3ForConditionalGeneration", "gemma3_text"),  # the text tower's hidden states
}
EXPORTS = {  # export flags -> where the layout's config.json keeps draftsmith's provenance
    "draftsmith": ([], None),
    "sglang": (["--format", "eagle3"], "draftsmith"),
    "vllm": (["--format", "eagle3", "--engine", "vllm"], "draftsmith"),
    "speculators": (["--format", "speculators"], "draftsmith"),
}


def other_family(name: str) -> str:
    """The next family in FAMILY_NAMES: its text model_type differs from `name`'s (gemma3 -> qwen3_moe)."""
    other = FAMILY_NAMES[(FAMILY_NAMES.index(name) + 1) % len(FAMILY_NAMES)]
    assert VERIFIER[other][1] != VERIFIER[name][1]
    return other


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def name(request):
    return request.param


@pytest.fixture(scope="module")
def target(family_dirs, name):
    return Target.load(str(family_dirs[name]), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def other_target(family_dirs, name):
    return Target.load(str(family_dirs[other_family(name)]), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def run_dir(family_dirs, name, source, tmp_path_factory):
    """A 4-step offline run on the family's target (float32 capture shards): its output folder."""
    root = tmp_path_factory.mktemp(f"run-{name}")
    out = root / "run"
    extra = ["train.max_steps=4", "train.ttt_steps=3", "eval.every=2", "checkpoint.every=0"]
    extra += ["data.mode=offline", "data.storage_dtype=float32"]
    train(load_train_config(None, run_overrides(family_dirs[name], source, root / "data", out, *extra)))
    return out


def capture_atol(target, want: torch.Tensor, vocab: bool = False) -> float:
    """fp32 rounding of the longest chain of sums (tests/tolerances.py) at the compared values' scale:
    the capture batches and pads rows, the reference runs each row alone (`vocab`: through the LM head)."""
    c = target.config
    if target.family.mla:  # mla_sums counts the LM head
        sums = mla_sums(c, seq=64)
    else:
        sums = model_sums(c.hidden_size, c.intermediate_size, c.num_hidden_layers, 64, vocab and c.vocab_size)
    return rounding_atol(torch.float32, sums, want.abs().max().item())


# ---- data capture ----------------------------------------------------------------------------------------
def test_capture_stores_the_targets_own_hidden_states(target, source, tmp_path):
    data, cap = tmp_path / "data", tmp_path / "cap"
    prepare(target, str(source), data, max_samples=6, max_length=64, validation_fraction=0.0, progress=False)
    record = capture(target, data, cap, AUX, "float32", "train", progress=False)
    rows = list(CaptureFolder(cap))
    assert len(rows) == 6 and record["outputs"]["rows"] == 6
    for row in rows[:3]:
        ids = torch.as_tensor(row["input_ids"])[None]  # [1, T]
        out = target.forward(ids, target.new_cache(1, ids.shape[1]), capture_layers=AUX)
        want_aux = torch.cat([out.aux[i] for i in AUX], dim=-1)[0]  # [T, 3H]
        assert row["aux_hidden"].shape == (ids.shape[1], 3 * target.hidden_size)
        torch.testing.assert_close(row["aux_hidden"], want_aux, atol=capture_atol(target, want_aux), rtol=0)
        want = out.hidden[0]  # [T, H] pre-norm output of the last layer
        torch.testing.assert_close(row["last_hidden"], want, atol=capture_atol(target, want), rtol=0)
        with torch.no_grad():  # what offline training reads as the target's logits: transformers' own
            hf = target.model(ids).logits[0]  # [T, V], Gemma 2's soft-cap included
        got = target.logits(row["last_hidden"])
        torch.testing.assert_close(got, hf, atol=capture_atol(target, hf, vocab=True), rtol=0)
        assert int(torch.as_tensor(row["loss_mask"]).sum()) > 0  # answers are trained on


# ---- a short run and the head it leaves ------------------------------------------------------------------
def test_a_short_offline_run_has_finite_losses(run_dir, target):
    rows, evals = read_metrics(run_dir), read_metrics(run_dir, "eval")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["step"] for r in evals] == [2, 4]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert all(math.isfinite(r["loss"]) for r in evals)
    config = json.loads((run_dir / "final" / "config.json").read_text())
    assert config["target_model_type"] == target.config.model_type == VERIFIER[target.family.name][1]


def test_the_head_loads_on_its_target_and_is_refused_by_another_family(run_dir, target, other_target):
    head = load_head(run_dir / "final", target)
    assert head.config.aux_layer_ids == AUX
    with pytest.raises(BadInputError, match="target_model_type"):
        load_head(run_dir / "final", other_target)


def test_the_cli_exits_2_for_a_head_of_another_family(run_dir, family_dirs, name, capsys):
    other = family_dirs[other_family(name)]
    code = main(["generate", "--target", str(other), "--draft", f"eagle3:{run_dir / 'final'}"]
                + ["--prompt", "w1 w2", "--max-new-tokens", "2", "--dtype", "float32"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "target_model_type" in err and VERIFIER[name][1] in err


def test_speculative_decoding_with_the_trained_head_is_greedy_identical(run_dir, target):
    head = load_head(run_dir / "final", target)
    prompts = make_prompts(2, seed=1)
    plain = generate_plain(target, prompts, SamplingParams(), max_new_tokens=12)
    for spec in ("chain:3", "dynamic:depth=3,topk=2,tokens=6"):
        drafter = eagle3_drafter(head, target, parse_tree_spec(spec))
        for batch in (1, 2):
            got = generate_speculative(target, drafter, prompts, SamplingParams(), 12, batch_size=batch)
            assert [r.token_ids for r in got] == [r.token_ids for r in plain], (spec, batch)  # 0 mismatches
            assert all(r.target_forwards == 1 + len(r.accepted_lengths) for r in got)


# ---- exports ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(EXPORTS))
def test_every_export_names_the_verifier(run_dir, family_dirs, name, target, other_target, tmp_path, layout):
    args, provenance = EXPORTS[layout]
    out = tmp_path / layout
    assert main(["export", str(run_dir), "--out", str(out), *args]) == 0
    config = json.loads((out / "config.json").read_text())
    architecture, model_type = VERIFIER[name]
    ours = config[provenance] if provenance else config
    assert ours["target"] == str(family_dirs[name]) and ours["target_model_type"] == model_type
    if layout == "speculators":
        assert config["speculators_config"]["verifier"] == {
            "name_or_path": str(family_dirs[name]),
            "architectures": [architecture],
        }
    if layout in ("sglang", "vllm"):  # the draft layer is Llama-shaped whatever the verifier
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    a, b = load_head(run_dir / "final").state_dict(), load_eagle3(str(out), target).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(BadInputError, match="target_model_type"):
        load_eagle3(str(out), other_target)


def test_a_verifier_not_on_this_machine_is_named_by_its_model_type(run_dir, name):
    """No local folder to read: the class transformers maps the head's model_type to (the vision-language
    gemma3 records its text model_type, so only a --verifier folder names Gemma3ForConditionalGeneration)."""
    config, _ = to_speculators(load_head(run_dir / "final"), verifier="org/not-on-this-machine")
    written = config["speculators_config"]["verifier"]["architectures"]
    assert written == (["Gemma3ForCausalLM"] if name == "gemma3" else [VERIFIER[name][0]])


def test_an_engine_sharing_gemmas_unscaled_embedding_table_drafts_the_same(run_dir, target):
    """vLLM's EAGLE loader hands the draft the target's `embed_tokens` module (vllm/v1/worker/gpu/
    spec_decode/eagle/utils.py), which need not apply Gemma's sqrt(hidden) scale (an engine may apply it
    in the model's forward), and speculators folders store the raw table, while draftsmith trains on the
    scaled embedding (transformers' `*TextScaledWordEmbedding`). The head reads the
    embedding only through `input_layernorm`, an RMSNorm: scale-invariant but for eps, so the two inputs
    agree to eps / (2 mean(x^2)) relative, plus fp32 rounding of the norm's H-term mean."""
    if target.family.embedding is None:
        pytest.skip("no embedding scale in this family")
    head = load_head(run_dir / "final", target)
    norm = head.midlayer.input_layernorm
    table = target.decoder.embed_tokens.weight  # [V, H] as the checkpoint stores it
    ids = table.abs().sum(-1).nonzero().flatten()[None]  # [1, V']: every token but the zero padding row
    raw, scaled = table[ids], target.embed(ids)  # [1, V', H] each
    with torch.no_grad():
        a, b = norm(raw), norm(scaled)
    mean_square = raw.pow(2).mean(-1).min().item()
    scale = b.abs().max().item()
    atol = scale * norm.variance_epsilon / (2 * mean_square) + rounding_atol(
        torch.float32, target.hidden_size + 4, scale
    )
    torch.testing.assert_close(a, b, atol=atol, rtol=0)
    assert (raw - scaled).abs().max().item() > 100 * atol  # without the norm the scale would count
