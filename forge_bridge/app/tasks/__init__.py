"""Tool-use tasks whose answers can be checked exactly: the demo's training, validation and held-out sets."""

from forge_bridge.app.tasks.toolbench import (
    ALL_KINDS,
    BRIDGE_KINDS,
    CITIES,
    KINDS_ORDER,
    MULTI_STEP_KINDS,
    Task,
    bridge_tasks,
    check_answer,
    expert_reply,
    held_out_tasks,
    make_splits,
    tool_schemas,
)

__all__ = ["ALL_KINDS", "BRIDGE_KINDS", "CITIES", "KINDS_ORDER", "MULTI_STEP_KINDS", "Task", "bridge_tasks",
           "check_answer", "expert_reply", "held_out_tasks", "make_splits", "tool_schemas"]
