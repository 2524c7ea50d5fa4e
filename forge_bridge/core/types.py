"""The environment-transition data model shared by every front end, the store and the trainer.

Everything here is plain Python (no torch, no framework) and round-trips through JSON, so a
trajectory recorded by a LangChain agent today is readable by the trainer of a later release.
Objects validate on creation and on load: a bad value raises `SchemaError` naming the field,
because a silently wrong token id would train the model on garbage.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from forge_bridge.core import validate
from forge_bridge.core.actions import Action, Observation, ToolCall
from forge_bridge.core.deprecated import renamed
from forge_bridge.core.errors import SchemaError
from forge_bridge.core.migrations import SCHEMA_VERSION, migrate_json, readable, v5_step

STATUSES = ("incomplete", "complete", "failed", "truncated")
"""`incomplete`: the episode was never closed (still running, or its process died)."""

END_REASONS = ("terminated", "truncated", "policy_fault", "outage", "crashed")
"""Why an episode ended, as the trainer reads it:
- `terminated`: the task ended (a final answer, an end state); trained on.
- `truncated`: a limit cut it (steps, recursion, time, context); trained on with its reward.
- `policy_fault`: the model's own failure (a malformed tool call); trained on, reward 0 if unscored.
- `outage`: the policy could not answer (server down, unusable reply); never trained on.
- `crashed`: the agent or the rollout code raised; never trained on."""

STATUS_OF_END = {"terminated": "complete", "truncated": "truncated", "policy_fault": "failed",
                 "outage": "failed", "crashed": "failed"}
"""The coarse status each end reason is stored under."""

STATUS_FALLBACK = {"complete": "terminated", "truncated": "truncated", "failed": "crashed"}
"""The end reason read for a trajectory whose data gives only a status."""

TRAINABLE_ENDS = ("terminated", "truncated", "policy_fault")
"""End reasons whose trajectories carry the policy's own behaviour (see END_REASONS)."""

BEHAVIOURS = ("policy", "demonstration", "guide", "upstream")
"""Whose behaviour a trajectory's tokens are (what sampled them):
- `policy`: the policy being trained (on-policy rollouts, evaluations);
- `demonstration`: a scripted expert or an imported conversation (the warm start's data);
- `guide`: a teacher's or a demonstration's trajectory added to a GRPO group (never on-policy);
- `upstream`: the agent's own model in production, recorded in the student's tokens
  (`UpstreamPolicy`; never on-policy)."""


