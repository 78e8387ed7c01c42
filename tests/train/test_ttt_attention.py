"""The TTT step without a dense mask (issue 21 item 4) computes what the dense-mask step computes.

ALGORITHM tests (tests/tolerances.py): every comparison runs both sides in float64.
- the decomposed attention (causal kernel + k diagonal keys, merged by log-sum-exp) equals SDPA over
  the (k+1)T concatenated keys with the head's [T, (k+1)T] mask, outputs and gradients, for K = 1..7,
  GQA and MHA, on each backend; dropping one diagonal key or letting the causal part see one key too many
  fails the same comparison (the controls);
- the CPU flash kernel's log-sum-exp gradient (the extra-channel fold) equals the explicit scores';
- the head unrolled both ways over a padded GQA batch gives the same outputs at every step and the same
  parameter gradients, with 1 and 2 layers; padding never reaches a real position;
- the loss with target logits only where a loss reads them, in chunks, and a chunked soft cross-entropy
  equals the loss as first written (logits everywhere, one CE over [B, T, Vd]), loss, counts and
  gradients, and no call sees more than `logit_chunk` rows;
- activation checkpointing gives the same gradients and really recomputes the layers in backward;
- a 3-step training run gives the same losses with the dense reference, and with checkpointing and
  small chunks.
"""

import pytest
import torch
from tiny_models import tiny_model, tiny_tokenizer
from tolerances import TINY_TARGET_SUMS, assert_float64_equal, assert_rounding_close
from torch.nn import functional as F
from train_data import read_metrics, run_overrides

from draftsmith.runtime.core.masks import attention_mask
from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.train.config import load_train_config
from draftsmith.train.objectives.eagle3_objective import TTTBatch, step_mask, ttt_loss, ttt_loss_ref, unroll
from draftsmith.train.objectives.ttt_attention import causal_attention_lse, default_backend, ttt_attention

STEPS = range(1, 8)  # K = 1..7: the attention at step K - 1 has K - 1 diagonal keys


def random_steps(step: int, heads: int, kv_heads: int, length: int = 11, batch: int = 2, dim: int = 8):
    """q [B, Hq, T, d] of step `step` and the keys and values of steps 0..step [B, Hkv, T, d] (leaves)."""
    g = torch.Generator().manual_seed(step)

    def leaf(h):
        return torch.randn(batch, h, length, dim, generator=g, dtype=torch.float64).requires_grad_()

    return leaf(heads), [leaf(kv_heads) for _ in range(step + 1)], [leaf(kv_heads) for _ in range(step + 1)]


def mapped(fn, q, keys, values):
    """random_steps' tensors through fn (a detach, a move to CUDA)."""
    return fn(q), [fn(k) for k in keys], [fn(v) for v in values]


def dense_attention(q, keys, values):
    """What the head computes today at step k: SDPA over the concatenated keys with the drafter's mask."""
    length, step = q.shape[2], len(keys) - 1
    valid = torch.ones(q.shape[0], (step + 1) * length, dtype=torch.bool)  # GrowingCache: all slots
    mask = attention_mask(valid, length, step_mask(length, step, "cpu"))  # [B, 1, T, (k+1)T]
    k, v = torch.cat(keys, dim=2), torch.cat(values, dim=2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def with_grads(out, leaves, seed=1):
    """out and d<out, R>/d(leaves) for a fixed random R (every output element weighs in; zeros for a
    leaf the output does not read)."""
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype).to(out.device)
    return [out, *torch.autograd.grad((out * r).sum(), leaves, allow_unused=True, materialize_grads=True)]


