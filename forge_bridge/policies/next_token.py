"""Next-token choice for the embedded policy (pure functions over one row of logits), and the
forced opening that explores a tool call after a tool's result."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def distribution(logits: Any, temperature: float, top_p: float) -> tuple[Any, Any]:
    """(probs, logp) of softmax(logits / T) restricted to the top-p mass and renormalised, the
    distribution `sample_next` draws from (temperature > 0).  [V] -> [V], [V]"""
    import torch

    logp = torch.log_softmax(logits / temperature, dim=-1)  # [V]
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)  # [V], [V]
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        logp = torch.log(probs / probs.sum())
    return probs, logp


def _draw(probs: Any, generator: Any) -> int:
    import torch

    # Inverse-CDF sampling: exact like torch.multinomial, ~30x faster over a 49k vocabulary.
    cdf = probs.cumsum(-1)
    u = torch.rand(1, generator=generator, dtype=cdf.dtype) * cdf[-1]
    token = int(torch.searchsorted(cdf, u, right=True))
    if token >= probs.shape[-1] or probs[token] == 0:  # u rounded up to the total: the last token drawable
        token = int(torch.nonzero(probs).max())
    return token


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
    probs, logp = distribution(logits, temperature, top_p)
    token = _draw(probs, generator)
    return token, min(0.0, float(logp[token]))


@dataclass
class ForcedOpening:
    """Exploration by a forced opening: with probability `epsilon` (drawn once, `forced`) the
    completion starts with `tokens`, else every token is sampled from the policy's distribution
    p. Each token's recorded log-probability is the one under that mixture μ, so a trainer's
    per-token importance weight p / μ re-weights the opening's tokens (the decision to call):

        M_k = ε + (1 − ε) · p(F_1..F_k)         the mixture's probability of the opening's first k tokens (M_0 = 1)
        μ(F_k | F_<k) = M_k / M_{k−1}           a token that continues the opening (either branch)
        μ(t | F_<k)   = (1 − ε) · p(F_<k) · p(t | F_<k) / M_{k−1}    a token t ≠ F_k that leaves it
        μ(t | ...)    = p(t | ...)              every token after the opening or after leaving it

    The product of the μ's is the mixture's probability of the whole completion. What follows a
    forced opening (the tool's name, its arguments, the later turns) is trained as if the policy
    had reached it: per-token weights do not undo that shift, the bias that makes it exploration.
    A token that leaves the opening at once has weight 1 / (1 − ε), above a `tis_cap` of 2 when
    ε > 0.5."""

    tokens: list[int]
    """The opening's token ids (F)."""
    epsilon: float
    """Probability of the forced branch."""
    forced: bool
    """The branch drawn: True, the opening is emitted whatever p says."""
    k: int = 0
    """Opening tokens emitted so far."""
    on_path: bool = True
    """Every token so far continued the opening."""
    log_p: float = 0.0
    """log p(F_1..F_k)."""
    log_m: float = 0.0
    """log M_k."""

    def next(self, logits: Any, temperature: float, top_p: float, generator: Any) -> tuple[int, float]:
        """(token, log μ(token)) for the next position.  logits: [V]."""
        if not self.on_path or self.k >= len(self.tokens):
            return sample_next(logits, temperature, top_p, generator)
        probs, logp = distribution(logits, temperature, top_p)
        token = self.tokens[self.k] if self.forced else _draw(probs, generator)
        lp = float(logp[token])  # -inf when top-p cut the forced token
        if token != self.tokens[self.k]:
            self.on_path = False
            return token, min(0.0, math.log1p(-self.epsilon) + self.log_p + lp - self.log_m)
        self.k += 1
        self.log_p += lp
        log_m = math.log(self.epsilon + (1 - self.epsilon) * math.exp(self.log_p))
        step, self.log_m = log_m - self.log_m, log_m
        return token, min(0.0, step)
