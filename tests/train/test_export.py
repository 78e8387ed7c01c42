"""`draftsmith export` end to end on tiny heads: every format writes a folder that `--draft` reads back to
the same tensors, with a model card whose metadata parses and whose numbers come from the files given;
the MTP DeepSeek layout loads as the plain target and drafts with greedy identity; pushing to the Hub
(mocked) creates the repo, branch and one upload; bad requests exit 2 and leave nothing behind."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from tiny_models import make_tiny_dir, random_prompts

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.speculative import generate_speculative
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.drafters.drafting import build_drafter
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head, save_head
from draftsmith.runtime.heads.layouts import load_eagle3
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead
from draftsmith.runtime.heads.mtp import save_head as save_mtp
from draftsmith.runtime.verify.sampling import SamplingParams
from draftsmith.runtime.verify.tree import parse_tree_spec


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_tiny_dir(tmp_path_factory.mktemp("target") / "tiny")


@pytest.fixture(scope="module")
def target(target_dir):
    return Target.load(str(target_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def run_dir(target, tmp_path_factory):
    """A run folder as the trainer leaves it: config.yaml, metrics.jsonl, final/."""
    run = tmp_path_factory.mktemp("runs") / "eagle3-tiny"
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    head.set_draft_vocab(torch.arange(0, 128, 2))
    save_head(head, run / "final")
    config = {"data": {"source": "sharegpt", "max_samples": 10, "max_length": 64, "mode": "online"}}
    config["train"] = {"max_steps": 3, "batch_size": 2, "grad_accum": 1, "lr": 1e-3}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    evals = {"kind": "eval", "step": 3, "accuracy_per_step": [0.25, 0.125], "simulated_tau": 1.3}
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 3}) + "\n" + json.dumps(evals))
    bench = {"date": "2026-11-30", "machine": "x86_64", "threads": 2, "prompt_set": "sharegpt", "rows": [
        {"method": "plain", "temperature": 0.0, "tokens_per_s": 10.0, "speedup_vs_plain": 1.0},
        {"method": f"eagle3:{run / 'final'}@chain:2", "temperature": 0.0, "tokens_per_s": 12.5,
         "speedup_vs_plain": 1.25, "mean_accepted": 1.6, "accept_rate_per_position": [0.5, 0.1]},
        {"method": "eagle3:elsewhere@chain:2", "temperature": 0.0, "tokens_per_s": 99.0},
    ]}  # fmt: skip
    (run / "bench.json").write_text(json.dumps(bench))
    return run


def card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    _, meta, body = text.split("---\n", 2)
    return yaml.safe_load(meta), body


@pytest.mark.parametrize(
    ("args", "layout_key"),
    [
        ([], "head_type"),
        (["--format", "eagle3"], "eagle_config"),
        (["--format", "eagle3", "--engine", "vllm"], "eagle_config"),
        (["--format", "speculators"], "speculators_config"),
    ],
)
def test_every_format_reads_back_with_a_card(run_dir, target, tmp_path, args, layout_key):
    out = tmp_path / "export"
    bench = run_dir / "bench.json"
    assert main(["export", str(run_dir), "--out", str(out), "--bench", str(bench), *args]) == 0
    config = json.loads((out / "config.json").read_text())
    assert layout_key in config
    original, exported = load_eagle3(str(run_dir / "final"), target), load_eagle3(str(out), target)
    a, b = original.state_dict(), exported.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    meta, body = card(out)
    assert meta["base_model"] == str(Path(target.name)) and meta["license"] == "other"
    assert "speculative-decoding" in meta["tags"] and meta["datasets"]
    assert "| 1 | 12.5 | 1.25 | 1.6 | [0.5, 0.1] |" in body and "99.0" not in body
    assert "simulated tau 1.3" in body and "up to 10 conversations" in body
    if "speculators" in args:  # like speculators' own files: the verifier's embedding and architectures
        from safetensors.torch import load_file

        embed = load_file(str(out / "model.safetensors"))["embed_tokens.weight"]
        assert torch.equal(embed, target.model.model.embed_tokens.weight)
        assert config["speculators_config"]["verifier"] == {
            "name_or_path": target.name,
            "architectures": ["LlamaForCausalLM"],
        }
    if "--engine" in args:
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
        assert "vllm serve" in body and "--speculative-algorithm EAGLE3" in body
    assert not list(tmp_path.glob(".export*"))  # the temporary folder is gone


def test_vllm_check_goes_into_the_card(run_dir, tmp_path):
    run = {"loaded": True, "drafts": 223, "accepted_per_pos": [54, 5], "tau": 1.2646}
    greedy = [{"pair": "eagle3 vs draftsmith", "mismatching_prompts": 0}]
    summary = {"vllm_version": "0.32.0", "prompts": 6, "max_tokens": 48, "k": 2, "draftsmith": run,
               "runs": {"eagle3": run}, "greedy": greedy}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "export"
    args = ["--format", "eagle3", "--engine", "vllm", "--num-speculative-tokens", "2"]
    assert (
        main(
            ["export", str(run_dir), "--out", str(out), "--vllm-check", str(tmp_path / "summary.json"), *args]
        )
        == 0
    )
    body = card(out)[1]
    assert "Served by vLLM 0.32.0" in body and "| vLLM eagle3 | yes | 223 | [54, 5] | 1.2646 |" in body
    assert "between any two of them: 0 prompts" in body and '"num_speculative_tokens": 2' in body


def test_existing_exports_are_kept_unless_overwrite(run_dir, tmp_path, capsys):
    out = tmp_path / "export"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(run_dir), "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "keep.txt").exists()
    assert main(["export", str(run_dir), "--out", str(out), "--overwrite"]) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--format", "onnx"], "--format"),
        (["--format", "mtp"], "--format"),  # an EAGLE-3 head has no MTP layout
        (["--format", "eagle3", "--engine", "trt"], "--engine"),
        (["--push-to-hub", "not a repo"], "--push-to-hub"),
        (["--bench", "missing.json"], "--bench"),
        (["--num-speculative-tokens", "0"], "--num-speculative-tokens"),
    ],
)
def test_bad_requests_exit_2_naming_the_field(run_dir, tmp_path, capsys, args, field):
    out = tmp_path / "export"
    assert main(["export", str(run_dir), "--out", str(out), *args]) == 2
    assert field in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_bench_without_this_head_and_bad_checkpoint(run_dir, tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [{"method": "plain"}, {"method": "eagle3:elsewhere@chain:2"}]}))
    assert main(["export", str(run_dir), "--out", str(tmp_path / "x"), "--bench", str(other)]) == 2
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "y")]) == 2
    assert "CHECKPOINT" in capsys.readouterr().err


class FakeHfApi:
    calls: list = []
    fail = False

    def create_repo(self, repo_id, private=False, exist_ok=False, repo_type=None):
        if self.fail:
            raise OSError("Invalid user token.")
        self.calls.append(("create_repo", repo_id, private, exist_ok))

    def create_branch(self, repo_id, branch, exist_ok=False):
        self.calls.append(("create_branch", repo_id, branch))

    def upload_folder(self, folder_path, repo_id, revision=None, commit_message=""):
        files = sorted(p.name for p in Path(folder_path).iterdir())
        self.calls.append(("upload_folder", repo_id, revision, files))


def test_push_to_hub_mocked(run_dir, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    FakeHfApi.calls = []
    out = tmp_path / "export"
    args = [
        "export",
        str(run_dir),
        "--format",
        "eagle3",
        "--out",
        str(out),
        "--push-to-hub",
        "me/tiny-eagle3",
    ]
    assert main([*args, "--private", "--revision", "v1"]) == 0
    assert FakeHfApi.calls == [
        ("create_repo", "me/tiny-eagle3", True, True),
        ("create_branch", "me/tiny-eagle3", "v1"),
        ("upload_folder", "me/tiny-eagle3", "v1", ["README.md", "config.json", "model.safetensors"]),
    ]
    assert "--speculative-draft-model-path me/tiny-eagle3" in card(out)[1]
    FakeHfApi.fail = True
    try:
        assert main([*args, "--overwrite"]) == 1
    finally:
        FakeHfApi.fail = False
    err = capsys.readouterr().err
    assert "Invalid user token" in err and "hf auth login" in err and (out / "model.safetensors").exists()


def test_mtp_deepseek_layout_serves_as_target_and_draft(target, target_dir, tmp_path):
    torch.manual_seed(0)
    head = MtpHead(MtpConfig.for_target(target, num_modules=2)).eval()
    save_mtp(head, tmp_path / "mtp" / "final")
    out = tmp_path / "deepseek"
    assert main(["export", str(tmp_path / "mtp"), "--format", "mtp", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 2 and config["num_hidden_layers"] == 3
    assert (out / "tokenizer.json").exists() and "--draft mtp:" in card(out)[1]
    served = Target.load(str(out), device="cpu", dtype="float32")  # transformers: the plain target
    prompts = random_prompts(3)
    plain = generate_plain(served, prompts, SamplingParams(), 12)
    assert [r.token_ids for r in plain] == [
        r.token_ids for r in generate_plain(target, prompts, SamplingParams(), 12)
    ]
    drafter = build_drafter(f"mtp:{out}", served, parse_tree_spec("chain:2"))
    results = generate_speculative(served, drafter, prompts, SamplingParams(), 12)
    assert [r.token_ids for r in results] == [r.token_ids for r in plain]


def test_mtp_export_refuses_another_target(target, tmp_path, capsys):
    torch.manual_seed(0)
    save_mtp(MtpHead(MtpConfig.for_target(target, num_modules=1)), tmp_path / "mtp")
    other = make_tiny_dir(tmp_path / "other")  # same shapes, same tokenizer, other weights
    with torch.no_grad():
        model = Target.load(str(other), device="cpu", dtype="float32").model
        model.model.norm.weight.add_(1.0)
        model.save_pretrained(other)
    out = tmp_path / "deepseek"
    assert (
        main(["export", str(tmp_path / "mtp"), "--format", "mtp", "--target", str(other), "--out", str(out)])
        == 2
    )
    assert "--target" in capsys.readouterr().err and not out.exists()


def test_mtp_mimo_layout_is_the_target_as_qwen2_plus_one_module(target, tmp_path, capsys):
    """vLLM serves this as MiMo MTP: the target written as Qwen2 with zero q/k/v biases must decode
    exactly like the target, and the module must read back exactly; two modules are refused."""
    from draftsmith.runtime.core.checkpoint_index import Checkpoint
    from draftsmith.runtime.heads.mtp_layout import from_mimo

    torch.manual_seed(0)
    head = MtpHead(MtpConfig.for_target(target, num_modules=1)).eval()
    save_mtp(head, tmp_path / "mtp")
    out = tmp_path / "mimo"
    assert main(["export", str(tmp_path / "mtp"), "--format", "mtp-mimo", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MiMoForCausalLM"] and config["model_type"] == "qwen2"
    index = Checkpoint.open(out)  # sharded, through model.safetensors.index.json
    tensors = index.read(list(index.weight_map))
    assert (
        "model.mtp_layers.0.input_proj.weight" in tensors
        and "model.layers.0.self_attn.q_proj.bias" in tensors
    )
    _, ours = from_mimo(config, tensors)
    expected = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    assert ours.keys() == expected.keys() and all(torch.equal(ours[k], expected[k]) for k in ours)
    as_qwen2 = Target.load(str(out), device="cpu", dtype="float32")
    prompts = random_prompts(3)
    plain = [r.token_ids for r in generate_plain(target, prompts, SamplingParams(), 12)]
    assert [r.token_ids for r in generate_plain(as_qwen2, prompts, SamplingParams(), 12)] == plain
    drafter = build_drafter(f"mtp:{out}", target, parse_tree_spec("chain:1"))  # the folder drafts too
    assert [
        r.token_ids for r in generate_speculative(target, drafter, prompts, SamplingParams(), 12)
    ] == plain

    save_mtp(MtpHead(MtpConfig.for_target(target, num_modules=2)), tmp_path / "mtp2")
    assert main(["export", str(tmp_path / "mtp2"), "--format", "mtp-mimo", "--out", str(tmp_path / "x")]) == 2
    assert "num_modules" in capsys.readouterr().err


def test_card_reads_a_draftsmith_bench_folder(run_dir, tmp_path):
    """`draftsmith bench` writes results.json (a list of rows) and meta.json; the card quotes both."""
    from draftsmith.train.model_card import bench_rows

    rows = json.loads((run_dir / "bench.json").read_text())["rows"]
    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps([{**r, "batch_size": 4} for r in rows]))
    meta = {"date": "2026-11-30T08:00:00+00:00", "command": "draftsmith bench --draft eagle3:X"}
    meta |= {"request": {"prompts": "humaneval"}, "machine": {"processor": "x86_64", "device": "cpu"}}
    (folder / "meta.json").write_text(json.dumps(meta))
    ours, where = bench_rows(folder / "results.json", run_dir / "final")
    assert [r["method"] for r in ours] == ["plain", f"eagle3:{run_dir / 'final'}@chain:2"]
    assert where["prompt_set"] == "humaneval" and where["command"] == meta["command"]
    assert where["date"].startswith("2026-11-30") and "x86_64" in where["machine"]
