"""Token log-probabilities of given completions under a causal LM, in padded batches: the embedded
policy's `score_many` (a teacher judging every token the student sampled, for distillation).

Rows are left-padded, so every completion ends at the last column and only the last
`longest completion + 1` positions go through the LM head ([n, keep, V] logits, not [n, T, V]);
the positions count from each row's first real token, so a row scores as it would alone (up to
the float rounding of padded attention). Rows are sorted by length and cut into passes of at
most `PASS_TOKENS` padded tokens.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

PASS_TOKENS = 4096
"""Padded tokens (rows x the longest row) one forward pass takes at most."""


def passes(lengths: Sequence[int], budget: int | None = None) -> list[list[int]]:
    """The row indices of each pass, shortest rows first, at most `budget` (None: `PASS_TOKENS`)
    padded tokens a pass; a row longer than the budget runs alone."""
    budget = budget or PASS_TOKENS
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    for i in order:  # sorted: the row joining a pass is its longest
        if out and (len(out[-1]) + 1) * lengths[i] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def completion_logprobs(model: Any, pairs: Sequence[tuple[list[int], list[int]]], *, pad_id: int, device: str,
                        names: Callable[[int], dict] = lambda n: {}, lock: Any = None) -> list[list[float]]:
    """log P(completion token k | prompt, completion[:k]) of every pair, in order, one padded
    forward pass per `passes` chunk; `names(n)`: extra arguments for a pass of n rows (peft's
    per-row `adapter_names`); `lock`: held during each pass (the model's, shared with its decoding)."""
    import torch

    out: list[list[float]] = [[] for _ in pairs]
    for chunk in passes([len(p) + len(c) for p, c in pairs]):
        rows = [pairs[i][0] + pairs[i][1] for i in chunk]
        width, keep = max(map(len, rows)), max(len(pairs[i][1]) for i in chunk) + 1
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):  # left padding: every completion ends at the last column
            ids[r, width - len(row):] = torch.tensor(row)
            mask[r, width - len(row):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with lock or contextlib.nullcontext(), torch.inference_mode():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                           logits_to_keep=keep, **names(len(rows))).logits.float()  # [n, keep, V]
            for r, i in enumerate(chunk):
                completion = pairs[i][1]
                # the logits at column j predict the token at j + 1: the completion's are the
                # len(completion) columns before the last
                predicting = logits[r, keep - 1 - len(completion):keep - 1]
                taken = torch.tensor(completion, device=predicting.device)[:, None]
                out[i] = torch.log_softmax(predicting, -1).gather(-1, taken)[:, 0].cpu().tolist()
    return out


__all__ = ["PASS_TOKENS", "completion_logprobs", "passes"]
