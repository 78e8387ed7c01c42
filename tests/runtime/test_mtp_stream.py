"""The MTP exports written shard by shard (runtime/heads/mtp_stream.py, issue 47 item 6): a sharded target
comes out sharded the same way plus one shard a module, under HF's index schema, the index written last;
every tensor reads back exactly and the folder loads as the target and as the draft; the weights hash read
from four tensors equals the old whole-dict hash; a shard that changed on disk or an export cut short is
caught; and the export's peak memory is about one target shard plus the modules, not the whole target.

    OMP_NUM_THREADS=1 python -m pytest tests/runtime/test_mtp_stream.py -q
"""

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny_models import random_prompts, tiny_config, tiny_tokenizer

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.core.artifacts import weights_hash, weights_hash_of_tensors
from draftsmith.runtime.core.checkpoint_index import INDEX_FILE, Checkpoint
from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.errors import DraftsmithError
from draftsmith.runtime.heads import mtp_stream
from draftsmith.runtime.heads.eagle3_binding import folder_weights_hash
from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead, load_head, save_head
from draftsmith.runtime.heads.mtp_layout import deepseek_config, from_mimo
from draftsmith.runtime.verify.sampling import SamplingParams

SHARD = "100KB"  # the tiny target (3 layers, ~0.5 MB) in 6 files


