"""Checkpoints that survive a SIGKILL: written to a temporary folder, renamed into place, and
only then named by the `latest` pointer (itself replaced atomically). Tensors go to safetensors
and the rest to JSON, so loading a checkpoint never unpickles anything."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from forge_bridge.core.atomic import write_dir
from forge_bridge.core.errors import InvalidState
from forge_bridge.trainer.lora import DEFAULT_ADAPTER


def _optimizer_tensors(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {}
    for idx, entry in state["state"].items():
        for key, value in entry.items():
            tensors[f"{idx}.{key}"] = (value if torch.is_tensor(value) else torch.tensor(value)).contiguous()
    return tensors, {"param_groups": state["param_groups"]}


def _optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _optimizer_file(slot: str) -> str:
    return "optimizer.safetensors" if slot == DEFAULT_ADAPTER else f"optimizer-{slot}.safetensors"


def save(root: Path, iteration: int, model: Any, optimizers: dict[str, torch.optim.Optimizer],
         extra_modules: dict[str, torch.nn.Module], state: dict, gathered: dict | None = None) -> Path:
    """Every adapter of the model (the shared one, and one per role slot) with its optimizer.
    `gathered`: the full LoRA weights and optimizer states where the model holds shards (FSDP2,
    `distributed.gather`): a checkpoint is the same whatever the world size that wrote it."""
    def write(tmp: Path) -> None:
        weights = {} if gathered is None else {"state_dict": gathered["weights"]}
        model.save_pretrained(str(tmp / "adapter"), safe_serialization=True, **weights)  # named ones in subfolders
        metas = {}
        for slot, optimizer in optimizers.items():
            full = optimizer.state_dict() if gathered is None else gathered["optimizers"][slot]
            tensors, metas[slot] = _optimizer_tensors(full)
            save_file(tensors, str(tmp / _optimizer_file(slot)))
        for name, module in extra_modules.items():
            save_file({k: v.contiguous() for k, v in module.state_dict().items()},
                      str(tmp / f"{name}.safetensors"))
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps({
            **state, "iteration": iteration, "optimizer": metas.pop(DEFAULT_ADAPTER), "role_optimizers": metas,
            "python_random": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]]}))

    final = write_dir(root / f"it-{iteration:05d}", write)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    return final


def latest(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def load(path: Path, model: Any, optimizers: dict[str, torch.optim.Optimizer],
         extra_modules: dict[str, torch.nn.Module]) -> dict:
    """Restore the LoRA weights, optimizers, extra modules and RNG; returns the saved state."""
    from peft import set_peft_model_state_dict

    state = json.loads((path / "state.json").read_text())
    metas = {DEFAULT_ADAPTER: state["optimizer"], **state.get("role_optimizers", {})}
    if set(metas) != set(optimizers):
        raise InvalidState(f"checkpoint {path} holds the adapters {sorted(metas)}, this trainer trains "
                           f"{sorted(optimizers)}: resume with the run's own role_slots")
    for slot, optimizer in optimizers.items():
        folder = path / "adapter" if slot == DEFAULT_ADAPTER else path / "adapter" / slot
        set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")), adapter_name=slot)
        optimizer.load_state_dict(_optimizer_state(load_file(str(path / _optimizer_file(slot))), metas[slot]))
    for name, module in extra_modules.items():
        module.load_state_dict(load_file(str(path / f"{name}.safetensors")))
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch"])
    version, internal, gauss = state["python_random"]
    random.setstate((version, tuple(internal), gauss))
    return state
