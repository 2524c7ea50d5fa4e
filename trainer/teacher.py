"""Learning from a teacher: what the policy cannot find alone.

On-policy GRPO only sharpens what the policy already samples: a group with no success has
nothing to compare. A teacher -- any Policy (a bigger model on vLLM, the same base with another
LoRA, a scripted expert) or recorded demonstrations -- helps in three ways, each a `GRPOConfig`
setting:

- **guide trajectories** (`guidance`, as LUFFY): in a group whose on-policy success rate is at
  or below `Guidance.below`, k trajectories of the same task join the group before its
  advantages are computed -- copies of recorded demonstrations, or the teacher's rollouts
  through the same agent and the same recording protocol -- stored with behaviour 'guide'. Their
  tokens train through the shaped weight of `losses.guide_policy_loss`, not the clipped ratio
  (their sampler is not the policy), and never count as the policy's in the metrics.
- **on-policy distillation** (`distill_beta`): the teacher scores every token the student
  sampled (`Policy.score`) and `advantages.distillation_rewards` joins each token's advantage.
  Token-level signals need one vocabulary: checked, and refused otherwise.
- **relabelling** (`relabel_weight`, DAgger): at the states of failed rollouts the teacher says
  what it would do, and the update imitates that there.

A teacher with another vocabulary (or one that does not say) still acts: its replies are
rendered in the student's tokens by a `ScriptedPolicy`, as a demonstration is.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, cast

import torch

from forge_bridge.core.episode import derive_seed
from forge_bridge.core.errors import InvalidArgument, Unsupported, WrongType
from forge_bridge.core.types import Action, Trajectory, TrajectoryGroup, Transition, succeeded, success_rate
from forge_bridge.policies.base import Policy
from forge_bridge.policies.scripted import ScriptedPolicy, Step
from forge_bridge.trainer import rollouts
from forge_bridge.trainer.advantages import distillation_rewards
from forge_bridge.trainer.batch import BatchStats, Sample, cut_to
from forge_bridge.trainer.config import GRPOConfig

PROBE_TEXT = 'Hello, world! 12.5 * 3 = 37.5\n<tool_call>\n{"name": "lookup", "arguments": {"key": "café ünï"}}\n'
"""Text both tokenizers must split alike for token-level signals (`shares_vocabulary`)."""


@dataclass
class Teacher:
    """Who guides the student: a policy that acts (and scores, where it can), recorded
    demonstrations, and the user's agent to run the teacher through."""

    policy: Policy | None = None
    """Acts in guide rollouts and relabelling; scores tokens for distillation (same vocabulary)."""
    make_rollout: Callable[[Policy], rollouts.Rollout] | None = None
    """The user's agent on a given policy, as a rollout function (the guide rollouts' agent)."""
    demonstrations: Sequence[Trajectory] = field(default_factory=list)
    """Recorded trajectories `Guidance(source='demonstrations')` draws guides from, by task id."""

    def __post_init__(self) -> None:
        if self.policy is not None and not isinstance(self.policy, Policy):
            raise WrongType(f"Teacher.policy: expected a forge_bridge Policy, got {type(self.policy).__name__}")
        if self.make_rollout is not None and not callable(self.make_rollout):
            raise WrongType("Teacher.make_rollout: expected a function policy -> rollout function")
        self.demonstrations = list(self.demonstrations)
        bad = [d for d in self.demonstrations if not isinstance(d, Trajectory)]
        if bad:
            raise WrongType(f"Teacher.demonstrations: expected Trajectory objects, got {type(bad[0]).__name__}")


