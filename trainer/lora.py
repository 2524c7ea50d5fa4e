"""LoRA on the training copy of the model, and its adapter files (safetensors, atomic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from forge_bridge.core.atomic import write_dir


def attach_lora(model: Any, rank: int, alpha: int, targets: Sequence[str], dropout: float = 0.0) -> Any:
    """Freeze `model` and wrap it with a trainable LoRA (peft)."""
    from peft import LoraConfig, get_peft_model

    for p in model.parameters():
        p.requires_grad_(False)
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                            lora_dropout=dropout, bias="none"))


def save_adapter(model: Any, path: str | Path) -> Path:
    """Write the LoRA adapter (safetensors) to `path` atomically: a reader finds the old complete
    version or the new one at every instant, even across a crash (`forge_bridge.core.atomic`)."""
    return write_dir(path, lambda tmp: model.save_pretrained(str(tmp), safe_serialization=True))


def load_adapter_weights(model: Any, path: str | Path) -> None:
    """Load saved LoRA weights (safetensors only) into an already-attached LoRA."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(Path(path) / "adapter_model.safetensors")))
