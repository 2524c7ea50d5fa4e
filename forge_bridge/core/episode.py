"""Episodes: where adapters put the transitions they record.

An episode is one trajectory being written. Each model call is appended to the store the
moment it returns, and what arrives later (tool results, step rewards) rewrites that step, so
a crash loses at most the step in flight. The current episode lives in a context variable:
LangGraph and asyncio copy the context into their worker threads and tasks, so a call made
anywhere inside `with fb.episode(...)` lands in that episode and concurrent episodes never mix.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import math
import os
import re
import threading
from pathlib import Path
from typing import Any, Callable

from forge_bridge.core.errors import EpisodeClosed, InvalidArgument, PolicyError
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Trajectory, Transition

_END_RANK = {"truncated": 1, "policy_fault": 2, "crashed": 3, "outage": 4}
"""An episode marked twice ends with the graver reason: an outage spoils a truncated episode."""

_TRUNCATIONS: dict[type, str] = {}


def register_truncation(exc_type: type[BaseException], what: str) -> None:
    """An exception raised by a framework's own limit (LangGraph's recursion limit): an episode it
    escapes from ends `truncated` (trained on) instead of `crashed`. Adapters register theirs."""
    _TRUNCATIONS[exc_type] = what


def end_reason_of(exc: BaseException) -> str:
    """How an exception that escaped an episode ends it: truncated, outage or crashed."""
    if isinstance(exc, tuple(_TRUNCATIONS)):
        return "truncated"
    return "outage" if isinstance(exc, PolicyError) else "crashed"

_CURRENT: contextvars.ContextVar["Episode | None"] = contextvars.ContextVar(
    "forge_bridge_episode", default=None)


def default_store_path() -> Path:
    """`FORGE_BRIDGE_STORE`, else `runs/trajectories.db` under the working directory."""
    return Path(os.environ.get("FORGE_BRIDGE_STORE", "runs/trajectories.db"))


class Recorder:
    """Opens episodes on one trajectory store, all tagged with one run id."""

    def __init__(self, store: TrajectoryStore | str | os.PathLike | None = None,
                 run_id: str | None = None, *, redaction: Callable[[Transition], Transition] | None = None) -> None:
        """`redaction`: applied to every step before it is written, e.g.
        `forge_bridge.policies.redaction.Redaction(fn, tokenizer)`: what it removes never
        reaches the store."""
        if isinstance(store, TrajectoryStore):
            self.store = store
        else:
            self.store = TrajectoryStore(store if store is not None else default_store_path())
        self.run_id = run_id
        if redaction is not None and not callable(redaction):
            raise InvalidArgument(f"redaction: expected a function Transition -> Transition, got {redaction!r}")
        self.redaction = redaction

    def episode(self, task_id: str | None = None, group_id: str | None = None, *,
                episode_id: str | None = None, metadata: dict | None = None,
                run_id: str | None = None, seed: int | None = None, behaviour: str = "policy") -> "Episode":
        """Open an episode; with `seed`, each of its sampled model calls that names no seed of
        its own gets one derived from it and the step index (`Episode.call_seed`), so its
        rollout does not depend on which other calls shared a batch (recorded as
        `metadata['seed']`). `behaviour`: whose behaviour its steps are (`BEHAVIOURS`)."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidArgument(f"episode seed: expected an int or None, got {seed!r}")
        traj = Trajectory(task_id=task_id, group_id=group_id, run_id=run_id or self.run_id,
                          metadata=dict(metadata or {}) | ({"seed": seed} if seed is not None else {}),
                          behaviour=behaviour)
        if episode_id is not None:
            traj.id = episode_id
        self.store.begin(traj)
        return Episode(self, traj, seed=seed)


