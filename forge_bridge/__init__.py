"""forge-bridge: train existing LangChain and CrewAI agents with reinforcement learning, in place.

The core package imports no torch, LangChain or CrewAI: those load only when a policy, an
adapter or the trainer is used, so recording and storing trajectories stays cheap.
"""

from forge_bridge.env import Environment, StepResult
from forge_bridge.store import StoreError, TrajectoryStore
from forge_bridge.types import (Action, Observation, SchemaError, ToolCall, Trajectory,
                                TrajectoryGroup, Transition)

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Environment",
    "Observation",
    "SchemaError",
    "StepResult",
    "StoreError",
    "ToolCall",
    "Trajectory",
    "TrajectoryGroup",
    "TrajectoryStore",
    "Transition",
    "__version__",
]
