"""LoRA on the training copy of the model, and its adapter files (safetensors, atomic).

A run trains one adapter, peft's `default`, or one per crew role slot besides it (`add_adapters`):
each role's LoRA lives in the same peft model under the slot's name, and `set_adapter` picks
which one a forward pass uses and trains.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Sequence

from forge_bridge.core.atomic import write_dir
from forge_bridge.policies.base import DEFAULT_SLOT
from forge_bridge.policies.models import peft_wrapping

DEFAULT_ADAPTER = DEFAULT_SLOT
"""peft's name for the first adapter ('default'), which is also the policy's default slot: the
shared LoRA; every other adapter is named after the slot it is published to."""


def _config(rank: int, alpha: int, targets: Sequence[str], dropout: float) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=dropout, bias="none")


def attach_lora(model: Any, rank: int, alpha: int, targets: Sequence[str], dropout: float = 0.0,
                extra_adapters: Sequence[str] = (), seed: int | None = None) -> Any:
    """Freeze `model` and wrap it with a trainable LoRA (peft), plus one more LoRA of the same
    shape for each name in `extra_adapters`; `default` is the active one. `seed`: draw the LoRAs'
    A matrices (peft's init: Kaiming-uniform, B = 0) from a generator of their own, so the start
    is the same whatever else in the process drew from torch's global one (a policy sampling in
    another thread, say); None: peft's own draw from the global generator."""
    import torch
    from peft import get_peft_model

    for p in model.parameters():
        p.requires_grad_(False)
    with peft_wrapping():
        peft_model = get_peft_model(model, _config(rank, alpha, targets, dropout))
    for name in extra_adapters:
        peft_model.add_adapter(name, _config(rank, alpha, targets, dropout))
    peft_model.set_adapter(DEFAULT_ADAPTER)
    if seed is not None:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        with torch.no_grad():
            for _, p in sorted((n, p) for n, p in peft_model.named_parameters() if ".lora_A." in n):
                fresh = torch.empty(p.shape, dtype=torch.float32)
                torch.nn.init.kaiming_uniform_(fresh, a=math.sqrt(5), generator=generator)
                p.copy_(fresh)
    return peft_model


def adapter_parameters(model: Any, adapter: str = DEFAULT_ADAPTER) -> list:
    """The LoRA parameters of one adapter, in the model's order (whether or not it is active)."""
    own = re.compile(rf"\.lora_[AB]\.{re.escape(adapter)}\.")
    return [p for name, p in model.named_parameters() if own.search(name)]


def is_lora(name: str) -> bool:
    """Whether a parameter of the peft model (by name) belongs to a LoRA, whichever adapter."""
    return ".lora_A." in name or ".lora_B." in name


def save_adapter(model: Any, path: str | Path, adapter: str = DEFAULT_ADAPTER, weights: dict | None = None) -> Path:
    """Write one LoRA adapter (safetensors) to `path` atomically: a reader finds the old complete
    version or the new one at every instant, even across a crash (`forge_bridge.core.atomic`).
    `weights`: the LoRA's tensors by parameter name, where the model's own are shards (FSDP2)."""
    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp), safe_serialization=True, selected_adapters=[adapter],
                              **({"state_dict": weights} if weights is not None else {}))
        if adapter != DEFAULT_ADAPTER:  # peft writes a named adapter into a subfolder
            for item in (tmp / adapter).iterdir():
                os.replace(item, tmp / item.name)
            (tmp / adapter).rmdir()
    return write_dir(path, write)

