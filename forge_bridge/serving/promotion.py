"""Guarded promotion: a new adapter serves the agent only after it passes a gate, and a served
one whose live scores fall is rolled back, by itself.

`Promotion(policy, evaluate, gate)`:
- `consider(path, version)` loads the candidate into a slot of its own (`candidate`), where no
  user request goes; `evaluate(slot)` scores it and the serving version on the user's held-out
  suite; the candidate is promoted (`Policy.promote`: no reload, calls in flight finish on the
  old version) only when its score is at least the serving version's minus `gate.margin`, and
  is dropped otherwise. Users are served by the current version throughout.
- `observe(score)` takes each live score (a user's feedback, a judge's verdict) of the version
  that served it. Once the promoted version has `gate.window` of them, and their mean is more
  than `gate.drop` below the previous version's last `window` (or below the promoted version's
  own first `window` when the previous one had too few), the slot rolls back to the previous
  version (instant: it is still loaded).
Every promotion, refusal and rollback is recorded in the store (`store.events()`), with the
scores that decided it.

`evaluate` is a held-out suite (`slot -> score`), or a `Shadow`: live requests answered by the
candidate too, judged side by side with what the users were served.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from forge_bridge.core.actions import Observation
from forge_bridge.core.errors import InvalidArgument, InvalidState, WrongType
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Trajectory, Transition, prefers
from forge_bridge.policies.base import DEFAULT_SLOT, Policy, PolicyOutput

CANDIDATE = "candidate"
"""The slot a candidate is tried in: no user request is served from it."""
SERVING = "<serving>"
"""`observe`'s default version: whatever the slot serves now (never a valid version name)."""


class Scores:
    """One version's live scores: how many, the first `window` and the last `window`."""

    def __init__(self, window: int) -> None:
        self.window, self.count = window, 0
        self.first: list[float] = []
        self.recent: deque = deque(maxlen=window)

    def add(self, score: float) -> None:
        self.count += 1
        if len(self.first) < self.window:
            self.first.append(score)
        self.recent.append(score)

    def mean_recent(self) -> float:
        return sum(self.recent) / len(self.recent)


