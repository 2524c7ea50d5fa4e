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


def test_tempered_logprobs_are_log_softmax_of_logits_over_each_rows_temperature():
    model, _ = models.tiny(seed=3)
    ids = torch.tensor([[5, 9, 13, 7], [4, 8, 15, 16]])
    attention = torch.ones_like(ids)
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.float32)
    temps = torch.tensor([0.7, 1.5])
    with torch.no_grad():
        logp, _, _ = token_logprobs(model, ids, attention, mask, temperature=temps)
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
    for b in range(2):
        tempered = torch.log_softmax(logits[b] / temps[b], -1)
        for p in range(1, 4):
            if mask[b, p]:
                assert abs(float(logp[b, p]) - float(tempered[p - 1, ids[b, p]])) < 1e-5
    untempered = torch.log_softmax(logits[0], -1)[0, 9]
    assert abs(float(logp[0, 1]) - float(untempered)) > 1e-3  # T = 0.7 really changed them


def test_the_sampler_records_the_logprob_of_the_distribution_it_drew_from():
    from forge_bridge.policies.next_token import sample_next

    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        token, logp = sample_next(logits, 0.7, 1.0, g)
        assert logp == torch.log_softmax(logits / 0.7, -1)[token].item()
    # top-p 0.8 at T = 1: probabilities 0.609, 0.224, 0.136, 0.030 keep the first two (0.609 <
    # 0.8, 0.833 >= 0.8), renormalised: log(0.609 / 0.833) for token 0
    p = torch.softmax(logits, -1)
    for _ in range(20):
        token, logp = sample_next(logits, 1.0, 0.8, g)
        assert token in (0, 1)
        assert abs(logp - float(torch.log(p[token] / (p[0] + p[1])))) < 1e-5
    token, logp = sample_next(logits, 0.0, 1.0, g)  # greedy: the untempered log-probability
    assert token == 0 and logp == torch.log_softmax(logits, -1)[0].item()


def test_the_sampler_draws_from_that_distribution():
    """20,000 draws at T = 0.7 and at top-p 0.8: each token's frequency within 0.015 of its
    probability (about 4 standard errors), and tokens outside the top-p set never drawn."""
    from forge_bridge.policies.next_token import sample_next

    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, -30.0])
    g = torch.Generator().manual_seed(1)
    for temperature, top_p in ((0.7, 1.0), (1.0, 0.8)):
        p = torch.softmax(logits / temperature, -1)
        if top_p < 1.0:
            p = torch.tensor([p[0], p[1], 0, 0, 0]) / (p[0] + p[1])
        counts = torch.zeros(5)
        for _ in range(20000):
            counts[sample_next(logits, temperature, top_p, g)[0]] += 1
        assert torch.allclose(counts / 20000, p, atol=0.015), (temperature, top_p, counts / 20000, p)
        if top_p < 1.0:
            assert counts[2:].sum() == 0


def test_a_shared_prefix_runs_once_and_gives_the_same_logprobs_and_gradients():
    from forge_bridge.trainer.logprobs import MIN_SHARED_PREFIX, shared_prefix_length
    from forge_bridge.trainer.lora import attach_lora

    model = attach_lora(models.tiny(seed=3)[0], rank=4, alpha=8, targets=["q_proj", "v_proj", "down_proj"])
    torch.manual_seed(0)
    for p in model.parameters():  # LoRA B starts at 0: give the adapter a real effect
        if p.requires_grad:
            p.data.normal_(0, 0.05)
    prefix = torch.randint(3, 90, (MIN_SHARED_PREFIX + 4,)).tolist()
    rows = [prefix + [7, 9, 11], prefix + [5], prefix + [8, 8, 8, 8, 12]]  # unequal tails
    T = max(map(len, rows))
    ids = torch.zeros((3, T), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for b, r in enumerate(rows):  # right padding, as collate pads
        ids[b, :len(r)], attention[b, :len(r)] = torch.tensor(r), 1
    mask = attention.float().clone()
    mask[:, :10] = 0  # the prefix's later tokens are trained too, so its gradient matters
    assert shared_prefix_length(ids, attention) == len(prefix)
    assert shared_prefix_length(ids[:1], attention[:1]) == 0  # one row: nothing to share

    def run(share: bool):
        model.zero_grad()
        logp, hidden, _ = token_logprobs(model, ids, attention, mask, share_prefix=share)
        (logp.sum() + hidden[attention.bool()].pow(2).mean()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return logp.detach(), hidden.detach(), grads

    logp_full, hidden_full, grads_full = run(False)
    logp_shared, hidden_shared, grads_shared = run(True)
    assert torch.allclose(logp_shared, logp_full, atol=1e-5)
    live = attention.bool()
    assert torch.allclose(hidden_shared[live], hidden_full[live], atol=1e-5)
    assert grads_full and all(torch.allclose(grads_shared[n], grads_full[n], atol=1e-5, rtol=1e-4)
                              for n in grads_full)
    assert any(float(g.abs().sum()) > 0 for g in grads_full.values())


def test_chunked_logprobs_give_the_same_loss_and_gradients_as_one_full_log_softmax():
    """The memory change (issue 43): the sampled tokens' log-probabilities a few positions at a
    time, the logits recomputed in the backward pass, against the [N, V] log-softmax it replaced."""
    from forge_bridge.trainer import logprobs
    from forge_bridge.trainer.lora import adapter_parameters, attach_lora

    base, _ = models.tiny(seed=5)
    model = attach_lora(base, 4, 8, ("q_proj", "v_proj"))
    for p in adapter_parameters(model, "default"):
        torch.nn.init.normal_(p, std=0.05)  # a LoRA B of zeros would give zero gradients to A
    ids = torch.tensor([[5, 9, 13, 7, 2, 11, 0, 0], [4, 8, 15, 16, 23, 42, 3, 6]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1]], dtype=torch.float32)
    temps = torch.tensor([0.7, 1.3])
    weights = torch.linspace(-1, 2, 16).reshape(2, 8)
    params = adapter_parameters(model, "default")

    def full_reference():
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
        logp_all = torch.log_softmax(logits / temps[:, None, None], -1)[:, :-1]
        picked = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]
        return (picked * weights[:, 1:]).sum()

    def chunked(chunk):
        old = logprobs.CHUNK_POSITIONS
        logprobs.CHUNK_POSITIONS = chunk
        try:
            logp, _, _ = logprobs.token_logprobs(model, ids, attention, mask, temperature=temps, share_prefix=False)
        finally:
            logprobs.CHUNK_POSITIONS = old
        return (logp * weights).sum()

    grads = []
    for loss_of in (full_reference, lambda: chunked(3), lambda: chunked(256)):
        model.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        grads.append((float(loss.detach()), torch.cat([p.grad.flatten() for p in params])))
    (ref_loss, ref_grad), *others = grads
    assert ref_grad.abs().max() > 1e-4  # the gradients compared are not all zero
    for loss, grad in others:
        assert abs(loss - ref_loss) < 1e-5
        assert torch.allclose(grad, ref_grad, atol=1e-5, rtol=0)