@pytest.mark.parametrize("backend", ["flash_cpu", "math"])
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)], ids=["GQA 6/2", "MHA 4/4"])
@pytest.mark.parametrize("steps", STEPS)
def test_decomposed_attention_equals_the_dense_mask(backend, heads, steps):
    q, keys, values = random_steps(steps - 1, *heads)
    leaves = [q, *keys, *values]
    want = with_grads(dense_attention(q, keys, values), leaves)
    got = with_grads(ttt_attention(q, keys[0], values[0], keys[1:], values[1:], backend), leaves)
    for g, w in zip(got, want):
        assert_float64_equal(g, w)
    if steps > 1:  # control: one diagonal key dropped
        dropped = ttt_attention(q, keys[0], values[0], keys[1:-1], values[1:-1], backend)
        with pytest.raises(AssertionError):
            assert_float64_equal(dropped, want[0])


@torch.no_grad()
@pytest.mark.parametrize("steps", [1, 4, 7])
def test_flex_backend_forward_equals_the_dense_mask(steps):
    """The CUDA backend's math (FlexAttention's lse + the merge), run eagerly: FlexAttention has no
    backward on CPU (its gradients: test_flex_backend_on_cuda_equals_the_explicit_scores, on a GPU)."""
    q, keys, values = mapped(torch.Tensor.detach, *random_steps(steps - 1, 6, 2))
    got = ttt_attention(q, keys[0], values[0], keys[1:], values[1:], "flex")
    assert_float64_equal(got, dense_attention(q, keys, values))


@torch.no_grad()
def test_control_a_causal_part_that_sees_one_key_too_many_fails(monkeypatch):
    """The merge fed a causal part over s <= t+1 (an off-by-one in the mask) misses the dense result."""
    import draftsmith.train.objectives.ttt_attention as module

    q, keys, values = random_steps(3, 6, 2)
    one_more = torch.ones(11, 11, dtype=torch.bool).tril(1)
    k0, v0 = keys[0].repeat_interleave(3, 1), values[0].repeat_interleave(3, 1)
    scores = (q @ k0.transpose(-1, -2) * 8**-0.5).masked_fill(~one_more, -torch.inf)  # [B, Hq, T, T]
    monkeypatch.setattr(
        module, "causal_attention_lse", lambda *args: (torch.softmax(scores, -1) @ v0, scores.logsumexp(-1))
    )
    with pytest.raises(AssertionError):
        assert_float64_equal(
            ttt_attention(q, keys[0], values[0], keys[1:], values[1:]), dense_attention(q, keys, values)
        )


@pytest.mark.parametrize("heads", [(6, 2), (4, 4)], ids=["GQA 6/2", "MHA 4/4"])
def test_flash_cpu_lse_gradient_equals_the_explicit_scores(heads):
    """Both outputs differentiated at once (the merge needs d lse): the fold of the lse gradient into the
    flash backward is exact. A transposed (non-contiguous) q, as the head's projections give."""
    q, keys, values = random_steps(0, *heads, length=13)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, Hq, T, d] with strides of [B, T, Hq, d]
    leaves = [q, keys[0], values[0]]
    want = causal_attention_lse(qt, keys[0], values[0], 8**-0.5, "math")
    got = causal_attention_lse(qt, keys[0], values[0], 8**-0.5, "flash_cpu")
    r = [
        torch.randn(t.shape, generator=torch.Generator().manual_seed(i), dtype=t.dtype)
        for i, t in enumerate(want)
    ]

    def grads(outs):
        return torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, r)), leaves)

    for g, w in zip([*got, *grads(got)], [*want, *grads(want)]):
        assert_float64_equal(g, w)


# ---- the head -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama"), tiny_tokenizer(), "tiny")  # 4 query heads, 2 kv heads (GQA)


def make_head(target, num_layers=1, norm_output=False):
    torch.manual_seed(0)
    config = Eagle3Config.for_target(
        target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64, num_layers=num_layers, norm_output=norm_output
    )
    head = Eagle3Head(config)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.1)
    head.set_draft_vocab(torch.arange(0, 128, 2))  # half the target's vocabulary: in_vocab matters
    return head.double()


