"""Serving front ends for agents whose code cannot change: the OpenAI-compatible gateway that
records every call it forwards to a policy (`gateway`), and rollouts that are other programs
pointed at it (`command_rollout`).

May import: `forge_bridge.core` and `forge_bridge.policies`.
"""
