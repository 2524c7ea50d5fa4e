"""The KL reference: the model the KL term holds the policy near.

It is the base model (the adapter disabled), or weights frozen once, such as the SFT warm
start's (saved in the run folder, so a resumed run keeps it).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from forge_bridge.trainer.logprobs import token_logprobs
from forge_bridge.trainer.lora import save_adapter


class Reference:
    """The model the KL term compares with: the base (None frozen) or a frozen copy."""

    def __init__(self) -> None:
        self.model: Any = None
        """The frozen reference, merged into a plain model (None: the base, adapter disabled)."""
        self.lora: dict[str, torch.Tensor] | None = None
        """The LoRA weights `model` was merged from."""

    def freeze(self, model: Any, folder: Path) -> Path:
        """Make `model`'s current LoRA the reference; saved in `folder`, so a resumed run keeps it."""
        path = save_adapter(model, folder)
        self.load(model, path)
        return path

    def load(self, model: Any, path: Path) -> None:
        """The reference from a saved LoRA of `model`'s shape."""
        from safetensors.torch import load_file

        self.load_weights(model, load_file(str(Path(path) / "adapter_model.safetensors")))

    def weights(self) -> dict[str, torch.Tensor] | None:
        """The frozen reference's LoRA as saved (peft's names), to give another process (None: the base)."""
        return self.lora

    def load_weights(self, model: Any, lora: dict[str, torch.Tensor]) -> None:
        """The reference from LoRA weights of `model`'s shape (peft's saved names)."""
        from peft import set_peft_model_state_dict

        ref = copy.deepcopy(model)
        set_peft_model_state_dict(ref, lora)
        self.lora = lora
        ref = ref.merge_and_unload().eval()  # a plain model: no LoRA cost in its forward
        for p in ref.parameters():
            p.requires_grad_(False)
        self.model = ref

    def logprobs(self, model: Any, batch: dict, share_prefix: bool) -> torch.Tensor:
        """Log-probabilities [B, T] of the batch's tokens under the reference, without gradient."""
        args = (batch["input_ids"], batch["attention_mask"], batch["loss_mask"], False, batch.get("temperature"))
        with torch.no_grad():
            if self.model is not None:
                return token_logprobs(self.model, *args)[0]
            with model.disable_adapter():
                return token_logprobs(model, *args, share_prefix=share_prefix)[0]


__all__ = ["Reference"]