# --------------------------------------------------------------------------- transition
@renamed("adapter", "version")  # its name until schema version 6, kept for one release
@dataclass
class Transition:
    """One environment step = one model call of the agent, with the exact tokens sampled.

    Token ids and logprobs come from the server that sampled them and are never re-tokenised;
    `version` names the adapter version that produced them so stale samples can be weighted.
    `info` holds what happened after the call (tool results keyed by tool_call id, errors,
    latencies, framework metadata).
    """

    observation: Observation
    action: Action
    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    version: str | None = None
    """The adapter version that served the call (None: the base model)."""
    reward: float = 0.0
    terminated: bool = False
    """Gymnasium's meaning: the last step of an episode whose task ended."""
    truncated: bool = False
    """Gymnasium's meaning: the last step of an episode a limit cut short (a completion that hit
    max_tokens is `action.finish_reason == "length"`, not this)."""
    info: dict = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)
    temperature: float | None = None
    """The sampling temperature the completion was drawn at (None: not known)."""
    slot: str | None = None
    """The policy slot that served the call (a crew role's, or 'default'; None: not known)."""

    def __post_init__(self) -> None:
        if isinstance(self.observation, dict):
            self.observation = Observation.from_dict(self.observation)
        if not isinstance(self.observation, Observation):
            raise validate.fail("Transition.observation", "an Observation", self.observation)
        if isinstance(self.action, dict):
            self.action = Action.from_dict(self.action)
        if not isinstance(self.action, Action):
            raise validate.fail("Transition.action", "an Action", self.action)
        self.prompt_token_ids = validate.token_ids("Transition.prompt_token_ids", self.prompt_token_ids)
        self.completion_token_ids = validate.token_ids("Transition.completion_token_ids", self.completion_token_ids)
        self.completion_logprobs = validate.logprobs("Transition.completion_logprobs", self.completion_logprobs)
        if self.completion_logprobs and len(self.completion_logprobs) != len(self.completion_token_ids):
            raise SchemaError(
                f"Transition.completion_logprobs: {len(self.completion_logprobs)} logprobs for "
                f"{len(self.completion_token_ids)} completion tokens (must be equal)")
        validate.optional_str("Transition.version", self.version)
        validate.optional_str("Transition.slot", self.slot)
        self.reward = validate.finite("Transition.reward", self.reward)
        validate.boolean("Transition.terminated", self.terminated)
        validate.boolean("Transition.truncated", self.truncated)
        validate.json_object("Transition.info", self.info)
        self.timestamp = validate.finite("Transition.timestamp", self.timestamp)
        if self.temperature is not None:
            self.temperature = validate.finite("Transition.temperature", self.temperature)
            if self.temperature < 0:
                raise validate.fail("Transition.temperature", "a number >= 0 or null", self.temperature)
        if self.terminated and self.truncated:
            raise SchemaError("Transition.terminated/truncated: a step cannot be both")

    @property
    def has_tokens(self) -> bool:
        """Trainable: both sides of the call were recorded as token ids."""
        return bool(self.prompt_token_ids) and bool(self.completion_token_ids)

    def to_dict(self) -> dict:
        return {
            "observation": self.observation.to_dict(), "action": self.action.to_dict(),
            "prompt_token_ids": self.prompt_token_ids, "completion_token_ids": self.completion_token_ids,
            "completion_logprobs": self.completion_logprobs, "version": self.version,
            "reward": self.reward, "terminated": self.terminated, "truncated": self.truncated,
            "info": self.info, "timestamp": self.timestamp, "temperature": self.temperature,
            "slot": self.slot,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Transition":
        if not isinstance(data, dict):
            raise validate.fail("Transition", "an object", data)
        known = {"observation", "action", "prompt_token_ids", "completion_token_ids",
                 "completion_logprobs", "version", "reward", "terminated", "truncated", "info",
                 "timestamp", "temperature", "slot"}
        data = v5_step(data)  # a step dict carries no schema version of its own: an older one's key read too
        unknown = set(data) - known
        if unknown:
            raise SchemaError(f"Transition: unknown field(s) {sorted(unknown)}")
        for required in ("observation", "action"):
            if required not in data:
                raise SchemaError(f"Transition.{required}: missing")
        return cls(**data)


# --------------------------------------------------------------------------- trajectory
def new_id() -> str:
    return uuid.uuid4().hex


@renamed("adapters", "versions")  # its name until schema version 6, kept for one release
@dataclass
class Trajectory:
    """One episode: the transitions of one agent run on one task, and how it ended.

    What the trainer decides on is typed: `end_reason` (see END_REASONS; the one record of how
    the episode ended), `role` (a crew participant, trained apart), `excluded` (a reason never to
    train on it, e.g. an iteration interrupted and re-run on resume). `status` is the coarse view
    of `end_reason`, derived from it (STATUS_OF_END), never stored apart.
    """

    transitions: list[Transition] = field(default_factory=list)
    id: str = field(default_factory=new_id)
    task_id: str | None = None
    group_id: str | None = None
    run_id: str | None = None
    reward: float | None = None
    metadata: dict = field(default_factory=dict)
    end_reason: str | None = None
    """Why the episode ended (None while it is open)."""
    end_detail: str | None = None
    """The human-readable why: the limit hit, the error raised."""
    role: str | None = None
    """The participant whose steps these are (a CrewAI role), or None for a single agent."""
    excluded: str | None = None
    """Why the trainer must never train on this trajectory (None: nothing against it)."""
    behaviour: str = "policy"
    """Whose behaviour its tokens are: one of BEHAVIOURS."""

    def __post_init__(self) -> None:
        if self.behaviour not in BEHAVIOURS:
            raise validate.fail("Trajectory.behaviour", f"one of {BEHAVIOURS}", self.behaviour)
        if not isinstance(self.id, str) or not self.id:
            raise validate.fail("Trajectory.id", "a non-empty string", self.id)
        for name in ("task_id", "group_id", "run_id", "end_detail", "role", "excluded"):
            validate.optional_str(f"Trajectory.{name}", getattr(self, name))
        if self.reward is not None:
            self.reward = validate.finite("Trajectory.reward", self.reward)
        if self.end_reason is not None and self.end_reason not in END_REASONS:
            raise validate.fail("Trajectory.end_reason", f"one of {END_REASONS} or null", self.end_reason)
        validate.json_object("Trajectory.metadata", self.metadata)
        if not isinstance(self.transitions, list):
            raise validate.fail("Trajectory.transitions", "a list", self.transitions)
        checked = []
        for i, t in enumerate(self.transitions):
            if isinstance(t, dict):
                try:
                    t = Transition.from_dict(t)
                except SchemaError as exc:
                    raise SchemaError(f"Trajectory.transitions[{i}]: {exc}") from None
            if not isinstance(t, Transition):
                raise validate.fail(f"Trajectory.transitions[{i}]", "a Transition", t)
            checked.append(t)
        self.transitions = checked

    def __len__(self) -> int:
        return len(self.transitions)

    def __iter__(self) -> Iterator[Transition]:
        return iter(self.transitions)

    @property
    def status(self) -> str:
        """The coarse view of `end_reason`: incomplete (still open, or its process died),
        complete, truncated or failed."""
        return "incomplete" if self.end_reason is None else STATUS_OF_END[self.end_reason]

    @property
    def versions(self) -> set[str | None]:
        """The adapter versions that served its steps (None: the base model)."""
        return {t.version for t in self.transitions}


    @property
    def trainable(self) -> bool:
        """Ended, by the policy's own doing (TRAINABLE_ENDS), and not excluded."""
        return self.end_reason in TRAINABLE_ENDS and self.excluded is None

    @property
    def temperature(self) -> float | None:
        """The behaviour temperature, when every step was sampled at the same known one."""
        temps = {t.temperature for t in self.transitions}
        return temps.pop() if len(temps) == 1 else None

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION, "id": self.id, "task_id": self.task_id,
            "group_id": self.group_id, "run_id": self.run_id, "reward": self.reward,
            "status": self.status, "end_reason": self.end_reason, "end_detail": self.end_detail,
            "role": self.role, "excluded": self.excluded, "behaviour": self.behaviour, "metadata": self.metadata,
            "transitions": [t.to_dict() for t in self.transitions],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any) -> "Trajectory":
        """A trajectory from `to_dict`'s layout, of this version or an older one (migrated)."""
        if not isinstance(data, dict):
            raise validate.fail("Trajectory", "an object", data)
        version = data.get("schema_version")
        if not readable(version):
            raise SchemaError(f"Trajectory.schema_version: this forge-bridge reads versions 1 to {SCHEMA_VERSION}, "
                              f"got {version!r}")
        fields_ = {k: v for k, v in migrate_json(data).items() if k not in ("schema_version", "status")}
        known = {"id", "task_id", "group_id", "run_id", "reward", "metadata", "transitions",
                 "end_reason", "end_detail", "role", "excluded", "behaviour"}
        unknown = set(fields_) - known
        if unknown:
            raise SchemaError(f"Trajectory: unknown field(s) {sorted(unknown)}")
        status = data.get("status", "incomplete")
        if fields_.get("end_reason") is None and status != "incomplete":  # an end given by its status only
            if status not in STATUS_FALLBACK:
                raise validate.fail("Trajectory.status", f"one of {STATUSES}", status)
            fields_["end_reason"] = STATUS_FALLBACK[status]
        traj = cls(**fields_)
        if traj.status != status and "status" in data:
            raise SchemaError(f"Trajectory.status: {status!r} does not go with end_reason "
                              f"{traj.end_reason!r} (expected {traj.status!r})")
        return traj

    @classmethod
    def from_json(cls, text: str) -> "Trajectory":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"Trajectory: not valid JSON ({exc})") from None
        return cls.from_dict(data)


