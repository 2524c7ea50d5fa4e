"""Judges: a model's verdict as a reward, for tasks with no checker.

A judge is any `Policy` (the embedded model, a vLLM server, a teacher) or an OpenAI-compatible
URL. `RubricJudge(judge, rubric)` scores one trajectory in [0, 1]; `RelativeJudge(judge, rubric)`
ranks a group's trajectories in one call and scores each in [0, 1] (as OpenPipe ART's RULER
does: comparing is easier than grading alone). Both ask for strict JSON, and a verdict that does
not parse (not JSON, a score out of range, an id missing) is asked again, at most `retries`
times, the error named; a judge that still fails, or times out, gives no score (None) and the
caller leaves that episode (or group) out of training: never a silent 0. Each failure is a
`judge_failed` event in the store, with the episodes and why.

Every verdict is recorded in the store as feedback on its episode (`key`, the score, the judge's
reason, `source="judge:<name>"`), where `feedback_reward` combines it with the others. Verdicts
are cached by the hash of what was judged (the rubric, the transcript, which leaves out call ids),
so equal work judged twice costs one call; a verdict that stayed malformed is cached as failed too
(an unreachable judge is not: it is asked again next time). `score_many` runs several calls at once.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from forge_bridge.core.errors import ForgeBridgeError, InvalidArgument, PolicyError, WrongType
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Feedback, Trajectory
from forge_bridge.policies.base import Policy

Ask = Callable[[list[dict]], str]
"""messages -> the judge's reply text."""


class Malformed(ValueError):
    """A verdict that does not have the shape asked for (said back to the judge when asking again)."""


