"""The signal probe: before an hour of GRPO, does each kind of task give it anything to compare?

GRPO learns from the spread of rewards within a group of rollouts of one task. A kind of task
that the current policy never solves (or always solves) gives every group the same reward and
so no gradient: no amount of RL changes that. The probe samples one group per task with the
current policy, through the user's own rollout function and the same recording as training
(the episodes are stored under the run id '<run>-probe'), and reports per task kind the success
rate and the share of groups with no reward spread, with advice where a kind has no signal.
Greedy (`greedy=True`, one rollout per task), the same function is the held-out check the SFT
warm start runs before and after its fit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence, cast

from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import succeeded
from forge_bridge.trainer import rollouts

NO_SIGNAL_DOC = "docs/own-agent.md#no-signal"


@dataclass(frozen=True)
class KindSignal:
    """One task kind's rollouts in a probe."""

    kind: str
    rollouts: int
    """Trainable rollouts sampled."""
    successes: int
    """Rollouts whose reward reached the success threshold."""
    groups: int
    """Tasks (one group each) with at least one trainable rollout."""
    uniform_groups: int
    """Groups whose rollouts all got the same reward: nothing for GRPO to compare."""

    @property
    def success_rate(self) -> float:
        return self.successes / self.rollouts if self.rollouts else 0.0


@dataclass(frozen=True)
class ProbeReport:
    """What a probe saw, per task kind."""

    kinds: dict[str, KindSignal]
    group_size: int
    greedy: bool

    @property
    def rollouts(self) -> int:
        return sum(k.rollouts for k in self.kinds.values())

    @property
    def success_rate(self) -> float:
        return sum(k.successes for k in self.kinds.values()) / self.rollouts if self.rollouts else 0.0

    @property
    def zero_signal_share(self) -> float:
        """The share of groups with no reward spread (1.0 when there were none)."""
        groups = sum(k.groups for k in self.kinds.values())
        return sum(k.uniform_groups for k in self.kinds.values()) / groups if groups else 1.0

    def metrics(self, prefix: str = "probe") -> dict[str, float]:
        """Flat numbers for a metrics line: '<prefix>/success/<kind>', '<prefix>/zero_signal_share'."""
        out = {f"{prefix}/success_rate": self.success_rate}
        if not self.greedy:
            out[f"{prefix}/zero_signal_share"] = self.zero_signal_share
        return out | {f"{prefix}/success/{kind}": k.success_rate for kind, k in self.kinds.items()}

    def advice(self) -> list[str]:
        """One line per kind GRPO cannot learn from as it stands."""
        lines = []
        for kind, k in self.kinds.items():
            if k.rollouts and k.successes == 0:
                lines.append(f"the kind {kind!r} succeeded in 0 of {k.rollouts} rollouts: GRPO has nothing to "
                             f"compare there; add demonstrations of it (fb.sft) or a teacher ({NO_SIGNAL_DOC})")
            elif not self.greedy and k.groups and k.uniform_groups == k.groups:
                lines.append(f"the kind {kind!r} succeeded in every one of its {k.rollouts} rollouts: no group "
                             "differs, so GRPO has nothing to learn there (harder tasks of it would)")
        return lines

    def __str__(self) -> str:
        spread = "" if self.greedy else "  no-spread groups"
        rows = [f"{'kind':<16} {'success':>15}{spread}"]
        for kind, k in self.kinds.items():
            row = f"{kind:<16} {k.successes:>5} of {k.rollouts:<4} {k.success_rate:>4.0%}"
            if not self.greedy:
                row += f"  {k.uniform_groups:>3} of {k.groups:<3}"
            rows.append(row)
        return "\n".join(rows + self.advice())


def kind_of(task: Any, key: str) -> str:
    """A task's kind: `rollouts.field_of(task, key)`; a clear error when it has none."""
    value = rollouts.field_of(task, key)
    if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
        raise InvalidArgument(f"probe: task {rollouts.task_id_of(task, 0)!r} has no {key!r} (got {value!r}); give "
                              f"every task a kind (task[{key!r}] = 'lookup', say), or name the field that "
                              "holds it with kind_key=...")
    return str(value)


def probe(rollout: rollouts.Rollout, tasks: Sequence[Any], *, recorder: Recorder, run_id: str = "probe",
          group_size: int = 8, kind_key: str = "kind", greedy: bool = False, concurrency: int = 4,
          success_threshold: float = 1.0, progress: bool = True, policy: Any = None,
          seed: int | None = 0, require_kind: bool = True) -> ProbeReport:
    """Sample `group_size` rollouts of every task (one, greedy, with `greedy`) with the policy
    as it serves now; returns the per-kind report. Nothing is trained. Without `require_kind`,
    tasks with no kind are counted together as 'all'."""
    from forge_bridge.policies.base import sampling

    tasks = list(tasks)
    if not tasks:
        raise InvalidArgument("probe: expected at least one task")
    indexed = [(rollouts.task_id_of(t, i), t) for i, t in enumerate(tasks)]
    kinds = {tid: kind_of(task, kind_key) if require_kind or rollouts.field_of(task, kind_key) is not None else "all"
             for tid, task in indexed}  # every task checked first

    def run(task: Any) -> float:
        with sampling(temperature=0) if greedy else contextlib.nullcontext():
            return rollout(task)

    groups, _ = rollouts.collect(run, indexed, 0, recorder=recorder, run_id=run_id,
                                 group_size=1 if greedy else group_size, concurrency=concurrency,
                                 success_threshold=success_threshold, progress=progress, policy=policy, seed=seed,
                                 desc=run_id)
    counts: dict[str, list[int]] = {kind: [0, 0, 0, 0] for kind in dict.fromkeys(kinds.values())}
    for group in groups:
        rewards = [float(t.reward or 0.0) for t in group.trajectories]
        c = counts[kinds[cast(str, group.task_id)]]  # a probed task has an id
        c[0] += len(rewards)
        c[1] += sum(succeeded(r, success_threshold) for r in rewards)
        c[2] += 1
        c[3] += max(rewards) - min(rewards) <= 1e-9
    return ProbeReport({kind: KindSignal(kind, *c) for kind, c in counts.items()}, 1 if greedy else group_size, greedy)


__all__ = ["KindSignal", "ProbeReport", "kind_of", "probe"]
