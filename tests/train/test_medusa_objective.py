"""The Medusa-1 objective: the loss equals a hand computation in float64 (soft and data labels, padding,
loss mask, a reduced vocabulary); offline (pre-norm captures) equals online; a few optimizer steps on a
tiny target lower it; the objective class trains and saves calibrated heads that load back.

    python -m pytest tests/train/test_medusa_objective.py -q
"""

from types import SimpleNamespace

import pytest
import torch
from tiny_models import random_prompts, tiny_model, tiny_tokenizer

from draftsmith.runtime.core.target import Target
from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads
from draftsmith.train.objectives.medusa_objective import MedusaKind, MedusaModel, MedusaSection


def make_target(dtype=torch.float32):
    return Target(tiny_model("llama").to(dtype), tiny_tokenizer(), "tiny")


def rows(n=4, seed=0):
    """Rows of ids with the first two tokens unsupervised (a prompt) and the rest supervised."""
    out = []
    for ids in random_prompts(n, seed):
        ids = ids + ids[::-1]
        out.append({"input_ids": ids, "loss_mask": [0, 0] + [1] * (len(ids) - 2)})
    return out


def batch(rows_):
    width = max(len(r["input_ids"]) for r in rows_)
    ids = torch.zeros(len(rows_), width, dtype=torch.long)
    mask = torch.zeros(len(rows_), width, dtype=torch.long)
    valid = torch.zeros(len(rows_), width, dtype=torch.bool)
    for b, r in enumerate(rows_):
        n = len(r["input_ids"])
        ids[b, :n], mask[b, :n], valid[b, :n] = (
            torch.tensor(r["input_ids"]),
            torch.tensor(r["loss_mask"]),
            True,
        )
    return ids, mask, valid


def random_heads(target, dtype, **options):
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig.for_target(target, num_heads=3, **options)).init_from_target(target)
    with torch.no_grad():
        for p in heads.blocks.parameters():
            p.normal_(0, 0.3)
    return heads.to(dtype)


def hand_loss(heads, target, rows_, labels, decay=0.8, vocab=None):
    """sum_k decay^k mean_t CE_k, one position at a time, every sequence on its own (no padding)."""
    total = 0.0
    for k in range(heads.config.num_heads):
        ces = []
        for r in rows_:
            ids = torch.tensor([r["input_ids"]])
            h = target.decoder(input_ids=ids).last_hidden_state[0]  # [T, H]
            for t in range(len(r["input_ids"]) - k - 2):
                if not r["loss_mask"][t + k + 2]:
                    continue
                logits = heads.logits(target, heads(h[t]))[k]  # [V]
                teacher = target.lm_head(h[t + k + 1]).double()
                keep = vocab if vocab is not None else torch.arange(len(teacher))
                log_q = torch.log_softmax(logits[keep].double(), -1)
                if labels == "target":
                    ces.append(-(torch.softmax(teacher[keep], -1) * log_q).sum())
                else:
                    token = r["input_ids"][t + k + 2]
                    if token in keep.tolist():
                        ces.append(-log_q[keep.tolist().index(token)])
        total += decay**k * torch.stack(ces).mean()
    return total


@torch.no_grad()
@pytest.mark.parametrize("labels", ["target", "data"])
@pytest.mark.parametrize("reduced", [False, True])
def test_loss_equals_the_hand_computation_in_float64(labels, reduced):
    target = make_target(torch.float64)
    vocab = torch.arange(0, 128, 2) if reduced else None
    options = dict(draft_vocab_size=64, original_lm_head=False) if reduced else {}
    heads = random_heads(target, torch.float64, **options)
    if reduced:
        heads.set_draft_vocab(vocab)
        heads.init_from_target(target)
        heads.to(torch.float64)
    data = rows()
    model = MedusaModel(heads, target, labels, 0.8)
    out = model.objective(*batch(data))
    expected = hand_loss(heads, target, data, labels, vocab=vocab)
    assert abs(float(out.loss) - float(expected)) < 1e-10
    assert out.counted.tolist() == [sum(sum(r["loss_mask"][k + 2 :]) for r in data) for k in range(3)]


@torch.no_grad()
def test_offline_equals_online():
    target = make_target()
    heads = random_heads(target, torch.float32)
    ids, mask, valid = batch(rows())
    captured = []
    hook = target.decoder.norm.register_forward_hook(lambda _m, args, _out: captured.append(args[0]))
    target.decoder(input_ids=ids, attention_mask=valid.long())
    hook.remove()
    model = MedusaModel(heads, target, "target", 0.8)
    online, offline = model(ids, mask, valid), model(ids, mask, valid, last_hidden=captured[0])
    torch.testing.assert_close(offline[0], online[0])
    assert torch.equal(offline[1], online[1]) and torch.equal(offline[2], online[2])


def kind(target, **section):
    cfg = SimpleNamespace(
        head=MedusaSection(num_heads=3, **section).validate(),
        train=SimpleNamespace(step_decay=0.8, batch_size=2),
    )
    return MedusaKind(cfg, target, (), None)


@pytest.mark.parametrize("shared", [True, False])
def test_a_few_steps_lower_the_loss(shared):
    target = make_target()
    k = kind(target, original_lm_head=shared)
    params = [p for p in k.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-3)
    inputs = k.batch(rows(8, seed=1), "cpu")
    losses = []
    for _ in range(15):
        loss, correct, counted = k.model(**inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.9 * losses[0], losses
    assert counted.shape == correct.shape == (3,)
    target_params = {id(p) for p in target.model.parameters()}
    assert not any(id(p) in target_params for p in params)  # the target stays frozen (not in the model)


def test_save_final_calibrates_and_loads_back(tmp_path):
    target = make_target()
    k = kind(target, calibration_topk=3)
    state = {f"heads.{n}": v for n, v in k.head.state_dict().items()}
    k.calibration_rows = lambda: rows(3, seed=2)  # the validation split, here three rows
    k.save_final(state, tmp_path / "final")
    back = MedusaHeads.from_pretrained(tmp_path / "final", target)
    acc = torch.tensor(back.config.accuracies)  # [3, 3]
    assert acc.shape == (3, 3) and bool((acc.sum(1) <= 1 + 1e-9).all())