def check_teacher(teacher: Teacher | None, config: GRPOConfig, tokenizer: Any) -> None:
    """Refuse, before anything runs, a teacher that cannot give what the config asks of it."""
    guidance = config.guidance
    wants = config.teacher_settings()
    if not wants:
        return
    if teacher is None:
        raise InvalidArgument(f"{', '.join(wants)} needs a teacher: GRPOTrainer(..., teacher=fb.Teacher(...))")
    if guidance and guidance.source == "demonstrations" and not teacher.demonstrations:
        raise InvalidArgument("Guidance(source='demonstrations') needs Teacher(demonstrations=[...]) "
                              "(fb.read_demonstrations(store) reads recorded ones)")
    if guidance and guidance.source == "teacher" and (teacher.policy is None or teacher.make_rollout is None):
        raise InvalidArgument("Guidance(source='teacher') runs the teacher through your agent: it needs "
                              "Teacher(policy=..., make_rollout=lambda policy: <your rollout on that policy>)")
    if config.relabel_weight > 0 and teacher.policy is None:
        raise InvalidArgument("relabel_weight > 0 asks the teacher what it would do: it needs Teacher(policy=...)")
    if config.distill_beta > 0:
        if teacher.policy is None:
            raise InvalidArgument("distill_beta > 0 needs a teacher that scores tokens: Teacher(policy=...)")
        if not shares_vocabulary(teacher.policy, tokenizer):
            raise InvalidArgument(
                f"distill_beta > 0: the teacher ({type(teacher.policy).__name__}) does not tokenize text as the "
                "student does (or does not say how), so it cannot score the student's tokens; use it as a text "
                "teacher instead (Guidance(source='teacher') or relabel_weight), or a teacher of the same family")


def shares_vocabulary(teacher: Policy, tokenizer: Any) -> bool:
    """Whether the teacher splits `PROBE_TEXT` into the same token ids as the student's tokenizer."""
    try:
        theirs = teacher.tokenize(PROBE_TEXT)
    except Unsupported:
        return False
    return list(theirs) == list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))


def step_of(action: Action) -> Step:
    """A teacher's reply as a scripted step: its tool calls, else its text."""
    if not action.tool_calls:
        return action.content
    calls = []
    for call in action.tool_calls:
        try:
            calls.append({"tool": call.name, "args": json.loads(call.arguments or "{}")})
        except json.JSONDecodeError:
            raise InvalidArgument(f"the teacher called {call.name!r} with arguments that are not JSON: "
                                  f"{call.arguments[:80]!r}") from None
    return calls


def acting_policy(teacher: Policy, tokenizer: Any, tool_format: str = "auto") -> Policy:
    """The teacher as the agent's policy, in the student's tokens: itself when it shares the
    student's vocabulary, else its replies rendered by a `ScriptedPolicy` on the student's tokenizer."""
    if shares_vocabulary(teacher, tokenizer):
        return teacher
    return ScriptedPolicy(lambda messages, tools: step_of(teacher.chat(messages, tools).action), tokenizer,
                          tool_format)


# --------------------------------------------------------------------------- guide trajectories
def own_success_rate(group: TrajectoryGroup, success_threshold: float) -> float:
    """The share of the group's own (on-policy) rollouts that succeeded."""
    return success_rate([t.reward for t in group.trajectories if t.behaviour == "policy"], success_threshold)


def as_guide(trajectory: Trajectory, group: TrajectoryGroup, it: int) -> Trajectory:
    """A copy of `trajectory` as a guide member of `group` (iteration `it`, 0-based); a trajectory
    of another task is refused (it would be compared with rollouts of a task it did not do)."""
    if trajectory.task_id != group.task_id:
        raise InvalidArgument(f"guide trajectory {trajectory.id} is of task {trajectory.task_id!r}, not of the "
                              f"group's task {group.task_id!r}: a guide joins only its own task's group")
    run_id = group.trajectories[0].run_id if group.trajectories else None
    return Trajectory(transitions=[Transition.from_dict(s.to_dict()) for s in trajectory.transitions],
                      task_id=group.task_id, group_id=group.group_id, run_id=run_id, reward=trajectory.reward,
                      metadata={**trajectory.metadata, "iteration": it + 1, "guide_of": trajectory.id},
                      end_reason=trajectory.end_reason, end_detail=trajectory.end_detail, role=group.role,
                      behaviour="guide")


