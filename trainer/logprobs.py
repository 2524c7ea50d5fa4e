"""Log-probabilities of the taken tokens under the model being trained.

The decoder body runs over the whole sequence, but `lm_head` and the log-softmax only at the
positions that are trained on, and a chunk of positions at a time (`sampled_logprobs`): with a
49k vocabulary, a full [B, T, V] (or even [N, V]) float32 logits tensor, and the log-softmax
autograd keeps of it, would dominate the update's memory (19.6 GB at microbatch 8, seen by a
user; docs/memory.md).

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
                   temperature: torch.Tensor | None = None, share_prefix: bool = True, body: Any = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log P(token_p | tokens_<p) at every position with loss_mask 1 (0 elsewhere), under
    softmax(logits / T) with each row's sampling temperature T (None: 1), as the tokens were drawn.

    input_ids, attention_mask, loss_mask: [B, T] (right-padded), temperature: [B] -> (logp
    [B, T], hidden [B, T, H], entropy [N] over the N trained positions, or None).
    `share_prefix`: run the rows' common first tokens once (off under activation checkpointing,
    which refuses a cache). `body`: what runs the decoder body in its place (its DDP wrapper).
    """
    own, head = _parts(model)
    body = own if body is None else body
    hidden = body_hidden(body, input_ids, attention_mask, share_prefix)  # [B, T, H]
    targets = loss_mask[:, 1:].bool()  # [B, T-1]: token p+1 is predicted at position p
    h = hidden[:, :-1][targets]  # [N, H]
    taken = input_ids[:, 1:][targets]  # [N]
    inverse = None
    if temperature is not None:
        rows = targets.nonzero()[:, 0]  # [N]: the sequence each trained position belongs to
        inverse = 1.0 / temperature.to(h.device).float()[rows]  # [N]
    picked, entropy = sampled_logprobs(head, h, taken, inverse, with_entropy)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp[:, 1:][targets] = picked
    return logp, hidden, entropy


EAGER_MAX_LEN = 512
"""On a CPU, batches up to this many tokens run eager attention, longer ones sdpa (`choose_attention`)."""


def choose_attention(model: Any, length: int, eager_up_to: int = EAGER_MAX_LEN) -> None:
    """Set the attention of a transformers `model` for a batch of `length` tokens. On a CPU,
    sdpa's backward is the slowest op of short-sequence updates and plain matmul (eager)
    attention is faster there (a third of the update with prefix sharing), but eager keeps
    every head's [length, length] weights for the backward pass: past `eager_up_to` tokens,
    sdpa's fused kernel, whose memory grows with the length only."""
    wanted = "eager" if length <= eager_up_to else "sdpa"
    if model.config._attn_implementation != wanted:
        model.set_attn_implementation(wanted)


CHUNK_POSITIONS = 256
"""Trained positions whose [C, V] float32 logits exist at once (a 49k vocabulary: 50 MB)."""


def sampled_logprobs(head: Any, h: torch.Tensor, taken: torch.Tensor, inverse_temperature: torch.Tensor | None,
                     with_entropy: bool = False, chunk: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(head(h) * 1/T)[taken] at N positions, `chunk` positions at a time; the full
    [N, V] float32 logits never exist, in the forward pass or the backward one (each chunk's
    logits are recomputed from its hidden states when the gradient flows back, as TRL's
    `selective_log_softmax` avoids the [N, V] log-softmax). `chunk` None: `CHUNK_POSITIONS`.

    h: [N, H], taken: [N], inverse_temperature: [N] or None -> (logp [N], entropy [N] or None,
    detached)."""
    from torch.utils.checkpoint import checkpoint

    chunk = chunk or CHUNK_POSITIONS
    logps, entropies = [], []
    for start in range(0, h.shape[0], chunk):
        part = slice(start, start + chunk)
        scale = None if inverse_temperature is None else inverse_temperature[part]
        if torch.is_grad_enabled() and h.requires_grad:
            logps.append(checkpoint(_picked, head, h[part], taken[part], scale, use_reentrant=False))
        else:
            logps.append(_picked(head, h[part], taken[part], scale))
        if with_entropy:
            with torch.no_grad():
                logits = _logits(head, h[part], scale)
                logits = torch.log_softmax(logits, -1)
                entropies.append(-(logits.exp() * logits).sum(-1))
    empty = h.new_zeros(0, dtype=torch.float32)
    logp = torch.cat(logps) if logps else empty
    entropy = (torch.cat(entropies) if entropies else empty) if with_entropy else None
    return logp, entropy


def _logits(head: Any, h: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """[C, H] -> [C, V] float32 logits, each row times its inverse temperature."""
    logits = head(h).float()
    return logits if scale is None else logits * scale[:, None]


def _picked(head: Any, h: torch.Tensor, taken: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """log softmax of the chunk's logits at its taken tokens: [C, H], [C] -> [C]."""
    logits = _logits(head, h, scale)
    return logits.gather(-1, taken[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)


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
