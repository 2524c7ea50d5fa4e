"""LoRA buffers in the embedded model, reused across adapter versions.

Loading an adapter into a peft model builds its LoRA modules (~150 ms of Python for 120 target
layers of SmolLM2, whatever the weights' size). A training run publishes adapters of one shape
(rank, alpha, target modules) again and again, so the pool builds a few LoRA buffers of that
shape once and a new version only copies its weights into a free buffer (a few ms); a retired
version's buffer is free again once no call uses it. An adapter of another shape is loaded the
ordinary way under its own name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge_bridge.policies.models import peft_wrapping

_SHAPE = ("r", "lora_alpha", "use_rslora", "use_dora", "bias", "fan_in_fan_out")


def shape_of(path: Path) -> tuple:
    """What two adapters must share to use the same buffer: their LoRA settings and weight names."""
    from safetensors import safe_open

    config = json.loads((path / "adapter_config.json").read_text())
    targets = config.get("target_modules")
    with safe_open(str(path / "adapter_model.safetensors"), framework="pt") as f:
        keys = frozenset(f.keys())
    return (tuple(config.get(k) for k in _SHAPE),
            frozenset(targets) if isinstance(targets, list) else targets, keys)


class AdapterPool:
    """Buffers named 'pool-<n>' in one peft model, each holding one version's weights."""

    def __init__(self, spare: int) -> None:
        self.spare = spare
        """Slots built beyond the first at the first load, so the next versions only copy."""
        self.shape: tuple | None = None
        self.free: list[str] = []
        self.holder: dict[str, str] = {}
        """version -> the buffer holding its weights."""
        self._params: dict[str, dict[str, Any]] = {}
        self._count = 0

    def name_of(self, version: str | None) -> str | None:
        """The peft adapter name serving `version` (its own name when it is not pooled)."""
        return None if version is None else self.holder.get(version, version)

    def fits(self, shape: tuple) -> bool:
        return self.shape is None or shape == self.shape

    def first(self, model: Any, path: Path, version: str) -> Any:
        """The peft model, built around `model` with this adapter in buffer 'pool-0' and spare
        buffers of the same shape."""
        from peft import PeftModel

        self.shape = shape_of(path)
        name = self._new_name()
        with peft_wrapping():
            peft = PeftModel.from_pretrained(model, str(path), adapter_name=name, is_trainable=False)
        self.holder[version] = name
        for _ in range(self.spare):
            self.free.append(self._add(peft))
        return peft

    def load(self, peft: Any, path: Path, version: str) -> None:
        """Copy the adapter's weights into a free buffer (built if none is free)."""
        from safetensors.torch import load_file

        name = self.free.pop() if self.free else self._add(peft)
        try:
            params = self._buffer_params(peft, name)
            for key, tensor in load_file(str(path / "adapter_model.safetensors")).items():
                params[key].data.copy_(tensor)
        except Exception:
            self.free.append(name)
            raise
        self.holder[version] = name

    def release(self, version: str) -> bool:
        """Free the buffer of a version no longer served; False if it was not pooled."""
        name = self.holder.pop(version, None)
        if name is None:
            return False
        self.free.append(name)
        return True

    def _new_name(self) -> str:
        self._count += 1
        return f"pool-{self._count - 1}"

    def _add(self, peft: Any) -> str:
        name = self._new_name()
        peft.add_adapter(name, peft.peft_config["pool-0"])
        return name

    def _buffer_params(self, peft: Any, name: str) -> dict[str, Any]:
        """saved key ('...q_proj.lora_A.weight') -> the buffer's parameter."""
        if name not in self._params:
            own = f".{name}."
            self._params[name] = {n.replace(own, "."): p for n, p in peft.named_parameters() if own in n}
        return self._params[name]