def padded_batch(target, length=14, seed=0) -> TTTBatch:
    """3 right-padded rows (14, 10 and 6 real tokens) with junk at the padding, a 3-token prompt each."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, 100, (3, length), generator=g)
    out = target.forward(ids, target.new_cache(3, length), capture_layers=(0, 1, 2))
    features = torch.cat([out.aux[i] for i in (0, 1, 2)], dim=-1).double()
    hidden = out.hidden.double()
    valid = torch.ones(3, length, dtype=torch.bool)
    valid[1, 10:], valid[2, 6:] = False, False
    features[~valid] = 50 * torch.randn(
        int((~valid).sum()), features.shape[-1], generator=g, dtype=torch.float64
    )
    mask = torch.ones(3, length, dtype=torch.long)
    mask[:, :3] = 0
    return TTTBatch(ids, features, hidden, mask * valid, valid)


def float64_target(target):
    """The tiny target's embedding and logits (final norm + LM head) in float64."""
    norm, lm_head = target.decoder.norm, target.model.lm_head.weight.double()

    def embed(tokens):
        return target.embed(tokens).double()

    def logits(hidden):  # [N, H] -> [N, V]
        scaled = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return (scaled * norm.weight.double()) @ lm_head.T

    return embed, logits


@pytest.mark.parametrize("layers", [(1, False), (2, True)], ids=["1 layer", "2 layers, norm_output"])
def test_unrolled_head_outputs_and_gradients_equal_the_dense_path(target, layers):
    head = make_head(target, *layers)
    batch = padded_batch(target)
    embed, _ = float64_target(target)
    params = [p for p in head.parameters() if p.requires_grad]
    for steps in STEPS:
        runs = [
            list(unroll(head, embed, batch.input_ids, batch.features, steps, a))
            for a in ("decomposed", "dense")
        ]
        got, want = [with_grads(torch.stack(hs), params, seed=steps) for hs in runs]
        for g, w in zip(got, want):
            assert_float64_equal(g, w)


def test_padding_never_reaches_a_real_position(target):
    """Other junk at the padded positions leaves every real position's outputs unchanged (right padding
    and causal attention), on the decomposed path as on the dense one."""
    head = make_head(target)
    embed, _ = float64_target(target)
    batch = padded_batch(target)
    other = batch.features.clone()
    other[~batch.valid] = -other[~batch.valid]
    for attention in ("decomposed", "dense"):
        a = torch.stack(list(unroll(head, embed, batch.input_ids, batch.features, 7, attention)))
        b = torch.stack(list(unroll(head, embed, batch.input_ids, other, 7, attention)))
        assert_float64_equal(a[:, batch.valid], b[:, batch.valid])
        assert not torch.allclose(a[:, ~batch.valid], b[:, ~batch.valid])  # the junk did change padding


def test_chunked_loss_equals_the_loss_as_first_written(target):
    """Loss, per-step losses, counts, matches and gradients; the target's logits only at read positions
    (p with token p+1 supervised, p >= 1) and every logits call on at most `chunk` rows."""
    head = make_head(target)
    embed, logits = float64_target(target)
    batch = padded_batch(target)
    seen = []

    def spy_logits(hidden):
        seen.append(len(hidden))
        return logits(hidden)

    draft_rows = []
    real_draft_logits = head.draft_logits
    head.draft_logits = lambda h: draft_rows.append(len(h)) or real_draft_logits(h)
    params = [p for p in head.parameters() if p.requires_grad]
    supervised = (batch.loss_mask > 0) & batch.valid
    for steps in STEPS:
        seen.clear(), draft_rows.clear()
        got = ttt_loss(head, embed, batch, steps, target_logits=spy_logits, logit_chunk=4)
        assert max(seen) <= 4 and sum(seen) == int(supervised[:, 2:].sum())
        assert max(draft_rows) <= 4
        want = ttt_loss_ref(head, embed, batch, steps, target_logits=logits)
        assert torch.equal(got.counted, want.counted) and torch.equal(got.correct, want.correct)
        assert int(got.counted[0]) > 0
        for g, w in zip(with_grads(got.loss, params), with_grads(want.loss, params)):
            assert_float64_equal(g, w)
        assert_float64_equal(got.step_losses, want.step_losses)
    head.draft_logits = real_draft_logits

    def off_by_one(hidden):  # control: each row scored against its neighbour's target distribution
        return logits(hidden.roll(1, dims=0))

    wrong = ttt_loss(
        head, embed, batch, 7, target_logits=off_by_one, logit_chunk=len(batch.input_ids.flatten())
    )
    with pytest.raises(AssertionError):
        assert_float64_equal(wrong.loss, want.loss)