def sharded_target(path: Path, tie: bool = False, shard: str = SHARD, **sizes) -> Path:
    """A random Llama saved by transformers as a sharded folder (model-0000i-of-0000N + index)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config()
    config.tie_word_embeddings = tie
    for key, value in sizes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked logits, as tests/tiny_models.py
    model.save_pretrained(path, max_shard_size=shard)
    tiny_tokenizer().save_pretrained(path)
    return path


def trained_head(target_dir: Path, modules: int) -> tuple[Target, MtpHead, Path]:
    target = Target.load(str(target_dir), device="cpu", dtype="float32")
    torch.manual_seed(1)
    head = MtpHead(MtpConfig.for_target(target, num_modules=modules)).eval()
    save_head(head, target_dir.parent / f"{target_dir.name}-head")
    return target, head, target_dir.parent / f"{target_dir.name}-head"


def export(head_dir: Path, target_dir: Path, out: Path, fmt: str = "mtp") -> int:
    return main(["export", str(head_dir), "--format", fmt, "--target", str(target_dir), "--out", str(out)])


def shard_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("model-*.safetensors"))


def keys_of(file: Path) -> set[str]:
    with safe_open(str(file), framework="pt") as f:
        return set(f.keys())


def ours(head: MtpHead) -> dict[str, torch.Tensor]:
    return {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}


@pytest.mark.parametrize("tie", [False, True])
def test_deepseek_export_keeps_the_target_shards_and_adds_one_a_module(tmp_path, tie):
    target_dir = sharded_target(tmp_path / "target", tie=tie)
    target, head, head_dir = trained_head(target_dir, modules=2)
    out = tmp_path / "out"
    assert export(head_dir, target_dir, out) == 0

    source = Checkpoint.open(target_dir)
    n, layers = len(source.files), target.num_layers
    assert n >= 5 and source.source == INDEX_FILE
    files = shard_files(out)
    assert files == [f"model-{i:05d}-of-{n + 2:05d}.safetensors" for i in range(1, n + 3)]
    assert not list(out.glob(".*"))  # no temporary file left behind
    index = json.loads((out / INDEX_FILE).read_text())
    assert list(index) == ["metadata", "weight_map"] and list(index["metadata"]) == ["total_size"]
    on_disk = {file: load_file(str(out / file)) for file in files}
    assert index["weight_map"] == {name: file for file, ts in on_disk.items() for name in ts}
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for ts in on_disk.values() for t in ts.values()
    )
    # target shard i comes out as shard i, every tensor exactly; the modules come after, one a file
    for file, written in zip(source.files, files[:n], strict=True):
        original = load_file(str(target_dir / file))
        assert on_disk[written].keys() == original.keys()
        assert all(torch.equal(on_disk[written][k], original[k]) for k in original)
    for m, file in enumerate(files[n:]):
        assert {k.split(".")[2] for k in on_disk[file]} == {str(layers + m)}
    embed = load_file(str(target_dir / source.weight_map["model.embed_tokens.weight"]))
    copy = on_disk[files[n + 1]][f"model.layers.{layers + 1}.shared_head.head.weight"]
    assert torch.equal(copy, target.model.get_output_embeddings().weight) and (
        not tie or torch.equal(copy, embed["model.embed_tokens.weight"])
    )

    back = load_head(out, target)  # `--draft mtp:DIR` reads the modules from the shards
    assert all(torch.equal(back.state_dict()[k], v) for k, v in ours(head).items())
    served = Target.load(str(out), device="cpu", dtype="float32")  # transformers reads the index
    prompts = random_prompts(2)
    assert [r.token_ids for r in generate_plain(served, prompts, SamplingParams(), 8)] == [
        r.token_ids for r in generate_plain(target, prompts, SamplingParams(), 8)
    ]


def test_mimo_export_of_a_tied_sharded_target(tmp_path):
    """MiMo does not tie: the LM head is written out next to the embedding, zero q/k/v biases next to
    their weights, the module in the last shard; the folder decodes as Qwen2 exactly like the target."""
    target_dir = sharded_target(tmp_path / "target", tie=True)
    target, head, head_dir = trained_head(target_dir, modules=1)
    out = tmp_path / "out"
    assert export(head_dir, target_dir, out, "mtp-mimo") == 0
    index = json.loads((out / INDEX_FILE).read_text())["weight_map"]
    source = Checkpoint.open(target_dir)
    assert "lm_head.weight" not in source.weight_map
    assert index["lm_head.weight"] == index["model.embed_tokens.weight"]
    assert index["model.layers.2.self_attn.v_proj.bias"] == index["model.layers.2.self_attn.v_proj.weight"]
    last = shard_files(out)[-1]
    assert {f for n, f in index.items() if n.startswith("model.mtp_layers.0.")} == {last}
    assert all(n.startswith("model.mtp_layers.0.") for n in keys_of(out / last))
    tensors = Checkpoint.open(out).read(list(index))
    assert not tensors["model.layers.0.self_attn.q_proj.bias"].any()
    _, back = from_mimo(json.loads((out / "config.json").read_text()), tensors)
    assert back.keys() == ours(head).keys() and all(torch.equal(back[k], v) for k, v in ours(head).items())
    as_qwen2 = Target.load(str(out), device="cpu", dtype="float32")
    prompts = random_prompts(2)
    assert [r.token_ids for r in generate_plain(as_qwen2, prompts, SamplingParams(), 8)] == [
        r.token_ids for r in generate_plain(target, prompts, SamplingParams(), 8)
    ]


def test_streamed_weights_hash_is_the_whole_dict_hash(tmp_path, capsys):
    """The export checks the target by the four tensors weights_hash reads (a shard each here), never the
    whole target: the same value as the old hash over every tensor loaded into one dict, and as the
    model's own; a change in one shard changes it and the export is refused (exit 2)."""
    target_dir = sharded_target(tmp_path / "target")
    target, head, head_dir = trained_head(target_dir, modules=1)
    source = Checkpoint.open(target_dir)
    whole = {}
    for file in source.files:
        whole.update(load_file(str(target_dir / file)))
    old = weights_hash_of_tensors(whole, target.num_layers)  # what _check_target_weights computed
    assert (
        folder_weights_hash(target_dir)
        == old
        == weights_hash(target.model)
        == head.config.target_weights_hash
    )

    name = f"model.layers.{target.num_layers - 1}.mlp.down_proj.weight"
    file = target_dir / source.weight_map[name]
    tensors = load_file(str(file))
    tensors[name] = tensors[name] + 0.25  # survives the bfloat16 rounding of the hash
    save_file(tensors, str(file), metadata={"format": "pt"})
    assert folder_weights_hash(target_dir) != old
    assert export(head_dir, target_dir, tmp_path / "out") == 2
    assert "--target" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_shard_changed_on_disk_or_an_export_cut_short(tmp_path, monkeypatch):
    """Each shard is read back against what was meant; a stop before the end leaves shards but no index."""
    monkeypatch.setattr(logging.getLogger("draftsmith"), "handlers", [])  # an earlier test's closed stderr
    target_dir = sharded_target(tmp_path / "target")
    target, head, _ = trained_head(target_dir, modules=1)
    config = deepseek_config(head.config, json.loads((target_dir / "config.json").read_text()))
    real_save = mtp_stream.atomic_save_file

    def corrupting_save(path, tensors, metadata):  # what a bad disk or a racing writer would leave
        first = sorted(tensors)[0]
        real_save(path, {**tensors, first: tensors[first] + 1}, metadata)

    monkeypatch.setattr(mtp_stream, "atomic_save_file", corrupting_save)
    with pytest.raises(DraftsmithError, match="changed in the round trip"):
        mtp_stream.write_shards(config, head.config, ours(head), target_dir, tmp_path / "bad", mimo=False)
    monkeypatch.setattr(mtp_stream, "atomic_save_file", real_save)

    reads = []
    real_read = Checkpoint.read

    def interrupted_read(self, names):
        reads.append(names)
        if len(reads) == 3:  # the embedding and LM head, target shard 1, then the stop
            raise KeyboardInterrupt
        return real_read(self, names)

    monkeypatch.setattr(Checkpoint, "read", interrupted_read)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        mtp_stream.write_shards(config, head.config, ours(head), target_dir, out, mimo=False)
    assert len(shard_files(out)) == 2 and not (out / INDEX_FILE).exists() and not list(out.glob(".*"))


