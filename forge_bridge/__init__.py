"""forge-bridge: train existing LangChain and CrewAI agents with reinforcement learning, in place.

The package is layered (each folder's `__init__` says what it may import): `core` (data model,
errors, store, episodes, the recording protocol), `policies`, `envs`, `serving` (the gateway),
`adapters` (LangChain, CrewAI), `trainer`, and `app` (CLI, demo). Importing it loads no torch,
LangChain or CrewAI: the names below that need them resolve on first access.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from forge_bridge.adapters.wrap import wrap
from forge_bridge.core.episode import Episode, Recorder, current_episode, episode
from forge_bridge.core.errors import (
    AdapterError,
    AgentError,
    ContextLengthExceeded,
    EpisodeClosed,
    ForgeBridgeError,
    InvalidArgument,
    InvalidState,
    MissingExtra,
    NotFound,
    PolicyError,
    PolicyResponseError,
    PolicyUnavailable,
    RunExistsError,
    SandboxUnavailable,
    SchemaError,
    StoreError,
    Unsupported,
    WrongType,
)
from forge_bridge.core.recording import StepRewards
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Feedback, Observation, ToolCall, Trajectory, TrajectoryGroup, Transition
from forge_bridge.envs.base import Environment, StepResult
from forge_bridge.policies.base import Policy, PolicyOutput, sampling

if TYPE_CHECKING:  # what type checkers and IDEs see for the lazy names
    from forge_bridge.envs.harness import HarnessAgent
    from forge_bridge.policies.local import LocalPolicy
    from forge_bridge.policies.scripted import ScriptedPolicy
    from forge_bridge.policies.upstream import UpstreamPolicy
    from forge_bridge.policies.vllm import VLLMPolicy
    from forge_bridge.policies.vllm_server import VLLMServer
    from forge_bridge.serving.command_rollout import CommandRollout
    from forge_bridge.serving.gateway import Gateway
    from forge_bridge.serving.promotion import Gate, Promotion
    from forge_bridge.trainer.config import (Distributed, GRPOConfig, Guidance, OfflineConfig, PPOConfig, SFTConfig,
                                             TrainerConfig)
    from forge_bridge.trainer.settings import LoRAConfig, LossConfig, OptimizerConfig, RolloutConfig, RunConfig
    from forge_bridge.trainer.demonstrations import import_demonstrations, read_demonstrations, record_demonstrations
    from forge_bridge.trainer.grpo import GRPOTrainer
    from forge_bridge.trainer.ppo import PPOTrainer
    from forge_bridge.trainer.rollouts import RolloutError
    from forge_bridge.trainer.sft import sft
    from forge_bridge.rewards.feedback import feedback
    from forge_bridge.trainer.teacher import Teacher

__version__ = "0.1.0"

_LAZY = {
    "LocalPolicy": "forge_bridge.policies.local",
    "ScriptedPolicy": "forge_bridge.policies.scripted",
    "VLLMPolicy": "forge_bridge.policies.vllm",
    "VLLMServer": "forge_bridge.policies.vllm_server",
    "Gateway": "forge_bridge.serving.gateway",
    "CommandRollout": "forge_bridge.serving.command_rollout",
    "Promotion": "forge_bridge.serving.promotion",
    "Gate": "forge_bridge.serving.promotion",
    "HarnessAgent": "forge_bridge.envs.harness",
    "UpstreamPolicy": "forge_bridge.policies.upstream",
    "RolloutError": "forge_bridge.trainer.rollouts",
    "TrainerConfig": "forge_bridge.trainer.config",
    "GRPOTrainer": "forge_bridge.trainer.grpo",
    "PPOTrainer": "forge_bridge.trainer.ppo",
    "GRPOConfig": "forge_bridge.trainer.config",
    "PPOConfig": "forge_bridge.trainer.config",
    "SFTConfig": "forge_bridge.trainer.config",
    "Guidance": "forge_bridge.trainer.config",
    "Distributed": "forge_bridge.trainer.config",
    "OfflineConfig": "forge_bridge.trainer.config",
    "RolloutConfig": "forge_bridge.trainer.settings",
    "OptimizerConfig": "forge_bridge.trainer.settings",
    "LoRAConfig": "forge_bridge.trainer.settings",
    "LossConfig": "forge_bridge.trainer.settings",
    "RunConfig": "forge_bridge.trainer.settings",
    "Teacher": "forge_bridge.trainer.teacher",
    "feedback": "forge_bridge.rewards.feedback",
    "sft": "forge_bridge.trainer.sft",
    "record_demonstrations": "forge_bridge.trainer.demonstrations",
    "read_demonstrations": "forge_bridge.trainer.demonstrations",
    "import_demonstrations": "forge_bridge.trainer.demonstrations",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'forge_bridge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Action", "AdapterError", "AgentError", "CommandRollout", "ContextLengthExceeded", "Distributed", "Environment",
    "Episode", "EpisodeClosed", "Feedback", "ForgeBridgeError", "GRPOConfig", "GRPOTrainer", "Gate", "Gateway",
    "Guidance", "HarnessAgent", "InvalidArgument", "InvalidState", "LoRAConfig", "LocalPolicy", "LossConfig",
    "MissingExtra", "NotFound", "Observation", "OfflineConfig", "OptimizerConfig", "PPOConfig", "PPOTrainer", "Policy",
    "PolicyError", "PolicyOutput", "PolicyResponseError", "PolicyUnavailable", "Promotion", "Recorder",
    "RolloutConfig", "RolloutError", "RunConfig", "RunExistsError", "SFTConfig", "SandboxUnavailable", "SchemaError", "ScriptedPolicy", "StepResult", "StepRewards", "StoreError",
    "Teacher", "ToolCall", "TrainerConfig", "Trajectory", "TrajectoryGroup", "TrajectoryStore", "Transition",
    "Unsupported", "UpstreamPolicy", "VLLMPolicy", "VLLMServer", "WrongType", "__version__", "current_episode",
    "episode", "feedback", "import_demonstrations", "read_demonstrations", "record_demonstrations", "sampling", "sft",
    "wrap",
]