def test_activation_checkpointing_gives_the_same_gradients_and_recomputes(target):
    head = make_head(target, num_layers=2)
    embed, logits = float64_target(target)
    batch = padded_batch(target)
    params = [p for p in head.parameters() if p.requires_grad]
    calls = []
    hook = head.midlayer.self_attn.register_forward_hook(lambda *args: calls.append(torch.is_grad_enabled()))
    try:
        results = {}
        for checkpointed in (False, True):
            calls.clear()
            out = ttt_loss(head, embed, batch, 7, target_logits=logits, checkpoint_layers=checkpointed)
            forward_calls = len(calls)
            results[checkpointed] = with_grads(out.loss, params)
            results[checkpointed, "backward calls"] = len(calls) - forward_calls
            assert forward_calls == 7
    finally:
        hook.remove()
    assert results[False, "backward calls"] == 0 and results[True, "backward calls"] == 7  # recomputed
    for g, w in zip(results[True], results[False]):
        assert_float64_equal(g, w)


def test_trainer_settings_reach_the_step(tiny_dir, source, data_dir, tmp_path):
    """A first trainer step (float32, K = 3) logs the same loss and gradient norm with the dense
    reference, and with checkpointing and 3-row chunks, as by default: a PARITY comparison, the same
    function summed in another order (three steps of one layer and the LM head, about the tiny target's
    sums); a setting the model ignored would still pass, so the spy checks that each one arrives."""
    from draftsmith.train.loop.trainer import train
    from draftsmith.train.objectives import eagle3_objective

    runs = {
        "default": [],
        "dense": ["train.ttt_attention=dense"],
        "small": ["train.activation_checkpointing=true", "train.logit_chunk=3"],
    }
    logged, seen = {}, []
    real = eagle3_objective.ttt_loss

    def spy(*args, **kwargs):
        seen.append({k: kwargs[k] for k in ("attention", "logit_chunk", "checkpoint_layers")})
        return real(*args, **kwargs)

    import draftsmith.train.objectives.heads as heads

    heads.ttt_loss = spy
    try:
        for name, extra in runs.items():
            out = tmp_path / name
            overrides = run_overrides(
                tiny_dir, source, data_dir, out, "train.max_steps=1", "eval.every=0", *extra
            )
            seen.clear()
            train(load_train_config(None, overrides))
            logged[name] = read_metrics(out)[0]
            logged[name, "options"] = seen[0]
    finally:
        heads.ttt_loss = real
    assert logged["default", "options"] == {
        "attention": "decomposed",
        "logit_chunk": 1024,
        "checkpoint_layers": False,
    }
    assert logged["dense", "options"]["attention"] == "dense"
    assert logged["small", "options"] == {
        "attention": "decomposed",
        "logit_chunk": 3,
        "checkpoint_layers": True,
    }
    for name in ("dense", "small"):
        for key in ("loss", "grad_norm"):
            got, want = (torch.tensor(logged[n][key], dtype=torch.float64) for n in (name, "default"))
            assert_rounding_close(got, want, TINY_TARGET_SUMS)