@dataclass
class TrajectoryGroup:
    """The N rollouts of one task (by one role, in a crew): GRPO compares returns within it."""

    group_id: str
    task_id: str | None
    trajectories: list[Trajectory]
    role: str | None = None
    """The crew role whose trajectories these are (None: a single agent)."""

    def __post_init__(self) -> None:
        if not isinstance(self.group_id, str) or not self.group_id:
            raise validate.fail("TrajectoryGroup.group_id", "a non-empty string", self.group_id)
        for i, t in enumerate(self.trajectories):
            if not isinstance(t, Trajectory):
                raise validate.fail(f"TrajectoryGroup.trajectories[{i}]", "a Trajectory", t)
            if t.group_id != self.group_id:
                raise SchemaError(
                    f"TrajectoryGroup.trajectories[{i}].group_id: {t.group_id!r} is not this "
                    f"group's id {self.group_id!r}")
            if t.role != self.role:
                raise SchemaError(f"TrajectoryGroup.trajectories[{i}].role: {t.role!r} is not this "
                                  f"group's role {self.role!r}")

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def rewards(self) -> list[float | None]:
        return [t.reward for t in self.trajectories]


def succeeded(reward: float | None, threshold: float = 1.0) -> bool:
    """The one definition of success, which every metric, probe, guide and gate uses: the reward
    reaches `threshold` (a missing reward is a failure)."""
    return (reward or 0.0) >= threshold