def with_guides(group: TrajectoryGroup, guides: Sequence[Trajectory]) -> TrajectoryGroup:
    """The group with its guides after its own rollouts; a guide of another task is refused."""
    for guide in guides:
        if guide.task_id != group.task_id or guide.behaviour != "guide":
            raise InvalidArgument(f"trajectory {guide.id} (task {guide.task_id!r}, behaviour {guide.behaviour!r}) "
                                  f"is not a guide of the group's task {group.task_id!r}")
    return TrajectoryGroup(group.group_id, group.task_id, list(group.trajectories) + list(guides), role=group.role)


def demonstration_guides(group: TrajectoryGroup, demonstrations: Sequence[Trajectory], k: int, it: int
                         ) -> list[Trajectory]:
    """Up to k demonstrations of the group's task (and role), taken in turn across iterations, as guides."""
    mine = [d for d in demonstrations if d.task_id == group.task_id and d.role == group.role]
    return [as_guide(mine[(it * k + j) % len(mine)], group, it) for j in range(min(k, len(mine)))]


def guide(trainer: Any, groups: list[TrajectoryGroup], tasks: list[tuple[str, Any]], it: int
          ) -> tuple[list[TrajectoryGroup], dict]:
    """Add guides to the groups the policy fails (`GRPOConfig.guidance`); returns the groups
    and what was added (guided groups, guide trajectories and their success rate, guides that
    could not be had: a task without demonstrations, a teacher rollout that failed)."""
    config, teacher = trainer.config, trainer.teacher
    guidance = config.guidance
    needy = [g for g in groups if own_success_rate(g, config.rollout.success_threshold) <= guidance.below]
    if guidance.source == "demonstrations":
        found = {(g.group_id, g.role): demonstration_guides(g, teacher.demonstrations, guidance.k, it) for g in needy}
        trainer.recorder.store.add_many([t for guides in found.values() for t in guides], "recording guides")
    else:
        found = teacher_guides(trainer, needy, dict(tasks), it)
    added = {key: found.get(key, []) for key in ((g.group_id, g.role) for g in needy)}
    out = [with_guides(g, added.get((g.group_id, g.role), [])) for g in groups]
    used = [t for guides in added.values() for t in guides]
    return out, {"guided_groups": sum(1 for guides in added.values() if guides), "guide_trajectories": len(used),
                 "guide_success": success_rate([t.reward for t in used], config.rollout.success_threshold),
                 "guides_missing": len(needy) * guidance.k - len(used)}


def teacher_guides(trainer: Any, needy: list[TrajectoryGroup], tasks: dict[str, Any], it: int
                   ) -> dict[tuple[str, str | None], list[Trajectory]]:
    """k rollouts of the teacher through the user's agent for each task of `needy`, recorded in
    the same groups with behaviour 'guide'; (group id, role) -> its guides. A teacher rollout that
    fails (the teacher timed out, its reply broke the agent) is recorded with how it failed and
    not used."""
    config, teacher = trainer.config, trainer.teacher
    todo = [(tid, tasks[tid]) for tid in dict.fromkeys(cast(str, g.task_id) for g in needy)]  # tasks have ids
    if not todo:
        return {}
    acting = acting_policy(teacher.policy, trainer.tokenizer, getattr(trainer.policy, "tool_format", "auto"))
    try:
        found, _ = rollouts.collect(teacher.make_rollout(acting), todo, it, recorder=trainer.recorder,
                                    run_id=trainer.run_id, group_size=config.guidance.k, concurrency=config.rollout.concurrency,
                                    success_threshold=config.rollout.success_threshold, progress=config.run.progress,
                                    policy=acting, seed=derive_seed(config.run.seed, "guide"), desc=f"guides {it + 1}",
                                    behaviour="guide")
    except rollouts.RolloutError as exc:  # every guide rollout failed: recorded, none used
        trainer.say(f"iteration {it + 1}: no guide trajectory ({exc})")
        return {}
    return {(g.group_id, g.role): g.trajectories for g in found}