@pytest.mark.parametrize(
    "extra, key",
    [
        (["train.logit_chunk=0"], "train.logit_chunk"),
        (
            ["train.activation_checkpointing=true", "train.ttt_attention=dense"],
            "train.activation_checkpointing",
        ),
    ],
)
def test_bad_ttt_settings_are_refused(extra, key, tmp_path):
    from draftsmith.runtime.errors import BadInputError

    with pytest.raises(BadInputError, match=key):
        load_train_config(None, [f"output_dir={tmp_path / 'x'}", *extra]).validate()


def test_the_cuda_default_is_the_path_ci_runs(tmp_path):
    """Issue 45 item 6: compiled FlexAttention, the CUDA default, had never run anywhere. The default on
    CUDA is now the explicit scores (run here as the oracle); FlexAttention is train.ttt_attention=flex."""
    from types import SimpleNamespace

    from draftsmith.runtime.errors import BadInputError

    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        assert default_backend(SimpleNamespace(device=torch.device("cuda"), dtype=dtype)) == "math"
    assert default_backend(torch.zeros(1)) == "flash_cpu"
    cfg = load_train_config(None, [f"output_dir={tmp_path / 'x'}", "train.ttt_attention=flex"])
    assert cfg.train.ttt_attention == "flex"
    ids = torch.zeros(1, 4, dtype=torch.long)  # FlexAttention has no backward on a CPU: refused up front
    with pytest.raises(BadInputError, match="train.ttt_attention: got 'flex', expected a CUDA device"):
        next(unroll(None, None, ids, torch.zeros(1, 4, 48), 2, attention="flex"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("steps", [1, 7])
def test_flex_backend_on_cuda_equals_the_explicit_scores(steps):
    """On CUDA the causal part runs compiled FlexAttention (its lse differentiated by FlexAttention):
    outputs and gradients against the explicit scores, in fp32 (a PARITY comparison: T + d sums)."""
    q, keys, values = mapped(
        lambda t: t.detach().float().cuda().requires_grad_(), *random_steps(steps - 1, 32, 8, 300, dim=64)
    )
    leaves = [q, *keys, *values]
    got = with_grads(ttt_attention(q, keys[0], values[0], keys[1:], values[1:], "flex"), leaves)
    want = with_grads(ttt_attention(q, keys[0], values[0], keys[1:], values[1:], "math"), leaves)
    for g, w in zip(got, want):
        assert_rounding_close(g.cpu(), w.cpu(), sums=300 + 64)


def test_bench_script_runs_both_paths_and_they_agree(tmp_path):
    """scripts/studies/ttt_step_bench.py's plumbing on CPU, at a tiny length: every path and K gets a row, the
    before and after losses agree (fp32 PARITY: the recipe's head, ~model_sums of 2 steps), and the
    attention keeps fewer bytes after than before at K = 2."""
    import importlib.util
    import json
    from pathlib import Path

    from tolerances import model_sums

    path = Path(__file__).parents[2] / "scripts" / "studies" / "ttt_step_bench.py"
    spec = importlib.util.spec_from_file_location("ttt_step_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(
        [
            "--length",
            "16",
            "--batch",
            "2",
            "--steps",
            "1,2",
            "--repeats",
            "1",
            "--out",
            str(tmp_path / "b.json"),
        ]
    )
    rows = {(r["path"], r["K"]): r for r in json.loads((tmp_path / "b.json").read_text())["rows"]}
    assert set(rows) == {(p, k) for p in ("before", "after", "after+ckpt") for k in (1, 2)}
    assert report["rows"][0]["tokens_per_s"] > 0 and all(r["peak_mb"] > 0 for r in rows.values())
    sums = model_sums(hidden=576, intermediate=1536, layers=2, seq=16, vocab=8192)
    for k in (1, 2):
        for p in ("after", "after+ckpt"):
            got, want = (torch.tensor(rows[n, k]["loss"]) for n in (p, "before"))
            assert_rounding_close(got, want, sums)
    assert rows["after", 2]["attention_mb"] < rows["before", 2]["attention_mb"]
