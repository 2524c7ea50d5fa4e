"""Demonstrations for the warm start: recorded through the user's own agent, or imported.

`record_demonstrations` runs the user's agent, unchanged, on a `ScriptedPolicy` that replays a
plan per task (the tool calls an expert would make, then the answer): every step is recorded by
the agent's own front end, so the token ids are those of the user's own prompts, tools and chat
template, exactly what the model will have to produce. Only demonstrations the user's checker
passes are kept; the others are named. `import_demonstrations` reads conversations in the OpenAI
messages format (one JSON object per line: `{"messages": [...], "tools": [...]}`) and records
each assistant turn as a step rendered with the model's tokenizer. Both store what they record
under one run id, `read_demonstrations` reads them back.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.recording import transition_of
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Trajectory, succeeded
from forge_bridge.policies.base import Policy
from forge_bridge.policies.scripted import Script, ScriptedPolicy, Step
from forge_bridge.trainer import rollouts

DEMONSTRATIONS = "demonstrations"
"""The run id demonstrations are recorded under unless told otherwise."""


def record_demonstrations(make_rollout: Callable[[Policy], rollouts.Rollout], tasks: Sequence[Any], tokenizer: Any,
                          recorder: Recorder, *, plans: Mapping[str, Sequence[Step]] | None = None,
                          success_threshold: float = 1.0, tool_format: str = "auto", concurrency: int = 4,
                          run_id: str = DEMONSTRATIONS, progress: bool = True) -> list[Trajectory]:
    """Run the agent `make_rollout(policy)` builds on each task with a policy replaying its plan
    (`plans[task id]`, else `task["demo"]`), in an episode recorded under `run_id`; returns the
    demonstrations the rollout's reward passed (in task order). A plan that calls a tool the agent
    lacks, or runs out before the agent stops, is an error naming the task and the fix."""
    tasks = list(tasks)
    indexed = [(rollouts.task_id_of(t, i), t) for i, t in enumerate(tasks)]
    if not indexed:
        raise InvalidArgument("record_demonstrations: expected at least one task")
    if plans is None:
        missing = [tid for tid, t in indexed if not (isinstance(t, dict) and "demo" in t)]
        if missing:
            raise InvalidArgument(f"record_demonstrations: task {missing[0]!r} has no 'demo' plan (the steps an expert "
                                  "takes: [{'tool': name, 'args': {...}}, ..., 'the answer']); add one, or pass plans=")
        plans = {tid: t["demo"] for tid, t in indexed}
    policy = ScriptedPolicy.replay(plans, tokenizer, tool_format)
    try:
        groups, _ = rollouts.collect(make_rollout(policy), indexed, 0, recorder=recorder, run_id=run_id,
                                     group_size=1, concurrency=concurrency, success_threshold=success_threshold,
                                     progress=progress, desc="demonstrations", behaviour="demonstration")
    except rollouts.RolloutError:
        if not policy.problems:
            raise
    if policy.problems:
        raise InvalidArgument(f"record_demonstrations: {policy.problems[0]} ({len(policy.problems)} scripted "
                              "replies refused; what was recorded is kept in the store, marked crashed)") from None
    order: dict[str | None, int] = {tid: k for k, (tid, _) in enumerate(indexed)}
    recorded = sorted((t for g in groups for t in g.trajectories), key=lambda t: order.get(t.task_id, 0))
    return usable(recorded, success_threshold)


def usable(demonstrations: Sequence[Trajectory], success_threshold: float = 1.0) -> list[Trajectory]:
    """The demonstrations worth imitating: ended by the agent itself with a passing reward; the
    others are named, not silently dropped."""
    kept = [t for t in demonstrations if t.end_reason == "terminated" and succeeded(t.reward, success_threshold)]
    refused = [t for t in demonstrations if t not in kept]
    if refused:
        logging.getLogger(__name__).warning(
            "demonstrations: not learning from %d of %d (e.g. task %r: %s, reward %s); the checker did not pass "
            "them", len(refused), len(demonstrations), refused[0].task_id, refused[0].end_reason, refused[0].reward)
    return kept


def read_demonstrations(store: TrajectoryStore, run_id: str = DEMONSTRATIONS) -> list[Trajectory]:
    """The usable demonstrations recorded under `run_id`, in task order."""
    return usable(sorted(store.trajectories(run_id=run_id), key=lambda t: (t.task_id or "", t.id)))


def import_demonstrations(path: str | Path, tokenizer: Any, recorder: Recorder, *,
                          run_id: str = DEMONSTRATIONS, tool_format: str = "auto") -> list[Trajectory]:
    """Record the conversations of a JSONL file in the OpenAI messages format as demonstrations
    (each assistant turn a step, its tokens rendered by `tokenizer`; reward 1); returns them.
    A line that is not such a conversation is an error naming the file and line; nothing is
    recorded then."""
    path = Path(path)
    conversations = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            conversations.append((n, _conversation(line, f"{path}:{n}")))
    if not conversations:
        raise InvalidArgument(f"{path}: no conversations (one JSON object per line, {{'messages': [...]}})")
    out = []
    for n, (messages, tools) in conversations:
        turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        replies = [_step_of(messages[k], f"{path}:{n}") for k in turns]
        policy = ScriptedPolicy(_replaying(replies), tokenizer, tool_format)
        with recorder.episode(f"{path.stem}-{n}", run_id=run_id, metadata={"source": f"{path.name}:{n}"},
                              behaviour="demonstration") as ep:
            for k in turns:
                prompt = messages[:k]
                ep.record(transition_of(policy.chat(prompt, tools, temperature=0, max_tokens=4096), prompt, tools,
                                        source="import"))
            ep.reward(1.0)
        out.append(ep.trajectory)
    return out


def _replaying(steps: list[Step]) -> Script:
    """A script answering each call with the next of `steps`."""
    left = iter(steps)
    return lambda messages, tools: next(left)


def _conversation(line: str, where: str) -> tuple[list[dict], list[dict] | None]:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{where}: not JSON ({exc.msg})") from None
    messages = data.get("messages") if isinstance(data, dict) else None
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) and "role" in m for m in messages)):
        raise InvalidArgument(f"{where}: expected {{'messages': [{{'role': ..., 'content': ...}}, ...]}}")
    if not any(m["role"] == "assistant" for m in messages):
        raise InvalidArgument(f"{where}: the conversation has no assistant turn to learn from")
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InvalidArgument(f"{where}: 'tools' must be a list of OpenAI tool schemas")
    return messages, tools


def _step_of(message: dict, where: str) -> Step:
    """An OpenAI assistant message as a scripted step."""
    calls = message.get("tool_calls") or []
    if not calls:
        return str(message.get("content") or "")
    steps = []
    for call in calls:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            raise InvalidArgument(f"{where}: the arguments of tool call {fn.get('name')!r} are not JSON") from None
        steps.append({"tool": fn.get("name"), "args": args})
    return steps


__all__ = ["DEMONSTRATIONS", "import_demonstrations", "read_demonstrations", "record_demonstrations", "usable"]
