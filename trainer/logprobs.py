"""Log-probabilities of the taken tokens under the model being trained.

The decoder body runs over the whole sequence, but `lm_head` and the log-softmax only at the
positions that are trained on: with a 49k vocabulary, the full [B, T, V] logits tensor would
dominate the update's time and memory.

The rows of a batch usually start with the same tokens (the system prompt and tool schemas of
one agent; the first prompt of one task's rollouts). That shared prefix runs through the body
once, and its KV, expanded to every row, is the cache the rest of each row attends to:
autograd sums each row's gradient back into the one prefix pass, so the result is the same as
a pass over every full row, for less compute (about half the update's, in the demo).
"""

from __future__ import annotations

from typing import Any

import torch


def _parts(model: Any) -> tuple[Any, Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.lm_head


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   loss_mask: torch.Tensor, with_entropy: bool = False,
                   temperature: torch.Tensor | None = None, share_prefix: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log P(token_p | tokens_<p) at every position with loss_mask 1 (0 elsewhere), under
    softmax(logits / T) with each row's sampling temperature T (None: 1), as the tokens were drawn.

    input_ids, attention_mask, loss_mask: [B, T] (right-padded), temperature: [B] -> (logp
    [B, T], hidden [B, T, H], entropy [N] over the N trained positions, or None).
    `share_prefix`: run the rows' common first tokens once (off under activation checkpointing,
    which refuses a cache).
    """
    body, head = _parts(model)
    hidden = body_hidden(body, input_ids, attention_mask, share_prefix)  # [B, T, H]
    targets = loss_mask[:, 1:].bool()  # [B, T-1]: token p+1 is predicted at position p
    h = hidden[:, :-1][targets]  # [N, H]
    logits = head(h).float()  # [N, V]
    if temperature is not None:
        rows = targets.nonzero()[:, 0]  # [N]: the sequence each trained position belongs to
        logits = logits / temperature.to(logits.device)[rows, None]
    logp_all = torch.log_softmax(logits, dim=-1)
    taken = input_ids[:, 1:][targets]  # [N]
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp[:, 1:][targets] = logp_all.gather(-1, taken[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1).detach() if with_entropy else None
    return logp, hidden, entropy


MIN_SHARED_PREFIX = 16
"""Fewest common leading tokens worth a separate prefix pass."""


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading tokens every row has, the same and unpadded, leaving each row at least
    one more position.  [B, T], [B, T] -> int (0 for a single row)."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)  # [T]
    return min(int(same.int().cumprod(0).sum()), input_ids.shape[1] - 1)


def body_hidden(body: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                share_prefix: bool = True) -> torch.Tensor:
    """The decoder body's last hidden states [B, T, H] of right-padded rows, their shared prefix
    run once when it is long enough (and the model keeps a plain, growing cache)."""
    B, T = input_ids.shape
    P = shared_prefix_length(input_ids, attention_mask) if share_prefix else 0
    if P >= MIN_SHARED_PREFIX:
        from transformers.cache_utils import DynamicLayer

        first = body(input_ids=input_ids[:1, :P], use_cache=True)
        cache = first.cache
        if cache is not None and all(type(layer) is DynamicLayer for layer in cache.layers):
            for layer in cache.layers:  # [1, heads, P, dim] -> [B, heads, P, dim], no copy
                layer.keys = layer.keys.expand(B, -1, -1, -1)
                layer.values = layer.values.expand(B, -1, -1, -1)
            positions = torch.arange(P, T, device=input_ids.device)[None].expand(B, -1)
            rest = body(input_ids=input_ids[:, P:], attention_mask=attention_mask, position_ids=positions,
                        cache=cache, use_cache=True).last_hidden_state  # [B, T-P, H]
            return torch.cat([first.last_hidden_state.expand(B, -1, -1), rest], 1)
    return body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
