"""Next-token choice for the embedded policy (pure function over one row of logits)."""

from __future__ import annotations

from typing import Any


def sample_next(logits: Any, temperature: float, top_p: float, generator: Any) -> tuple[int, float]:
    """Greedy at temperature 0; else sample from softmax(logits / T) restricted to the top-p mass.
    Returns (token, its log-probability under the distribution it was drawn from: log
    softmax(logits / T) renormalised over the top-p set; greedy: the untempered log softmax).

    logits: [V] float tensor.
    """
    import torch

    if temperature == 0:
        token = int(torch.argmax(logits))
        return token, min(0.0, float(torch.log_softmax(logits, dim=-1)[token]))
    logp = torch.log_softmax(logits / temperature, dim=-1)  # [V]
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)  # [V], [V]
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        logp = torch.log(probs / probs.sum())
    # Inverse-CDF sampling: exact like torch.multinomial, ~30x faster over a 49k vocabulary.
    cdf = probs.cumsum(-1)
    u = torch.rand(1, generator=generator, dtype=cdf.dtype) * cdf[-1]
    token = int(torch.searchsorted(cdf, u, right=True))
    if token >= probs.shape[-1] or probs[token] == 0:  # u rounded up to the total: the last token drawable
        token = int(torch.nonzero(probs).max())
    return token, min(0.0, float(logp[token]))
