"""P-EAGLE exports (runtime/heads/peagle_kind.py): speculators' `peagle` folder and vLLM's own EAGLE-3 +
parallel-drafting folder, written by `draftsmith export`, read back to the identical head; speculators 0.9.0
loads ours as its own PEagleDraftModel (every draft tensor, nothing missing or unexpected) and its own
forward gives our logits at every (anchor, depth) of the block; vLLM's config reader (slow: its Python)
turns ours into EAGLE-3 with parallel drafting and the mask token; bad requests exit 2.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_peagle_export.py -q
"""

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from peagle_heads import AUX, random_head
from safetensors.torch import load_file
from tolerances import layer_accumulations, rounding_atol

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.peagle import save_head
from draftsmith.runtime.heads.peagle_kind import read_any
from draftsmith.train.objectives.peagle_objective import block_outputs

# speculators 0.9.0 passes `past_key_values` to transformers 5.24's LlamaAttention (renamed `cache`).
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
K = 3
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return Target.load(str(tiny_dir), device="cpu")


@pytest.fixture(scope="module")
def head(tiny):
    head = random_head(tiny, block_size=K, mask_token_id=5, draft_vocab_size=64)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(torch.arange(0, 128, 2))  # draft id i stands for target id 2i
    return head.eval()


@pytest.fixture(scope="module")
def exports(head, tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("peagle-export")
    save_head(head, root / "head")
    for fmt in ("speculators", "vllm"):
        argv = ["export", str(root / "head"), "--format", fmt, "--out", str(root / fmt)]
        assert main([*argv, "--verifier", str(tiny_dir), "--num-speculative-tokens", str(K)]) == 0
    return root


@pytest.mark.parametrize("fmt", ["speculators", "vllm"])
def test_export_reads_back_to_the_same_head(head, tiny, exports, fmt):
    back = read_any(str(exports / fmt), tiny)
    assert back.config == head.config
    for name, tensor in head.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    tensors = load_file(str(exports / fmt / "model.safetensors"))
    embed = tensors["embed_tokens.weight"]
    assert torch.equal(embed[5], head.mask_embed.detach())  # the learned mask embedding, at mask_token_id
    others = torch.ones(len(embed), dtype=torch.bool)
    others[5] = False
    assert torch.equal(embed[others], tiny.embed(torch.arange(128))[others])  # the rest: the target's
    assert tensors["mask_hidden"].shape == (1, 1, len(AUX) * 64) and "mask_embed" not in tensors
    assert ("layers.0.self_attn.q_proj.weight" in tensors) == (fmt == "speculators")
    assert torch.equal(torch.arange(64) + tensors["d2t"], torch.arange(0, 128, 2))  # target id = draft + d2t


def test_config_keys_vllm_and_speculators_read(exports):
    spec = json.loads((exports / "speculators" / "config.json").read_text())
    assert spec["speculators_model_type"] == "peagle" and spec["speculators_config"]["algorithm"] == "peagle"
    assert spec["mask_token_id"] == 5 and spec["norm_before_residual"] is False
    assert spec["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in AUX]  # vLLM's input-of-layer ids
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    assert spec["target_hidden_size"] == 64 and spec["transformer_layer_config"]["model_type"] == "llama"
    own = json.loads((exports / "vllm" / "config.json").read_text())
    assert own["architectures"] == ["LlamaForCausalLMEagle3"] and own["mask_token_id"] == 5
    assert own["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in AUX]


def test_bad_export_requests_exit_2(exports, tmp_path, capsys):
    head = str(exports / "head")
    too_many = ["export", head, "--format", "speculators", "--out", str(tmp_path / "a")]
    assert main([*too_many, "--num-speculative-tokens", str(K + 1)]) == 2
    assert "block_size=3" in capsys.readouterr().err
    no_embedding = ["export", head, "--format", "vllm", "--out", str(tmp_path / "b"), "--verifier", "org/x"]
    assert main(no_embedding) == 2
    assert "embed_tokens" in capsys.readouterr().err
    assert main(["export", head, "--format", "mtp", "--out", str(tmp_path / "c")]) == 2
    assert "a format for a peagle head" in capsys.readouterr().err


def test_an_eagle3_speculators_folder_is_not_read_as_peagle(exports, tmp_path, tiny):
    from draftsmith.runtime.errors import BadInputError

    folder = tmp_path / "e3"
    folder.mkdir()
    config = json.loads((exports / "speculators" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "speculators_model_type": "eagle3"}))
    with pytest.raises(BadInputError, match="speculators_model_type"):
        read_any(str(folder), tiny)


# ---- speculators' own classes ---------------------------------------------------------------------------
speculators = pytest.importorskip("speculators")


class Stop(Exception):
    pass


def test_speculators_loads_it_as_its_peagle_model_with_our_logits(head, tiny, exports, monkeypatch):
    """PARITY in fp32 (tests/tolerances.py) against speculators' own forward (its training pass: the COD
    sampler keeps a random share of the anchors per depth, recorded here): every row its lm_head sees,
    an (anchor, depth) pair of the block, has our logits there."""
    import logging

    folder = str(exports / "speculators")
    config = speculators.SpeculatorModelConfig.from_pretrained(folder)
    assert type(config).__name__ == "PEagleSpeculatorConfig" and config.mask_token_id == 5
    config.transformer_layer_config._attn_implementation = "eager"
    reports: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: reports.append(record.getMessage())
    logging.getLogger("transformers.modeling_utils").addHandler(handler)
    try:
        model = speculators.SpeculatorModel.from_pretrained(folder, config=config).eval()
    finally:
        logging.getLogger("transformers.modeling_utils").removeHandler(handler)
    assert type(model).__name__ == "PEagleDraftModel"
    assert [m for m in reports if "LOAD REPORT" in m] == []  # nothing missing, unexpected or mismatched
    tensors = load_file(str(exports / "speculators" / "model.safetensors"))
    theirs = model.state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(theirs[name], tensor), name
    length = 7
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(6, 100, (1, length), generator=g)  # pair t's token (t+1 in ours)
    aux = torch.randn(1, length, len(AUX) * 64, generator=g)
    loss_mask = torch.ones(1, length)
    loss_mask[0, 0] = 0  # as a prompt's first token: no anchor before position 0
    ids = torch.cat([torch.zeros(1, 1, dtype=torch.long), tokens], dim=1)  # ours: token t+1 at t
    with torch.no_grad():
        ours = head.draft_logits(block_outputs(head, tiny.embed, ids, torch.cat([aux, aux[:, :1]], 1), K))
    sums = 3 * 64 + layer_accumulations(64, 128, K * length) + 2 * 64
    atol = rounding_atol(torch.float32, sums, ours.abs().max().item())
    rows, anchor, depth = their_rows(model, tokens, aux, loss_mask, monkeypatch)
    assert sorted(set(depth.tolist())) == list(range(K))  # every depth of the block is in the comparison
    torch.testing.assert_close(
        rows, ours[depth, 0, anchor], atol=atol, rtol=0
    )  # in their (depth, anchor) order
    model.mask_token_id = 6  # the control: another mask row gives other logits at every depth >= 1
    rows, anchor, depth = their_rows(model, tokens, aux, loss_mask, monkeypatch)
    masked = depth > 0
    assert ((rows[masked] - ours[depth, 0, anchor][masked]).abs().amax(-1) > 100 * atol).all()


def their_rows(model, tokens, aux, loss_mask, monkeypatch):
    """speculators' training forward up to its lm_head -> (its logits [N, Vd], anchors [N], depths [N])."""
    from speculators.models.peagle import core as peagle_core

    seen, sampled = [], []

    def stop(module, args, out):  # its loss after lm_head is a Triton kernel (no CPU driver): stop there
        seen.append(out)
        raise Stop

    real = peagle_core.generate_cod_sample_indices

    def recording(*args, **kwargs):  # its COD sampler draws which anchors each depth keeps: record them
        sampled.append(real(*args, **kwargs))
        return sampled[-1]

    monkeypatch.setattr(peagle_core, "generate_cod_sample_indices", recording)
    hook = model.lm_head.register_forward_hook(stop)
    length = tokens.shape[1]
    last = torch.randn(1, length, 64)  # the verifier's last states (its loss target; never reached)
    try:
        with torch.no_grad(), pytest.raises(Stop):
            model(
                hidden_states=aux, input_ids=tokens, document_ids=torch.zeros_like(tokens),
                position_ids=torch.arange(length)[None], verifier_last_hidden_states=last,
                loss_mask=loss_mask, num_depths=K, down_sample_ratio=1.0, down_sample_ratio_min=1.0,
            )  # fmt: skip
    finally:
        hook.remove()
    ((anchor, depth),) = sampled
    return seen[0][0], anchor, depth


@pytest.mark.slow
def test_vllm_reads_it_as_eagle3_with_parallel_drafting(exports):
    python = REPO / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-vllm")
    script = textwrap.dedent(
        f"""
        import json
        from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
        folder = {str(exports / "speculators")!r}
        raw = json.load(open(folder + "/config.json"))
        cfg = SpeculatorsConfig.from_pretrained(folder)
        spec = SpeculatorsConfig.extract_vllm_speculative_config(raw)
        keys = ("architectures", "pard_token", "draft_vocab_size", "norm_before_residual",
                "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
        print(json.dumps({{"spec": spec, **{{k: getattr(cfg, k, None) for k in keys}}}}))
        """
    )
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["spec"] == {"method": "eagle3", "num_speculative_tokens": K, "parallel_drafting": True}
    assert got["architectures"] == ["PeagleLlamaForCausalLM"] and got["pard_token"] == 5
    assert got["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in AUX]
    assert got["norm_before_residual"] is False and got["target_hidden_size"] == 64
    assert got["draft_vocab_size"] == 64