def test_a_target_with_mtp_layers_of_its_own_gets_ours_in_their_place(tmp_path, capsys):
    """DeepSeek-V3 ships its MTP layer as layer L: the exported modules replace it, no name twice."""
    target_dir = sharded_target(tmp_path / "target")
    target, head, head_dir = trained_head(target_dir, modules=1)
    source = Checkpoint.open(target_dir)
    theirs = f"model.layers.{target.num_layers}.eh_proj.weight"
    last = target_dir / source.files[-1]
    save_file({**load_file(str(last)), theirs: torch.zeros(64, 128)}, str(last), metadata={"format": "pt"})
    index = json.loads((target_dir / INDEX_FILE).read_text())
    index["weight_map"][theirs] = source.files[-1]
    (target_dir / INDEX_FILE).write_text(json.dumps(index))
    out = tmp_path / "out"
    assert export(head_dir, target_dir, out) == 0
    assert f"the target's own 1 tensors where the modules go ({theirs}" in capsys.readouterr().err
    written = Checkpoint.open(out)
    assert written.weight_map[theirs] == shard_files(out)[-1]
    assert torch.equal(written.read([theirs])[theirs], ours(head)["layers.0.eh_proj.weight"])


# ---- peak memory -------------------------------------------------------------------------------------
# The export runs twice in a fresh interpreter: once to import everything it imports, then measured. The
# kernel's high-water mark is reset (clear_refs 5) just before, so VmHWM - VmRSS is the export's own peak.
# A fixed mmap threshold keeps glibc from growing it dynamically and keeping freed tensors on its heap,
# which would hide the second run's allocations behind the first's.
MEASURE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from draftsmith.runtime.heads.head_kind import LayoutOptions
    from draftsmith.runtime.heads.mtp_kind import write_deepseek

    head, target, out = sys.argv[1:]
    options = LayoutOptions(target=target)
    (Path(out) / "warm").mkdir(parents=True)
    write_deepseek(Path(head), Path(out) / "warm", options)

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

    (Path(out) / "measured").mkdir()
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    write_deepseek(Path(head), Path(out) / "measured", options)
    print(json.dumps({"before": before, "peak": status("VmHWM")}))
    """
)


def test_peak_memory_is_a_shard_plus_the_modules_not_the_target(tmp_path):
    # 12 layers of 3.9 MB (fp32) in 5 MB shards: a 47 MB target, the module (one layer) a twelfth of it
    sizes = dict(hidden_size=256, head_dim=64, intermediate_size=1024, num_hidden_layers=12)
    target_dir = sharded_target(tmp_path / "target", shard="5MB", **sizes)
    _, head, head_dir = trained_head(target_dir, modules=1)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, str(head_dir), str(target_dir), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rss = json.loads(run.stdout.strip().splitlines()[-1])
    growth = rss["peak"] - rss["before"]

    source = Checkpoint.open(target_dir)
    shards = [(target_dir / f).stat().st_size for f in source.files]
    target_bytes, largest = sum(shards), max(shards)
    # what the module's shard holds: its own tensors and DeepSeek's copies of the embedding and LM head
    shared = source.read(["model.embed_tokens.weight", "lm_head.weight"])
    modules = sum(t.numel() * t.element_size() for t in [*ours(head).values(), *shared.values()])
    bound = 3 * (largest + modules)
    print(
        f"target {target_bytes / 1e6:.1f} MB in {len(shards)} shards, largest {largest / 1e6:.1f} MB, "
        f"module {modules / 1e6:.1f} MB: peak growth {growth / 1e6:.1f} MB, bound {bound / 1e6:.1f} MB"
    )
    # Holding the target whole (the old writer held it about three times) could not pass this bound.
    assert len(shards) >= 6 and bound < target_bytes
    assert 0 < growth < bound, (growth, bound, target_bytes)


def test_a_target_read_dequantized_is_refused(tmp_path, monkeypatch):
    """A Checkpoint that dequantizes block-FP8 weights as it reads (DeepSeek-V3 as published) would turn
    the pass-through into a float32 copy without scales: refused with exit-2's error, before any write."""
    from types import SimpleNamespace

    from draftsmith.runtime.errors import BadInputError

    target_dir = sharded_target(tmp_path / "target")
    _, head, _ = trained_head(target_dir, modules=1)
    config = deepseek_config(head.config, json.loads((target_dir / "config.json").read_text()))
    monkeypatch.setattr(mtp_stream.Checkpoint, "open", lambda folder: SimpleNamespace(fp8=object()))
    out = tmp_path / "out"
    with pytest.raises(BadInputError, match="dequantized") as err:
        mtp_stream.write_shards(config, head.config, ours(head), target_dir, out, mimo=False)
    assert err.value.field == "--target" and err.value.exit_code == 2 and not out.exists()