class Episode:
    """One trajectory being recorded; usable as a context manager that makes it current."""

    def __init__(self, recorder: Recorder, trajectory: Trajectory,
                 parent: "Episode | None" = None, seed: int | None = None) -> None:
        self.recorder = recorder
        self.seed = seed
        """Where this episode's call seeds come from (None: the policy draws them)."""
        self._traj = trajectory
        self._lock = threading.RLock()
        self._token: contextvars.Token | None = None
        self.finished = False
        self.parent = parent
        self._children: dict[str, Episode] = {}
        self._own_reward = False
        self._end: tuple[str, str] | None = None  # (end reason, detail) marked before the end

    # ------------------------------------------------------------------ per-role trajectories
    def child(self, key: str, **metadata: Any) -> "Episode":
        """The trajectory of one participant of this episode (a CrewAI role), created on first
        use with the same task and group and this episode's metadata (its iteration, its task's
        kind, the worker that ran it), tagged with the key and this episode's id. When this
        episode ends, its children end with it and share its reward unless given their own."""
        with self._lock:
            ep = self._children.get(key)
            if ep is None:
                self.check_open()
                slug = re.sub(r"[^A-Za-z0-9_-]+", "-", key).strip("-")[:48] or "role"
                seed = None if self.seed is None else derive_seed(self.seed, "role", key)
                traj = Trajectory(id=f"{self.id}.{slug}-{len(self._children)}",
                                  task_id=self._traj.task_id, group_id=self._traj.group_id,
                                  run_id=self._traj.run_id, role=key, behaviour=self._traj.behaviour,
                                  metadata={**self._traj.metadata, "parent": self.id, **metadata}
                                  | ({"seed": seed} if seed is not None else {}))
                self.recorder.store.begin(traj)
                ep = self._children[key] = Episode(self.recorder, traj, parent=self, seed=seed)
            return ep

    @property
    def children(self) -> dict[str, "Episode"]:
        with self._lock:
            return dict(self._children)

    @property
    def id(self) -> str:
        return self._traj.id

    @property
    def trajectory(self) -> Trajectory:
        """What has been recorded so far (a snapshot from the store once finished)."""
        return self._traj

    def call_seed(self) -> int | None:
        """The seed of this episode's next model call: derived from the episode's seed and the
        number of calls recorded so far (None when the episode has no seed)."""
        with self._lock:
            return None if self.seed is None else derive_seed(self.seed, "step", len(self._traj.transitions))

    # ------------------------------------------------------------------ recording
    def record(self, transition: Transition) -> int:
        """Append one model call; returns its step index."""
        with self._lock:
            self.check_open()
            step = self.recorder.store.append(self.id, self._written(transition))
            self._traj.transitions.append(transition)
            return step

    def update(self, step: int, change: Callable[[Transition], None]) -> None:
        """Apply `change` to a recorded step and write it again (tool results, rewards)."""
        with self._lock:
            transition = self._traj.transitions[step]
            change(transition)
            transition.__post_init__()  # re-validate what the change did
            self.recorder.store.update_step(self.id, step, self._written(transition))

    def _written(self, transition: Transition) -> Transition:
        """The step as the store gets it: scrubbed by the recorder's redaction, if it has one."""
        return transition if self.recorder.redaction is None else self.recorder.redaction(transition)

    def step_of_tool_call(self, tool_call_id: str) -> int | None:
        with self._lock:
            for i in range(len(self._traj.transitions) - 1, -1, -1):
                if any(tc.id == tool_call_id for tc in self._traj.transitions[i].action.tool_calls):
                    return i
        return None

    def add_tool_result(self, tool_call_id: str, result: dict) -> int | None:
        """Put a tool's outcome into the step that asked for it; returns that step (or None
        when no recorded step made this call, e.g. a tool run outside the model loop)."""
        step = self.step_of_tool_call(tool_call_id)
        if step is None:
            return None
        self.update(step, lambda t: t.info.setdefault("tool_results", {}).__setitem__(tool_call_id, result))
        return step

    def attach_tool_results(self, messages: list[dict]) -> int:
        """Record the tool results an agent feeds back in its next prompt (OpenAI `tool`
        messages) into the steps that made those calls, for frameworks whose tool runs cannot
        be hooked directly. Results already recorded are left alone; returns how many were added."""
        added = 0
        for m in messages:
            call_id = m.get("tool_call_id") if m.get("role") == "tool" else None
            step = self.step_of_tool_call(call_id) if call_id else None
            if not call_id or step is None or call_id in self._traj.transitions[step].info.get("tool_results", {}):
                continue
            content = m.get("content")
            self.add_tool_result(call_id, {"name": m.get("name"), "content": content if isinstance(
                content, str) else json.dumps(content), "source": "next prompt"})
            added += 1
        return added

    # ------------------------------------------------------------------ rewards and ending
    def reward(self, value: float, role: str | None = None) -> None:
        """The outcome reward of the whole episode (pass/fail or a score), or of one role's
        trajectory when `role` is given (the others keep the shared reward)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidArgument(f"reward: expected a finite number, got {value!r}")
        if role is not None:
            if role not in self.children:
                raise InvalidArgument(f"reward: no trajectory for role {role!r} in this episode "
                                 f"(roles: {sorted(self.children)})")
            self.children[role].reward(value)
            return
        with self._lock:
            self._traj.reward = float(value)
            self._own_reward = True
            if self.finished:  # e.g. scored after the agent stopped: keep the score too
                assert self._traj.end_reason is not None  # a finished episode has its end reason
                self.recorder.store.finish(self.id, self._traj.end_reason, reward=self._traj.reward,
                                           metadata=self._traj.metadata,
                                           end_detail=self._traj.end_detail)

    def _rewarded_step(self, what: str, value: float, step: int) -> int:
        """The index of recorded step `step` (negative counts from the end) for a reward `value`:
        no step recorded yet, a value that is not a finite number, or a step not recorded raises."""
        if not self._traj.transitions:
            raise InvalidArgument(f"{what}: no step has been recorded in this episode yet")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidArgument(f"{what}: expected a finite number, got {value!r}")
        n = len(self._traj.transitions)
        if isinstance(step, bool) or not isinstance(step, int) or not -n <= step < n:
            raise InvalidArgument(f"{what}: step: expected an integer in [{-n}, {n}) (the {n} steps recorded), "
                                  f"got {step!r}")
        return step % n

    def step_reward(self, value: float, step: int = -1) -> None:
        """A reward on one step (the latest by default), added to what it already has."""
        index = self._rewarded_step("step_reward", value, step)
        self.update(index, lambda t: setattr(t, "reward", t.reward + float(value)))

    def span_reward(self, value: float, start: int, end: int, step: int = -1, key: str | None = None) -> None:
        """A reward on completion tokens [start, end) of one step (the latest by default): the
        trainer adds `span_weight * value` to those tokens' advantage, on top of the step's, so
        the part of a call that was right (or wrong) is pushed apart from the rest. `key` says what
        the span is compared with under GRPO's `span_baseline='group'` (the spans of the same key in
        the other rollouts, e.g. one argument's name). Recorded in `info['span_rewards']` as
        [start, end, value] or [start, end, value, key]."""
        index = self._rewarded_step("span_reward", value, step)
        n = len(self._traj.transitions[index].completion_token_ids)
        if not (all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)) and 0 <= start < end <= n):
            raise InvalidArgument(f"span_reward: expected 0 <= start < end <= {n} (the step's completion "
                                  f"tokens), got start={start!r}, end={end!r}")
        if key is not None and not isinstance(key, str):
            raise InvalidArgument(f"span_reward: key: expected a string or None, got {key!r}")
        span = [start, end, float(value)] + ([key] if key is not None else [])
        self.update(index, lambda t: t.info.setdefault("span_rewards", []).append(span))

    def mark_end(self, reason: str, detail: str) -> None:
        """Say how this episode will end, before it does (see `types.END_REASONS`): a limit cut
        it (`truncated`), the model failed on its own (`policy_fault`), the policy was out
        (`outage`), the agent crashed (`crashed`). Marked twice, the graver reason stays; an
        outage or a crash also spoils the whole crew episode a role belongs to."""
        if reason not in _END_RANK:
            raise InvalidArgument(f"mark_end: expected one of {sorted(_END_RANK)}, got {reason!r}")
        with self._lock:
            if self._end is None or _END_RANK[reason] > _END_RANK[self._end[0]]:
                self._end = (reason, str(detail))
        if self.parent is not None and reason in ("outage", "crashed"):
            self.parent.mark_end(reason, detail)

    def truncate(self, reason: str) -> None:
        """A limit (steps, time) cut the episode short: it ends as `truncated`, not failed, so
        a trainer still learns from it."""
        self.mark_end("truncated", reason)

    def fail(self, reason: str, end_reason: str = "crashed", **metadata: Any) -> Trajectory:
        """End the episode now as failed, with why (default: the agent crashed)."""
        self.mark_end(end_reason, reason)
        return self.finish(**metadata)

    @property
    def end_reason(self) -> str | None:
        """How the episode ended, or will end as marked so far (None: open, nothing marked)."""
        with self._lock:
            return self._traj.end_reason if self.finished else (self._end or (None,))[0]

    def finish(self, end_reason: str | None = None, detail: str | None = None,
               **metadata: Any) -> Trajectory:
        """Close the episode in the store; idempotent. It ends as marked (`mark_end`), else as
        `end_reason`, else `terminated`; its last step gets Gymnasium's `terminated` or
        `truncated` flag to match. Roles (children) end with it, sharing its reward unless given
        their own."""
        if end_reason is not None and end_reason != "terminated":
            self.mark_end(end_reason, detail or end_reason)
        with self._lock:
            if self.finished:
                return self._traj
            for ep in self._children.values():
                if not ep._own_reward and self._traj.reward is not None:
                    ep._traj.reward = self._traj.reward
                if self._end is not None:
                    ep.mark_end(*self._end)
                ep.finish(**metadata)
            reason, why = self._end or ("terminated", None)
            last = len(self._traj.transitions) - 1
            if last >= 0 and reason != "outage" and reason != "crashed":
                flag = "truncated" if reason == "truncated" else "terminated"
                self.update(last, lambda t: setattr(t, flag, True))
            self._traj.metadata.update(metadata)
            self.recorder.store.finish(self.id, reason, reward=self._traj.reward,
                                       metadata=self._traj.metadata, end_detail=why)
            self._traj.end_reason, self._traj.end_detail = reason, why
            self.finished = True
            return self._traj

    def check_open(self) -> None:
        if self.finished:
            raise EpisodeClosed(f"episode {self.id} is finished ({self._traj.status}); "
                               "open a new episode to record more steps")

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "Episode":
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
        if exc is not None and not self.finished:
            reason = end_reason_of(exc)
            what = _TRUNCATIONS.get(type(exc), exc_type.__name__) if reason == "truncated" else exc_type.__name__
            self.mark_end(reason, f"{what}: {exc}")
        self.finish()


def current_episode() -> Episode | None:
    """The episode opened by the innermost `with fb.episode(...)` in this context."""
    return _CURRENT.get()


_default_recorder: Recorder | None = None
_default_lock = threading.Lock()


def default_recorder() -> Recorder:
    global _default_recorder
    with _default_lock:
        if _default_recorder is None:
            _default_recorder = Recorder()
        return _default_recorder


def episode(task_id: str | None = None, group_id: str | None = None, *,
            recorder: Recorder | None = None, metadata: dict | None = None,
            seed: int | None = None, behaviour: str = "policy") -> Episode:
    """Open an episode (one trajectory) for `with`: every model call inside is recorded into it
    (`seed`: reproducible sampling, see `Recorder.episode`; `behaviour`: 'upstream' for an
    agent recorded on its own model, see `ForgeMiddleware(passthrough=True)`)."""
    return (recorder or default_recorder()).episode(task_id, group_id, metadata=metadata, seed=seed,
                                                    behaviour=behaviour)


def derive_seed(seed: int, *parts: Any) -> int:
    """A 31-bit seed from `seed` and `parts`, the same on every machine and in every process."""
    digest = hashlib.blake2b(repr((seed,) + parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF
