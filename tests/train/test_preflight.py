"""The memory preflight (train/preflight/estimate.py, train/preflight/report.py): exact parameter counts from
a meta-device model, the estimate against the measured peak of a CPU run (within 20%), the Llama-3.3-70B
table on 8 x 80 GB, a run refused before its target loads (exit 2), and `--preflight` reading no weights.

    OMP_NUM_THREADS=1 python -m pytest tests/train/test_preflight.py -q

The measured peak is the most bytes CPU tensors held at once, from the profiler's allocation and free
records: the CPU twin of torch.cuda.max_memory_allocated, which is what a GPU's budget is spent on.
Peak RSS would add the Python heap, glibc's arenas and library pages, tens of MB of noise against a
working set of ~12 MB here, and it depends on what ran earlier in the process; the records do not (two
runs in one process measure the same bytes).
"""

import bisect
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from draftsmith.runtime.cli.main import main
from draftsmith.runtime.errors import BadInputError
from draftsmith.train.config import load_train_config
from draftsmith.train.preflight.estimate import Knobs, Setup, estimate, trainable_terms
from draftsmith.train.preflight.plan import preflight_report
from draftsmith.train.preflight.shapes import TargetShapes, head_parameters, shipped_targets
from draftsmith.train.preflight.units import Term

LENGTH = 64  # T: every row of the conversations below is clipped to it, so B x T is exact
PUBLISHED = {  # parameters, as the model cards round them: 8.03B, 70.6B, 32.8B (31.2B without embeddings)
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "meta-llama/Llama-3.3-70B-Instruct": 70_553_706_496,
    "Qwen/Qwen3-32B": 32_762_123_264,
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """Conversations of one-word questions and 80-word answers: nearly every token of a clipped row is
    supervised, as the estimate's worst case assumes."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("answers") / "convs.jsonl"
    with path.open("w") as f:
        for _ in range(24):
            answer = " ".join(f"w{rng.randrange(100)}" for _ in range(80))
            messages = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


@pytest.fixture(scope="module")
def answers_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("answers-data")


def overrides(tiny_dir, answers, data_dir, out, *extra) -> list[str]:
    return [
        f"target={tiny_dir}",
        f"output_dir={out}",
        f"data.source={answers}",
        f"data.dir={data_dir}",
        f"data.max_length={LENGTH}",
        "data.validation_fraction=0.2",
        "head.aux_layers=0,1,2",
        "head.draft_vocab_size=128",  # the whole vocabulary: every position's target argmax counts
        "log.progress=false",
        "train.batch_size=4",
        "train.max_steps=2",
        "train.warmup_steps=0",
        "eval.every=0",
        "checkpoint.every=0",
        *extra,
    ]


def measured_peak(run):
    """(the most bytes CPU tensors allocated while `run()` ran held at once, its result), from the
    profiler's allocation and free records, in order. (Their running `total_allocated` is no measure
    here: the allocator keeps counting blocks an earlier profile allocated and never saw freed.)
    Weights mapped from a file without the allocator are added (none today: safetensors reads the file
    into an allocation)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    events = []

    def walk(nodes):
        for node in nodes:
            fields = node.extra_fields
            if hasattr(fields, "alloc_size"):
                events.append((node.start_time_ns, fields.alloc_size, fields.ptr))
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    live, held, peak = {}, 0, 0
    for _, size, ptr in sorted(events):
        if size > 0:
            live[ptr] = size
            held += size
        elif ptr in live:  # a block allocated before the run is not counted, nor is its free
            held -= live.pop(ptr)
        peak = max(peak, held)
    starts = sorted(live)

    def allocated(ptr):
        i = bisect.bisect_right(starts, ptr) - 1
        return i >= 0 and ptr < starts[i] + live[starts[i]]

    tensors = result.target.model.state_dict().values()
    return peak + sum(t.numel() * t.element_size() for t in tensors if not allocated(t.data_ptr())), result


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["train.ttt_attention=dense"],
        ["train.activation_checkpointing=true"],
        ["head.type=mtp", "head.num_modules=2"],
        ["head.type=medusa", "head.num_heads=3"],  # the target's LM head shared, the whole vocabulary
        ["head.type=medusa", "head.reduce_vocab=true", "head.draft_vocab_size=64"],  # its rows sliced once
        ["head.type=medusa", "head.labels=data", "head.reduce_vocab=true", "head.draft_vocab_size=64"],
        ["head.type=medusa", "head.num_heads=2", "head.original_lm_head=false", "head.num_layers=2"],
    ],
    ids=[
        "eagle3",
        "eagle3-dense",
        "eagle3-checkpointing",
        "mtp",
        "medusa",
        "medusa-reduced",
        "medusa-data-labels",
        "medusa-own-heads",
    ],
)
def test_the_estimate_is_within_20_percent_of_a_measured_cpu_run(
    tiny_dir, answers, answers_dir, tmp_path, extra
):
    from draftsmith.train.loop.trainer import Trainer

    Trainer(load_train_config(None, overrides(tiny_dir, answers, answers_dir, tmp_path / "warm", *extra)))
    cfg = load_train_config(None, overrides(tiny_dir, answers, answers_dir, tmp_path / "run", *extra))

    def two_steps():
        trainer = Trainer(cfg)
        trainer.train_step()
        trainer.train_step()
        return trainer

    peak, trainer = measured_peak(two_steps)
    assert {len(trainer.train_rows[i]["input_ids"]) for i in range(len(trainer.train_rows))} == {LENGTH}
    shapes = TargetShapes.load(str(tiny_dir), torch.float32)
    est = estimate(shapes, Knobs.from_config(cfg, shapes), Setup("single", 1, "cpu", "no"))
    terms = {t.name: round(t.bytes) for t in est.terms}
    assert 0.8 <= est.peak / peak <= 1.2, f"estimated {est.peak:.0f} B, measured {peak} B: {terms}"


