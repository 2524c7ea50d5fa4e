"""forge-bridge: train existing LangChain and CrewAI agents with reinforcement learning, in place.

The core package imports no torch, LangChain or CrewAI: those load only when a policy, an
adapter or the trainer is used (names below marked lazy resolve on first access), so recording
and storing trajectories stays cheap.
"""

from importlib import import_module
from typing import Any

from forge_bridge.env import Environment, StepResult
from forge_bridge.policy import (AdapterError, Policy, PolicyError, PolicyOutput,
                                 PolicyResponseError, PolicyUnavailable, sampling)
from forge_bridge.session import Episode, Recorder, current_episode, episode
from forge_bridge.store import StoreError, TrajectoryStore
from forge_bridge.types import (Action, Observation, SchemaError, ToolCall, Trajectory,
                                TrajectoryGroup, Transition)
from forge_bridge.wrap import wrap

__version__ = "0.1.0"

_LAZY = {
    "LocalPolicy": "forge_bridge.local_policy",
    "VLLMPolicy": "forge_bridge.vllm_policy",
    "VLLMServer": "forge_bridge.vllm_server",
    "Gateway": "forge_bridge.gateway",
    "GRPOTrainer": "forge_bridge.trainer.grpo",
    "PPOTrainer": "forge_bridge.trainer.ppo",
    "GRPOConfig": "forge_bridge.trainer.config",
    "PPOConfig": "forge_bridge.trainer.config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'forge_bridge' has no attribute {name!r}")


__all__ = [
    "Action", "AdapterError", "Environment", "Episode", "GRPOConfig", "GRPOTrainer", "Gateway",
    "LocalPolicy", "Observation", "PPOConfig", "PPOTrainer",
    "Policy", "PolicyError", "PolicyOutput", "PolicyResponseError", "PolicyUnavailable",
    "Recorder", "SchemaError", "StepResult", "StoreError", "ToolCall", "Trajectory",
    "TrajectoryGroup", "TrajectoryStore", "Transition", "VLLMPolicy", "VLLMServer",
    "current_episode", "episode", "sampling", "wrap", "__version__",
]
