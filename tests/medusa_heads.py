"""Medusa heads for the runtime tests (tests/runtime/test_medusa*.py): random heads with nonzero W (drafts
vary) and heads fitted to the tiny target's greedy continuations (drafts accept)."""

import torch

from draftsmith.runtime.core.engine import generate_plain
from draftsmith.runtime.heads.medusa import MedusaConfig, MedusaHeads, calibrate, with_accuracies
from draftsmith.runtime.verify.sampling import SamplingParams

GREEDY = SamplingParams()


def random_heads(target, heads=4, seed=0, **options) -> MedusaHeads:
    """Heads with W ~ N(0, 0.3^2): the drafts differ from the target's next-token argmax."""
    torch.manual_seed(seed)
    medusa = MedusaHeads(MedusaConfig.for_target(target, num_heads=heads, **options)).init_from_target(target)
    with torch.no_grad():
        for block in medusa.blocks:
            for layer in block.layers:
                layer.weight.normal_(0, 0.3)
    return medusa.eval()


def fitted_heads(target, prompts, heads=3, steps=300) -> MedusaHeads:
    """Heads fitted to (memorizing) the tiny target's greedy continuations of `prompts` (CE on its token
    t+k+2 from h_t), so the engine accepts drafts there, partly and fully; calibrated on the same."""
    medusa = random_heads(target, heads, seed=2, original_lm_head=False, num_layers=2).train()
    seqs = [p + r.token_ids for p, r in zip(prompts, generate_plain(target, prompts, GREEDY, 24))]
    with torch.no_grad():
        states = torch.cat([target.decoder(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])
    labels = torch.full((heads, states.shape[0]), -100)  # [K, P]: token t+k+2 of each position t
    at = 0
    for seq in seqs:
        for k in range(heads):
            labels[k, at : at + len(seq) - k - 2] = torch.tensor(seq[k + 2 :])
        at += len(seq)
    optimizer = torch.optim.Adam(medusa.parameters(), lr=1e-2)
    for _ in range(steps):
        logits = medusa.logits(target, medusa(states))  # [K, P, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    medusa.eval()
    return with_accuracies(medusa, calibrate(medusa, target, seqs, topk=4))