def test_medusa_has_its_own_terms(capsys):
    """Medusa's objective declares its terms (train/preflight/medusa_memory.py): no attention and no MTP
    modules, its loss over the draft vocabulary (head.reduce_vocab), the shared LM head's draft rows counted
    once."""
    config = Path(__file__).parents[2] / "configs" / "medusa-smollm2-135m.yaml"
    assert main(["train", "--preflight", "--config", str(config), "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    for mtp_words in ("attention", "module", "eh_proj", "M x B x T x V"):
        assert mtp_words not in out, mtp_words
    assert "Medusa online" in out and "head activations (B x T x K)" in out
    assert "K x B x T x Vd x fp32 (log-softmax, target probs), Vd = 8192 (head.reduce_vocab)" in out
    assert "draft rows of the LM head" in out
    cfg = load_train_config(str(config), [])
    shapes = TargetShapes.load(cfg.target, torch.bfloat16)
    knobs = Knobs.from_config(cfg, shapes)
    terms = {t.name: t for t in estimate(shapes, knobs, Setup("single", 1, "cuda", "bf16")).terms}
    tokens, vd = cfg.train.batch_size * cfg.data.max_length, cfg.head.draft_vocab_size
    assert terms["draft rows of the LM head"].bytes == vd * shapes.hidden * 2  # one bf16 copy, not K
    assert terms["loss tensors"].bytes == tokens * cfg.head.num_heads * (8 * vd + 8)  # over Vd, not V


def test_the_estimate_adds_the_terms_the_kind_declares(monkeypatch):
    """Beyond the resident terms, the estimate is what the kind's objective declares (`memory_terms`):
    another declaration changes it, and no kind's terms are listed in the preflight itself."""
    from draftsmith.train.objectives.registry import OBJECTIVES

    assert all(callable(kind.memory_terms) for kind in OBJECTIVES.values())
    cfg = load_train_config(None, ["head.type=mtp"])
    shapes = TargetShapes.load(cfg.target, torch.bfloat16)
    knobs, setup = Knobs.from_config(cfg, shapes), Setup("single", 1, "cpu", "bf16")
    before = {t.name for t in estimate(shapes, knobs, setup).terms if t.phase != "resident"}
    assert "module activations (B x T x M)" in before
    own = Term("a new kind's state", 123.0, "declared", "step")
    monkeypatch.setattr(OBJECTIVES["mtp"], "memory_terms", staticmethod(lambda s, k, setup: [own]))
    after = [t for t in estimate(shapes, knobs, setup).terms if t.phase != "resident"]
    assert after == [own]


def test_the_meta_device_count_is_the_real_one(tiny_dir, tiny_target, tmp_path):
    from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
    from draftsmith.runtime.heads.mtp import MtpConfig, MtpHead

    model = tiny_target.model  # loaded from the weights, float32
    shapes = TargetShapes.load(str(tiny_dir), torch.float32)
    assert shapes.params == sum(p.numel() for p in model.parameters())
    assert shapes.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert shapes.buffer_bytes == sum(b.numel() * b.element_size() for b in model.buffers())
    parts = (model.model.embed_tokens.weight, model.model.norm.weight, model.lm_head.weight)
    assert shapes.part_bytes == sum(p.numel() * p.element_size() for p in parts)
    only = tmp_path / "config-only"  # the same numbers from config.json alone, in bf16 too
    only.mkdir()
    shutil.copy(tiny_dir / "config.json", only / "config.json")
    assert TargetShapes.load(str(only), torch.float32).param_bytes == shapes.param_bytes
    assert TargetShapes.load(str(only), torch.bfloat16).param_bytes == 2 * shapes.params

    cfg = load_train_config(None, ["head.aux_layers=0,1,2", "head.draft_vocab_size=64", "head.num_layers=2"])
    knobs = Knobs.from_config(cfg, shapes)
    real = Eagle3Head(Eagle3Config.for_target(tiny_target, [0, 1, 2], 64, **knobs.options))
    assert head_parameters(shapes, knobs) == sum(p.numel() for p in real.parameters())
    cfg = load_train_config(None, ["head.type=mtp", "head.num_modules=3", "head.draft_vocab_size=64"])
    knobs = Knobs.from_config(cfg, shapes)
    real = MtpHead(MtpConfig.for_target(tiny_target, 3))
    assert head_parameters(shapes, knobs) == sum(p.numel() for p in real.parameters())


def test_the_shipped_target_configs_have_the_published_sizes():
    assert set(PUBLISHED) <= set(shipped_targets())  # MoE / MLA ones: tests/train/test_preflight_families.py
    for name, params in PUBLISHED.items():
        shapes = TargetShapes.load(name, torch.bfloat16)  # configs/targets/, no network
        assert (shapes.params, shapes.param_bytes) == (params, 2 * params), name


def test_the_head_state_follows_the_strategy():
    """AdamW over n float32 parameters: DDP adds its bucket copy of the gradients; ZeRO-2 holds the
    module in bf16 and partitions gradients and fp32 master + moments; ZeRO-3 the parameters too (plus
    what it gathers); FSDP2 shards everything and gathers in bf16."""
    n, w = 10**6, 8

    def state(strategy):
        return [t.bytes for t in trainable_terms("head", n, 4, Setup(strategy, w, "cuda", "bf16"))]

    assert state("single") == [4 * n, 4 * n, 8 * n]
    assert state("ddp") == [4 * n, 8 * n, 8 * n]
    assert state("zero2") == [2 * n, 2 * n / w + 2 * n, 12 * n / w]
    assert state("zero3") == [2 * n / w + 2 * n, 2 * n / w + 2 * n, 12 * n / w]
    assert state("fsdp") == [4 * n / w + 2 * n, 4 * n / w + 2 * n, 8 * n / w]


def test_llama_70b_at_4k_on_8x80gb_needs_its_target_split(capsys):
    """Online EAGLE-3 for Llama-3.3-70B at T = 4k, one row per rank: with the target whole on every
    rank no strategy fits 80 GB, for its 141.1 GB of weights. With the TTT attention's GPU default (the
    explicit [T, T] scores CI runs: 34.4 GB of attention) it takes target_placement=tp over 8 ranks; with
    FlexAttention's O(T) memory (train.ttt_attention=flex, GPU-only and unmeasured) tp over 4 (its layers
    split, embedding and LM head whole: 38.4 GB) fits under ZeRO-2/3 and FSDP2. Fixed GPU overheads
    (CUDA context, NCCL buffers, allocator slack) included."""
    argv = ["target=meta-llama/Llama-3.3-70B-Instruct", "data.max_length=4096", "train.batch_size=1"]
    argv += ["train.preflight_device_gb=80"]
    assert main(["train", "--preflight", *argv, "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "70.55B parameters" in out and "8 ranks" in out
    assert "largest terms (ZeRO-3): target weights 141.1 GB; attention 34.4 GB" in out
    assert "target_placement=tp tp_size=8: 79.9 GB" in out  # the mildest split that fits
    argv += ["train.ttt_attention=flex"]
    assert main(["train", "--preflight", *argv, "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "target_placement=tp tp_size=4: 65.3 GB" in out  # mildest that fits (60.8 GB w/o overheads)
    assert main(["train", "--preflight", *argv, "target_placement=tp", "tp_size=4", "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "ZeRO-3 TP=4" in out and "38.4 GB" in out and "does not fit" not in out
    cfg = load_train_config(None, argv)
    shapes = TargetShapes.load(cfg.target, torch.bfloat16)
    knobs = Knobs.from_config(cfg, shapes)
    whole = estimate(shapes, knobs, Setup("zero3", 8, "cuda", "bf16"))
    split = estimate(shapes, knobs, Setup("zero3", 8, "cuda", "bf16", tp=4))
    assert whole.largest(1)[0].name == "target weights" and whole.peak > 80e9 >= split.peak


def test_a_run_that_does_not_fit_is_refused_before_its_target_loads(
    tiny_dir, answers, answers_dir, tmp_path, capsys, monkeypatch
):
    from draftsmith.runtime.core.target import Target

    def never(*args, **kwargs):
        raise AssertionError("the target loaded before the preflight refused")

    monkeypatch.setattr(Target, "load", never)
    config = tmp_path / "cfg.yaml"
    config.write_text("{}\n")
    argv = ["train", "--config", str(config), *overrides(tiny_dir, answers, answers_dir, tmp_path / "run")]
    assert main([*argv, "train.preflight_device_gb=0.002"]) == 2
    err = capsys.readouterr().err
    assert "memory per rank: the estimate" in err and "exceeds 0.002 GB (train.preflight_device_gb)" in err
    assert "the largest terms: head activations (B x T x K)" in err
    assert "what would fit:" in err and "train.batch_size=" in err
    assert "to try anyway: train.preflight=warn" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_warn_runs_anyway_and_the_table_opens_every_run(tiny_dir, answers, answers_dir, tmp_path, capsys):
    config = tmp_path / "cfg.yaml"
    config.write_text("{}\n")
    argv = ["train", "--config", str(config), *overrides(tiny_dir, answers, answers_dir, tmp_path / "run")]
    assert main([*argv, "train.max_steps=1", "train.preflight=warn", "train.preflight_device_gb=0.002"]) == 0
    err = capsys.readouterr().err
    assert err.count("memory preflight (an estimate") == 1 and "train.preflight=warn: memory per rank" in err
    assert (tmp_path / "run" / "final").is_dir()


def test_preflight_reads_no_weights(tiny_dir, tmp_path, capsys, monkeypatch):
    import safetensors
    import safetensors.torch
    import transformers
    import transformers.modeling_utils

    def refuse(*args, **kwargs):
        raise AssertionError("a weights file was opened")

    for module, name in [
        (safetensors, "safe_open"),
        (safetensors.torch, "load_file"),
        (safetensors.torch, "safe_open"),
    ]:
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setattr(transformers.modeling_utils, "safe_open", refuse, raising=False)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    only = tmp_path / "config-only"  # a folder holding nothing but config.json
    only.mkdir()
    shutil.copy(tiny_dir / "config.json", only / "config.json")
    for target in (only, only / "config.json", tiny_dir):
        argv = [
            "train",
            "--preflight",
            f"target={target}",
            "head.aux_layers=0,1,2",
            "head.draft_vocab_size=64",
        ]
        assert main([*argv, "data.source=/nonexistent.jsonl", "--world-size", "1"]) == 0  # no data read
        out = capsys.readouterr().out
        assert "memory preflight (an estimate" in out and "fits" in out and "target weights" in out


def test_bad_preflight_inputs_exit_2(tiny_dir, tmp_path, capsys):
    foreign = tmp_path / "gpt2"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    cases = [
        (["target=/no/such/model"], "target: got '/no/such/model'"),
        ([f"target={foreign}"], "model_type='gpt2'"),
        ([f"target={tiny_dir}", "head.draft_vocab_size=4096"], "head.draft_vocab_size: got 4096"),
        ([f"target={tiny_dir}", "train.preflight_device_gb=0"], "train.preflight_device_gb: got 0"),
        ([f"target={tiny_dir}", "--world-size", "0"], "--world-size: got 0"),
        ([f"target={tiny_dir}", "target_placement=tp", "tp_size=3", "--world-size", "4"], "tp_size: got 3"),
    ]
    for argv, message in cases:
        assert main(["train", "--preflight", "head.aux_layers=0,1,2", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert main(["train", "target=x"]) == 2  # a run needs its config
    assert "--config: got None" in capsys.readouterr().err
    with pytest.raises(BadInputError, match="target"):
        preflight_report(load_train_config(None, ["target=not a spec"]))
