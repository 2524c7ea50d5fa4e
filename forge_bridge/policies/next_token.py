"""Next-token choice for the embedded policy (pure function over one row of logits)."""

from __future__ import annotations

from typing import Any


def sample_next(logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    """Greedy at temperature 0; else sample from softmax(logits / T) restricted to the top-p mass.

    logits: [V] float tensor.
    """
    import torch

    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)  # [V]
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)  # [V], [V]
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
