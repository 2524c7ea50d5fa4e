"""LoRA on the training copy of the model, log-probabilities of taken tokens, adapter files.

Log-probabilities are computed with the decoder body over the whole sequence but `lm_head` and
the log-softmax only at the positions that are trained on: with a 49k vocabulary, the full
[B, T, V] logits tensor would dominate the update's time and memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from forge_bridge.atomic import write_dir


def attach_lora(model: Any, rank: int, alpha: int, targets: Sequence[str], dropout: float = 0.0) -> Any:
    """Freeze `model` and wrap it with a trainable LoRA (peft)."""
    from peft import LoraConfig, get_peft_model

    for p in model.parameters():
        p.requires_grad_(False)
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                            lora_dropout=dropout, bias="none"))


def _parts(model: Any) -> tuple[Any, Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.lm_head


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   loss_mask: torch.Tensor, with_entropy: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log P(token_p | tokens_<p) at every position with loss_mask 1 (0 elsewhere).

    input_ids, attention_mask, loss_mask: [B, T] -> (logp [B, T], hidden [B, T, H],
    entropy [N] over the N trained positions, or None).
    """
    body, head = _parts(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
    targets = loss_mask[:, 1:].bool()  # [B, T-1]: token p+1 is predicted at position p
    h = hidden[:, :-1][targets]  # [N, H]
    logits = head(h).float()  # [N, V]
    logp_all = torch.log_softmax(logits, dim=-1)
    taken = input_ids[:, 1:][targets]  # [N]
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp[:, 1:][targets] = logp_all.gather(-1, taken[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1).detach() if with_entropy else None
    return logp, hidden, entropy


def save_adapter(model: Any, path: str | Path) -> Path:
    """Write the LoRA adapter (safetensors) to `path` atomically: a reader finds the old complete
    version or the new one at every instant, even across a crash (`forge_bridge.atomic`)."""
    return write_dir(path, lambda tmp: model.save_pretrained(str(tmp), safe_serialization=True))


def load_adapter_weights(model: Any, path: str | Path) -> None:
    """Load saved LoRA weights (safetensors only) into an already-attached LoRA."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(Path(path) / "adapter_model.safetensors")))