@dataclass(frozen=True)
class Gate:
    """When a candidate adapter may serve, and when a served one is rolled back."""

    margin: float = 0.0
    """The candidate's held-out score may trail the serving version's by at most this."""
    window: int = 20
    """Live scores compared to decide a rollback."""
    drop: float = 0.2
    """A rollback when the promoted version's last `window` live scores average this much below the baseline."""

    def __post_init__(self) -> None:
        for name in ("margin", "drop"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"{name}: expected a finite number >= 0, got {value!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise InvalidArgument(f"window: expected an int >= 1, got {self.window!r}")


class Promotion:
    """Gate and watch the versions one slot of `policy` serves (see the module docstring)."""

    def __init__(self, policy: Policy, evaluate: Callable[[str], float], gate: Gate = Gate(), *,
                 store: TrajectoryStore | None = None, slot: str = DEFAULT_SLOT) -> None:
        if not isinstance(policy, Policy):
            raise WrongType(f"policy: expected a forge_bridge Policy, got {type(policy).__name__}")
        if not callable(evaluate):
            raise WrongType("evaluate: expected a function slot -> held-out score")
        self.policy, self.evaluate, self.gate, self.store, self.slot = policy, evaluate, gate, store, slot
        self.live: dict[str | None, Scores] = {}
        """Version -> its live scores (the first and the last `window` of them)."""
        self.promoted: str | None = None
        """The version the last promotion made current (watched for a fall until rolled back)."""
        self.previous: str | None = None
        """The version that promotion replaced (what a rollback returns to)."""
        self._lock = threading.Lock()

    def consider(self, path: str | Path, version: str) -> bool:
        """Try `version` on the held-out suite beside the serving one; promote it if it passes."""
        serving = self.policy.current(self.slot)
        self.policy.load_adapter(path, version, slot=CANDIDATE)
        try:
            candidate_score, serving_score = float(self.evaluate(CANDIDATE)), float(self.evaluate(self.slot))
        except BaseException:  # no verdict: the candidate leaves its slot, unserved
            self.policy.rollback(CANDIDATE)
            raise
        detail = {"candidate": candidate_score, "serving": serving_score, "serving_version": serving,
                  "margin": self.gate.margin}
        if not prefers(serving_score, candidate_score, self.gate.margin):  # not worse by more than the margin
            self.policy.promote(version, CANDIDATE, self.slot)
            with self._lock:
                self.promoted, self.previous = version, serving
            self._event("promoted", version, detail)
            return True
        self.policy.rollback(CANDIDATE)  # the candidate slot back to what it served: never the users'
        self._event("refused", version, detail)
        return False

    def observe(self, score: float, version: str | None = SERVING) -> bool:
        """One live score of the response `version` served (default: the slot's current one);
        True when this score triggered a rollback (the slot serves the previous version again)."""
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise InvalidArgument(f"score: expected a finite number, got {score!r}")
        version = self.policy.current(self.slot) if version == SERVING else version
        window = self.gate.window
        with self._lock:
            mine = self.live.setdefault(version, Scores(window))
            mine.add(float(score))
            if version is None or version != self.promoted or version != self.policy.current(self.slot):
                return False
            before = self.live.get(self.previous)
            if before is not None and before.count >= window:
                baseline = before.mean_recent()
            elif mine.count >= 2 * window:
                baseline = sum(mine.first) / window
            else:
                return False
            if mine.count < window or mine.mean_recent() >= baseline - self.gate.drop:
                return False
            back, self.promoted = self.policy.rollback(self.slot), None
            detail = {"live_mean": mine.mean_recent(), "baseline": baseline, "drop": self.gate.drop,
                      "back_to": back, "window": window}
        self._event("rolled back", version, detail)
        return True

    def _event(self, kind: str, version: str, detail: dict) -> None:
        if self.store is not None:
            self.store.add_event(kind, version=version, slot=self.slot, detail=detail)


class Shadow:
    """A shadow run as the gate's `evaluate`: `Promotion(policy, Shadow(judge), gate)`, and
    `Gateway(policy, recorder, shadow=that Shadow)`.

    While `consider` waits on `evaluate("candidate")`, `share` of the live requests the gateway
    serves are answered by the candidate too, in the background: the user gets the serving
    version's answer, unchanged and unslowed; the candidate's is recorded nowhere and shown to no
    one. `judge` (a `RelativeJudge`, with no store: the pair is not an episode) compares the two
    replies to the same messages side by side, in a random order. After `requests` judged pairs,
    the candidate's mean score is its result, and the serving version's mean over the same pairs
    is `evaluate(serving slot)`'s. No verdict within `timeout_s` (too little traffic, a failing
    candidate or judge) raises `InvalidState`: `consider` drops the candidate, unserved.
    """

    def __init__(self, judge, *, share: float = 0.1, requests: int = 20, timeout_s: float = 3600.0,
                 slot: str = DEFAULT_SLOT, seed: int = 0) -> None:
        """`slot`: the slot whose users' requests are mirrored (the one `Promotion` guards)."""
        if not callable(getattr(judge, "scores", None)):
            raise WrongType("judge: expected a RelativeJudge (scores(trajectories) -> a score for each, or None)")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise InvalidArgument(f"share: expected a number in (0, 1], got {share!r}")
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
            raise InvalidArgument(f"requests: expected an int >= 1, got {requests!r}")
        self.judge, self.share, self.requests, self.timeout_s = judge, float(share), requests, float(timeout_s)
        self.slot = slot
        self.rng = random.Random(seed)
        self.pairs: list[tuple[float, float]] = []
        """The open (or last) run's judged pairs: (serving score, candidate score)."""
        self.failures = 0
        """Mirrored requests with no verdict (the candidate or the judge failed): never the user's concern."""
        self._open = False
        self._done = threading.Condition()
        self._tasks: set = set()

    def __call__(self, slot: str) -> float:
        if slot != CANDIDATE:  # the serving version, over the pairs of the run just ended
            if len(self.pairs) < self.requests:
                raise InvalidState("Shadow: no shadow run has ended: the candidate is evaluated first")
            return sum(s for s, _ in self.pairs) / len(self.pairs)
        with self._done:
            self.pairs, self._open = [], True
            ended = self._done.wait_for(lambda: len(self.pairs) >= self.requests, timeout=self.timeout_s)
            self._open = False
        if not ended:
            raise InvalidState(f"Shadow: {len(self.pairs)} of {self.requests} live requests judged within "
                               f"{self.timeout_s:g} s ({self.failures} without a verdict): no verdict")
        return sum(c for _, c in self.pairs) / len(self.pairs)

    def offer(self, policy: Policy, messages: list, tools: list | None, served: PolicyOutput, sampling: dict) -> None:
        """The gateway's hook, in its event loop, after a user's request was answered by `served`."""
        if self._open and served.slot == self.slot and self.rng.random() < self.share:
            task = asyncio.get_running_loop().create_task(self._mirror(policy, messages, tools, served, sampling))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _mirror(self, policy: Policy, messages: list, tools: list | None, served: PolicyOutput,
                      sampling: dict) -> None:
        try:
            candidate = await policy.achat(messages, tools, slot=CANDIDATE, **sampling)
            flip = self.rng.random() < 0.5  # the judge sees them in a random order
            pair = [reply(messages, tools, out, k) for k, out in enumerate((served, candidate))]
            scores = await asyncio.to_thread(self.judge.scores, pair[::-1] if flip else pair)
        except Exception:  # noqa: BLE001 - a mirrored request never fails the user's
            scores = None
        with self._done:
            if scores is None:
                self.failures += 1
            elif self._open:
                self.pairs.append(tuple(scores[::-1]) if flip else tuple(scores))
                self._done.notify_all()


def reply(messages: list, tools: list | None, out: PolicyOutput, k: int) -> Trajectory:
    """One reply to `messages` as a one-step trajectory, for a judge to read (stored nowhere)."""
    return Trajectory(id=f"shadow-{k}", task_id="shadow", end_reason="terminated", transitions=[Transition(
        observation=Observation(messages=messages, tools=tools), action=out.action,
        prompt_token_ids=out.prompt_token_ids, completion_token_ids=out.completion_token_ids,
        completion_logprobs=out.completion_logprobs)])


__all__ = ["CANDIDATE", "SERVING", "Gate", "Promotion", "Scores", "Shadow"]