def prefers(score: float, other: float, margin: float = 0.0) -> bool:
    """The one rule of "is it better", which the promotion gate and validation inside training
    share: `score` beats `other` by more than `margin`."""
    return score > other + margin


def success_rate(rewards: Iterable[float | None], threshold: float = 1.0) -> float:
    """The share of `rewards` that `succeeded`; 0.0 for none."""
    rewards = list(rewards)
    return sum(succeeded(r, threshold) for r in rewards) / len(rewards) if rewards else 0.0


def group_trajectories(trajectories: Iterable[Trajectory]) -> list[TrajectoryGroup]:
    """Trajectories that share a group id and role, as groups in order of first appearance, each
    in the order given (trajectories without a group id are left out)."""
    groups: dict[tuple[str, str | None], TrajectoryGroup] = {}
    for t in trajectories:
        if t.group_id is None:
            continue
        key = (t.group_id, t.role)
        if key not in groups:
            groups[key] = TrajectoryGroup(t.group_id, t.task_id, [], role=t.role)
        groups[key].trajectories.append(t)
    return list(groups.values())


@renamed("adapter", "version")  # its name until schema version 6, kept for one release
@dataclass(frozen=True)
class TrajectoryRow:
    """One line of a trajectory list: the trajectory without its steps, and what summarises them."""

    trajectory: Trajectory
    iteration: int | None
    kind: str | None
    steps: int
    version: str | None
    """The last adapter version among its steps (None: the base model, or no steps)."""


@dataclass(frozen=True)
class StepCredit:
    """What the trainer made of one step in an iteration."""

    iteration: int
    advantage: float | None
    """None where no advantage was computed (an untrainable step)."""
    trained_tokens: int
    """Completion tokens the loss trained on (0: its group was uniform, or it was cut)."""
    teacher_logprobs: list[float] | None = None
    """The teacher's log-probability of each completion token (on-policy distillation; None: not scored)."""



@dataclass(frozen=True)
class Feedback:
    """One judgement of a stored episode, arriving when it arrives (hours or days after the
    episode ended): a user's thumbs up (1) or down (0), a reviewer's score, a judge's verdict.
    Stored append-only (`TrajectoryStore.add_feedback`); what the episode's reward is made of
    them is `forge_bridge.rewards.feedback_reward`."""

    episode_id: str
    """The episode (its trajectory id; a crew's role trajectories share their parent's)."""
    value: float
    """The judgement, a finite number (1 / 0 for thumbs up / down, or a score)."""
    key: str = "user"
    """Who or what judged ('user', 'reviewer', 'judge', ...): the latest value per key counts."""
    comment: str | None = None
    """What the judge said, as given."""
    step: int | None = None
    """The step it is about (None: the whole episode)."""
    source: str | None = None
    """Where it came from (the API, the gateway, an import)."""
    seq: int | None = None
    """Its place in the store's arrival order (None until stored)."""
    at: float | None = None
    """When the store received it (unix time; None until stored)."""

    def __post_init__(self) -> None:
        if not isinstance(self.episode_id, str) or not self.episode_id:
            raise validate.fail("feedback.episode_id", "a non-empty string", self.episode_id)
        object.__setattr__(self, "value", validate.finite("feedback.value", self.value))
        if not isinstance(self.key, str) or not self.key or len(self.key) > 64:
            raise validate.fail("feedback.key", "a non-empty string of at most 64 characters", self.key)
        validate.optional_str("feedback.comment", self.comment)
        validate.optional_str("feedback.source", self.source)
        if self.step is not None and (isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0):
            raise validate.fail("feedback.step", "None or a step index >= 0", self.step)


__all__ = ["BEHAVIOURS", "END_REASONS", "SCHEMA_VERSION", "STATUSES", "STATUS_OF_END", "TRAINABLE_ENDS", "Action", "Feedback", "Observation",
           "StepCredit", "prefers", "succeeded", "success_rate", "ToolCall", "Trajectory", "TrajectoryGroup", "TrajectoryRow", "Transition",
           "group_trajectories", "new_id"]
