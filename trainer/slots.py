"""Which LoRA a crew role trains: the role -> policy slot mapping, and the check that a role's
steps were served from the slot its LoRA is published to."""

from __future__ import annotations

from typing import Sequence

from forge_bridge.core.errors import InvalidArgument, InvalidState
from forge_bridge.core.types import Trajectory


def role_slots(configured: dict[str, str] | None, declared: dict[str, str]) -> dict[str, str]:
    """The role -> slot mapping a trainer trains by: the config's and the policy's declared one
    together; a role the two put in different slots is refused, naming both."""
    configured = configured or {}
    clash = {role: (slot, declared[role]) for role, slot in configured.items() if declared.get(role, slot) != slot}
    if clash:
        raise InvalidArgument("role_slots: " + "; ".join(
            f"role {role!r} is in slot {mine!r} here but the policy serves it from {theirs!r}"
            for role, (mine, theirs) in clash.items()) + f" (GRPOConfig(role_slots={configured}), policy: {declared})")
    return {**declared, **configured}


def check_served(role: str | None, slot: str, trajectories: Sequence[Trajectory], mapping: dict[str, str]) -> str:
    """`slot`, the one a role's trajectories would train, once checked against the slots that
    served their steps: a LoRA trained on one slot's steps and published to another would never
    serve them (the crew would not improve), so a mismatch is refused, naming both mappings."""
    served = {s.slot for t in trajectories for s in t.transitions if s.slot is not None}
    if served - {slot}:
        raise InvalidState(
            f"role {role!r} was served from slot {', '.join(sorted(served))} but this trainer would train "
            f"slot {slot!r} (its role -> slot mapping: {mapping or 'none'}); give the trainer the "
            "mapping the agent is served with (GRPOConfig(role_slots=...)), or create the trainer after "
            "ForgeLLM(policy, role_slot=...), which declares it on the policy. Nothing was trained.")
    return slot


__all__ = ["check_served", "role_slots"]
