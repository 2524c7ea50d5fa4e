"""token_logprobs computes lm_head and the log-softmax only where the loss trains; at those
positions it must equal the full model's log-probabilities and entropy."""

import torch

from forge_bridge.policies import models
from forge_bridge.trainer.logprobs import token_logprobs


def test_logprobs_and_entropy_at_trained_positions_match_the_full_model():
    model, _ = models.tiny(seed=3)
    ids = torch.tensor([[5, 9, 13, 7, 2, 0], [4, 8, 15, 16, 23, 42]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]], dtype=torch.float32)
    with torch.no_grad():
        logp, hidden, entropy = token_logprobs(model, ids, attention, mask, with_entropy=True)
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), -1)
    expected = torch.zeros_like(logp)
    for b in range(2):
        for p in range(1, ids.shape[1]):
            if mask[b, p]:
                expected[b, p] = full[b, p - 1, ids[b, p]]
    assert torch.allclose(logp, expected, atol=1e-5)
    assert (logp[mask == 0] == 0).all() and hidden.shape[:2] == ids.shape
    trained = mask[:, 1:].bool()
    rows = full[:, :-1][trained]  # [N, V], the distributions the trained tokens were drawn from
    assert torch.allclose(entropy, -(rows.exp() * rows).sum(-1), atol=1e-4)
