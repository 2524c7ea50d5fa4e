"""Publishing adapter versions to the live policy, and the frozen KL reference.

Version N of the shared LoRA is '<run>-vN', of a role slot's '<run>-<slot>-vN'; each is saved
atomically under `<run folder>/adapters/` and loaded into the policy's slot, which then serves
it on its next call. The reference the KL term holds the policy near is the base model (the
adapter disabled), or weights frozen once, such as the SFT warm start's.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import torch

from forge_bridge.policies.base import DEFAULT_SLOT, Policy
from forge_bridge.trainer.logprobs import token_logprobs
from forge_bridge.trainer.lora import save_adapter


WARM_START = "sft"
"""The version the SFT warm start publishes ('<run>-sft'): not an RL iteration, whose versions
count from v1."""


def version_name(run_name: str, n: int | str, slot: str = DEFAULT_SLOT) -> str:
    """'<run>-vN' for the shared LoRA, '<run>-<slot>-vN' for a role slot's; '<run>-sft' and
    '<run>-<slot>-sft' for the warm start (n = `WARM_START`)."""
    tag = WARM_START if n == WARM_START else f"v{n}"
    return f"{run_name}-{tag}" if slot == DEFAULT_SLOT else f"{run_name}-{slot}-{tag}"


def publish_all(model: Any, policy: Policy, folder: Path, run_name: str, slots: Sequence[str],
                n: int | str, weights: dict | None = None) -> dict[str, str]:
    """Save version `n` of every slot's LoRA atomically and make the live policy serve each from
    its slot (a version it already holds is not loaded twice); returns slot -> version.
    `weights`: the LoRA's full tensors by parameter name, when the model holds a shard only."""
    versions = {}
    for slot in slots:
        version = versions[slot] = version_name(run_name, n, slot)
        path = save_adapter(model, folder / version, adapter=slot, weights=weights)
        if version not in policy.versions(slot):
            policy.load_adapter(path, version, slot=slot)
    return versions


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


__all__ = ["Reference", "WARM_START", "publish_all", "version_name"]