# --------------------------------------------------------------------------- the teacher's signals
def teacher_logprobs(teacher: Policy, trajectories: Sequence[Trajectory]) -> tuple[dict[tuple[str, int], list[float]], int]:
    """The teacher's log-probability of every completion token of the policy's own steps:
    ((trajectory id, step) -> [C] log-probabilities, steps it could not score: recorded as
    unscored, never as a zero)."""
    scored, failed = {}, 0
    for t in trajectories:
        if t.behaviour != "policy":
            continue
        for k, step in enumerate(t.transitions):
            if not step.has_tokens:
                continue
            try:
                scored[(t.id, k)] = teacher.logprobs(step.prompt_token_ids, step.completion_token_ids)
            except Exception:  # a timeout, an outage, a context too long: this step goes without
                failed += 1
    return scored, failed


def distillation_token_rewards(trajectories: Sequence[Trajectory], scored: dict[tuple[str, int], list[float]],
                               beta: float) -> tuple[list[list[list[float] | None]], float]:
    """Per trajectory per step, `distillation_rewards` of its tokens (None where unscored), and
    the mean log-ratio log pi_teacher - log pi_student over the scored tokens."""
    out, total, n = [], 0.0, 0
    for t in trajectories:
        rows: list[list[float] | None] = []
        for k, step in enumerate(t.transitions):
            teacher_lp = scored.get((t.id, k))
            if teacher_lp is None or not len(teacher_lp) == len(step.completion_logprobs) == len(step.completion_token_ids):
                rows.append(None)
                continue
            student, teacher = torch.tensor(step.completion_logprobs), torch.tensor(teacher_lp)
            rows.append(distillation_rewards(student, teacher, beta).tolist())
            total, n = total + float((teacher - student).sum()), n + len(teacher_lp)
        out.append(rows)
    return out, total / max(n, 1)


def relabel_samples(acting: Policy, trajectories: Sequence[Trajectory], success_threshold: float, max_len: int,
                    concurrency: int = 8) -> tuple[list[Sample], dict]:
    """DAgger: at each distinct state of the policy's failed rollouts, the teacher's greedy
    action, as a sample the objective imitates ('relabel'). A state the teacher could not answer
    is counted, not guessed."""
    states: dict[tuple[int, ...], Transition] = {}
    for t in trajectories:
        if t.behaviour == "policy" and not succeeded(t.reward, success_threshold):
            for step in t.transitions:
                if step.has_tokens:
                    states.setdefault(tuple(step.prompt_token_ids), step)

    def ask(step: Transition):
        try:
            return acting.chat(step.observation.messages, step.observation.tools, temperature=0)
        except Exception:
            return None

    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        answers = list(pool.map(ask, states.values()))
    samples, stats = [], BatchStats()
    for prompt, out in zip(states, answers):
        if out is None or not out.completion_token_ids:
            continue
        completion = list(out.completion_token_ids)
        sample = Sample(input_ids=list(prompt) + completion, loss_mask=[0] * len(prompt) + [1] * len(completion),
                        sampler_logprobs=[0.0] * (len(prompt) + len(completion)),
                        advantages=[0.0] * (len(prompt) + len(completion)), loss_term="relabel")
        if cut_to(sample, max_len, stats):
            samples.append(sample)
    return samples, {"relabel_states": len(states), "relabel_samples": len(samples),
                     "relabel_faults": sum(a is None for a in answers)}


__all__ = ["PROBE_TEXT", "Teacher", "acting_policy", "as_guide", "check_teacher", "demonstration_guides",
           "distillation_token_rewards", "guide", "relabel_samples", "shares_vocabulary", "step_of",
           "own_success_rate", "teacher_guides", "teacher_logprobs", "with_guides"]
