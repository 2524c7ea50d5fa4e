"""Scale-out on Ray (the `forge-bridge[ray]` extra): rollouts in Ray actors, policies hosted in
Ray actors, adapters shipped through Ray's object store.

    RayRollouts   the user's rollout function on N worker actors; episodes stream into the
                  trainer's store as they are recorded (`trainer.train(rollout=RayRollouts(...))`)
    RayPolicy     a policy (the embedded model, a vLLM server) hosted in a Ray actor, reachable
                  from every worker; new adapters reach it as bytes, written atomically there
    serve_vllm    the factory that starts a vLLM server inside such an actor (a GPU each)

This layer may import core, policies and the trainer; nothing imports it. Importing it loads
no Ray: Ray is imported when a worker or host is first started.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forge_bridge.scale.policy_host import RayPolicy, serve_vllm
    from forge_bridge.scale.workers import RayRollouts

_LAZY = {"RayRollouts": "forge_bridge.scale.workers", "RayPolicy": "forge_bridge.scale.policy_host",
         "serve_vllm": "forge_bridge.scale.policy_host"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'forge_bridge.scale' has no attribute {name!r}")


__all__ = ["RayPolicy", "RayRollouts", "serve_vllm"]
