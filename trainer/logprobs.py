"""Log-probabilities of the taken tokens under the model being trained.

The decoder body runs over the whole sequence, but `lm_head` and the log-softmax only at the
positions that are trained on: with a 49k vocabulary, the full [B, T, V] logits tensor would
dominate the update's time and memory.
"""

from __future__ import annotations

from typing import Any

import torch


def _parts(model: Any) -> tuple[Any, Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.lm_head


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   loss_mask: torch.Tensor, with_entropy: bool = False,
                   temperature: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log P(token_p | tokens_<p) at every position with loss_mask 1 (0 elsewhere), under
    softmax(logits / T) with each row's sampling temperature T (None: 1), as the tokens were drawn.

    input_ids, attention_mask, loss_mask: [B, T], temperature: [B] -> (logp [B, T],
    hidden [B, T, H], entropy [N] over the N trained positions, or None).
    """
    body, head = _parts(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
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