def asker(judge: Policy | str, *, model: str = "default", api_key: str | None = None, timeout_s: float = 60.0,
          max_tokens: int = 512) -> Ask:
    """How to ask `judge` (a Policy, greedy; or an OpenAI-compatible base URL) for a reply."""
    if isinstance(judge, Policy):
        return lambda messages: judge.chat(messages, temperature=0, max_tokens=max_tokens).text
    if not isinstance(judge, str) or not judge.startswith(("http://", "https://")):
        raise WrongType(f"judge: expected a Policy or an OpenAI-compatible URL, got {judge!r}")
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def ask(messages: list[dict]) -> str:
        try:
            resp = httpx.post(judge.rstrip("/") + "/chat/completions", headers=headers, timeout=timeout_s, json={
                "model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens})
        except httpx.HTTPError as exc:
            raise PolicyError(f"the judge at {judge} is unreachable ({type(exc).__name__}: {exc})") from None
        if resp.status_code != 200:
            raise PolicyError(f"the judge at {judge} answered HTTP {resp.status_code}: {resp.text[:200]}")
        return resp.json()["choices"][0]["message"].get("content") or ""
    return ask


def transcript(trajectory: Trajectory, max_chars: int = 6000) -> str:
    """What the judge reads: the conversation of the trajectory's last step, then its reply."""
    if not trajectory.transitions:
        return "(no model call was recorded)"
    last = trajectory.transitions[-1]
    lines = [f"{m.get('role')}: {m.get('content') or ''}{called(m.get('tool_calls') or [])}"
             for m in last.observation.messages]
    lines.append(f"assistant: {last.action.content}{called([c.to_openai() for c in last.action.tool_calls])}")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else "…" + text[-max_chars:]


def called(tool_calls: list) -> str:
    """A message's tool calls as the judge reads them: name and arguments, not the call ids (which
    mean nothing to a judge, and would make every transcript differ for the cache)."""
    out = ""
    for call in tool_calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments", "")
        out += f" [calls {function.get('name')}({arguments if isinstance(arguments, str) else json.dumps(arguments)})]"
    return out


def parse_json(text: str) -> Any:
    """The one JSON object in a reply (a fenced block or the text itself)."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    start, end = body.find("{"), body.rfind("}")
    try:
        return json.loads(body[start:end + 1] if start >= 0 <= end else body)
    except json.JSONDecodeError as exc:
        raise Malformed(f"not JSON ({exc.msg})") from None


def score_of(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise Malformed(f"{where}: expected a number in [0, 1], got {value!r}")
    return float(value)


# One worked exchange before the real question shows the verdict's shape: small judges (the
# embedded 135M model) copy a shown answer's form where they ignore a described one.
RUBRIC_EXAMPLE = [
    {"role": "user", "content": "Rubric:\nThe reply must greet the user.\n\nThe agent's work:\nuser: hi\nassistant: Hello!"},
    {"role": "assistant", "content": '{"score": 1, "reason": "it greets the user"}'}]
RELATIVE_EXAMPLE = [
    {"role": "user", "content": "Rubric:\nThe reply must greet the user.\n\nThe attempts:\n--- t0 ---\nuser: hi\n"
                                "assistant: Go away.\n\n--- t1 ---\nuser: hi\nassistant: Hello!"},
    {"role": "assistant", "content": '{"scores": [{"id": "t0", "score": 0, "reason": "no greeting"}, '
                                     '{"id": "t1", "score": 1, "reason": "it greets the user"}]}'}]


class Judge:
    """What both judges share: asking with retries, the cache, recording the verdicts."""

    def __init__(self, judge: Policy | str, rubric: str, *, key: str = "judge", retries: int = 2,
                 store: TrajectoryStore | None = None, name: str | None = None, **ask_options: Any) -> None:
        if not isinstance(rubric, str) or not rubric.strip():
            raise InvalidArgument("rubric: expected the criteria the judge applies, as text")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidArgument(f"retries: expected an int >= 0, got {retries!r}")
        self.ask, self.rubric, self.key, self.retries, self.store = asker(judge, **ask_options), rubric, key, retries, store
        self.name = name or (judge if isinstance(judge, str) else type(judge).__name__)
        self.cache: dict[str, Any] = {}
        self.recorded: set[str] = set()
        """Episodes whose verdict is in the store already."""
        self.calls = 0
        """Judge calls made (retries included; cached verdicts cost none)."""
        self.failures: list[str] = []
        """Why each failed verdict failed (the judge unreachable, or malformed `retries` + 1 times)."""
        self._lock = threading.Lock()

    def verdict(self, messages: list[dict], read: Callable[[str], Any], cache_key: str) -> Any | None:
        """The parsed verdict (cached), asking again with the error while it is malformed; None when
        the judge fails."""
        with self._lock:
            if cache_key in self.cache:
                cached = self.cache[cache_key]
                if isinstance(cached, Malformed):  # asked before and never well formed: not asked again
                    self.failures.append(f"malformed: {cached} (cached)")
                    return None
                return cached
        for attempt in range(self.retries + 1):
            with self._lock:
                self.calls += 1
            try:
                reply = self.ask(messages)
                parsed = read(reply)
            except Malformed as exc:
                messages = messages + [{"role": "assistant", "content": reply},
                                       {"role": "user", "content": f"That verdict is malformed: {exc}. Answer again, "
                                                                   "with the JSON object only."}]
                error, malformed = f"malformed: {exc}", exc
                continue
            except (PolicyError, ForgeBridgeError) as exc:
                error, malformed = f"{type(exc).__name__}: {exc}", None
                break
            with self._lock:
                self.cache[cache_key] = parsed
            return parsed
        with self._lock:
            self.failures.append(error)
            if malformed is not None:  # the same text would be judged the same way: cached as failed
                self.cache[cache_key] = malformed
        return None

    def record(self, trajectory: Trajectory, score: float, reason: str) -> None:
        """The verdict as feedback on the trajectory's episode, once per episode (not again when cached)."""
        with self._lock:
            if self.store is None or trajectory.id in self.recorded:
                return
            self.recorded.add(trajectory.id)
        self.store.add_feedback(Feedback(episode_id=trajectory.id, value=score, key=self.key,
                                         comment=reason or None, source=f"judge:{self.name}"))

    def record_failure(self, trajectories: Sequence[Trajectory]) -> None:
        """A failed verdict as a `judge_failed` event in the store (the episodes, the judge, why):
        their reward stays missing, and the store says why."""
        if self.store is not None:
            with self._lock:
                error = self.failures[-1] if self.failures else "no verdict"
            self.store.add_event("judge_failed", detail={"episodes": [t.id for t in trajectories],
                                                         "judge": self.name, "key": self.key, "error": error})

    def digest(self, *texts: str) -> str:
        return hashlib.sha256("\0".join((type(self).__name__, self.rubric) + texts).encode()).hexdigest()


class RubricJudge(Judge):
    """Scores one trajectory against the rubric: `score(t)` -> [0, 1], or None (the judge failed)."""

    def score(self, trajectory: Trajectory) -> float | None:
        text = transcript(trajectory)
        messages = [{"role": "system", "content": "You judge an AI agent's work against a rubric. Answer with one "
                                                  'JSON object: {"score": <a number from 0 to 1>, "reason": "<why>"}.'},
                    *RUBRIC_EXAMPLE, {"role": "user", "content": f"Rubric:\n{self.rubric}\n\nThe agent's work:\n{text}"}]

        def read(reply: str) -> tuple[float, str]:
            data = parse_json(reply)
            if not isinstance(data, dict) or "score" not in data:
                raise Malformed('expected {"score": ..., "reason": ...}')
            return score_of(data["score"], "score"), str(data.get("reason", ""))

        verdict = self.verdict(messages, read, self.digest(text))
        if verdict is None:
            self.record_failure([trajectory])
            return None
        self.record(trajectory, *verdict)
        return verdict[0]

    def score_many(self, trajectories: Sequence[Trajectory], concurrency: int = 8) -> list[float | None]:
        """`score` of each, `concurrency` calls at once, in order."""
        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            return list(pool.map(self.score, trajectories))


class RelativeJudge(Judge):
    """Ranks a group of trajectories of one task in one call: `scores(group)` -> a score in
    [0, 1] for each, in order, or None (the judge failed: the group is not trained on)."""

    def scores(self, trajectories: Sequence[Trajectory]) -> list[float] | None:
        if not trajectories:
            return []
        ids = [f"t{k}" for k in range(len(trajectories))]
        texts = [transcript(t) for t in trajectories]
        listing = "\n\n".join(f"--- {i} ---\n{text}" for i, text in zip(ids, texts))
        messages = [{"role": "system", "content": "You compare several attempts of an AI agent at the same task "
                                                  "and score each against a rubric, relative to the others. Answer "
                                                  'with one JSON object: {"scores": [{"id": "<id>", "score": <0 to 1>, '
                                                  '"reason": "<why>"}, ...]}, one entry per attempt.'},
                    *RELATIVE_EXAMPLE, {"role": "user", "content": f"Rubric:\n{self.rubric}\n\nThe attempts:\n{listing}"}]

        def read(reply: str) -> list[tuple[float, str]]:
            data = parse_json(reply)
            entries = data.get("scores") if isinstance(data, dict) else None
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise Malformed('expected {"scores": [{"id": ..., "score": ...}, ...]}')
            by_id = {e.get("id"): e for e in entries}
            missing = [i for i in ids if i not in by_id]
            if missing or len(by_id) != len(ids):
                raise Malformed(f"expected one score for each of {ids}, missing {missing}")
            return [(score_of(by_id[i].get("score"), f"score of {i}"), str(by_id[i].get("reason", ""))) for i in ids]

        verdict = self.verdict(messages, read, self.digest(*texts))
        if verdict is None:
            self.record_failure(trajectories)
            return None
        for t, (score, reason) in zip(trajectories, verdict):
            self.record(t, score, reason)
        return [score for score, _ in verdict]


__all__ = ["Ask", "Judge", "Malformed", "RelativeJudge", "RubricJudge", "asker", "parse_json", "transcript"]
