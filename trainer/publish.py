"""Publishing adapter versions to the live policy.

Version N of the shared LoRA is '<run>-vN', of a role slot's '<run>-<slot>-vN'; each is saved
atomically under `<run folder>/adapters/` and loaded into the policy's slot, which then serves
it on its next call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from forge_bridge.policies.base import DEFAULT_SLOT, Policy
from forge_bridge.trainer.lora import save_adapter


WARM_START = "sft"
"""The version the SFT warm start publishes ('<run>-sft'): not an RL iteration, whose versions
count from v1."""


def version_name(run_name: str, n: int | str, slot: str = DEFAULT_SLOT) -> str:
    """'<run>-vN' for the shared LoRA, '<run>-<slot>-vN' for a role slot's; '<run>-sft' and
    '<run>-<slot>-sft' for the warm start (n = `WARM_START`)."""
    tag = WARM_START if n == WARM_START else f"v{n}"
    return f"{run_name}-{tag}" if slot == DEFAULT_SLOT else f"{run_name}-{slot}-{tag}"


class Publisher:
    """Saves each version of the run's LoRAs and makes the live policy serve it."""

    def __init__(self, policy: Policy | None, folder: Path, run_name: str, slots: Sequence[str]) -> None:
        self.policy, self.folder, self.run_name, self.slots = policy, Path(folder), run_name, list(slots)

    def version_name(self, n: int | str, slot: str = DEFAULT_SLOT) -> str:
        """'<run>-vN' for the shared LoRA, '<run>-<slot>-vN' for a role slot's ('-sft' for the warm start)."""
        return version_name(self.run_name, n, slot)

    def path(self, n: int | str, slot: str = DEFAULT_SLOT) -> Path:
        """Where version `n` of a slot's LoRA is saved."""
        return self.folder / self.version_name(n, slot)

    def publish(self, model: Any, n: int | str, weights: dict | None = None) -> dict[str, str]:
        """Save version `n` of every slot's LoRA atomically and make the live policy serve each
        from its slot (a version it already holds is not loaded twice); returns slot -> version.
        `weights`: the LoRA's full tensors by parameter name, when the model holds a shard only."""
        versions = {}
        for slot in self.slots:
            version = versions[slot] = self.version_name(n, slot)
            path = save_adapter(model, self.path(n, slot), adapter=slot, weights=weights)
            if version not in self.policy.versions(slot):
                self.policy.load_adapter(path, version, slot=slot)
        return versions


__all__ = ["Publisher", "WARM_START", "version_name"]
