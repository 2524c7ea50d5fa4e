"""Judges by hand: scripted verdicts, malformed verdicts asked again (and given up on after the
retries: no score, never a 0), a judge that is unreachable, the cache, a group ranked in one
call, and every verdict recorded as feedback on its episode."""

import json

import pytest

from forge_bridge.core.actions import Action, Observation
from forge_bridge.core.errors import InvalidArgument, PolicyUnavailable, WrongType
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Trajectory, Transition
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.rewards.feedback import feedback_reward
from forge_bridge.rewards.judges import RelativeJudge, RubricJudge, parse_json

RUBRIC = "The answer must be the sum, stated plainly."


def attempt(answer: str, tid: str) -> Trajectory:
    step = Transition(observation=Observation(messages=[{"role": "user", "content": "What is 2 plus 3?"}]),
                      action=Action(content=answer), prompt_token_ids=[1], completion_token_ids=[2],
                      completion_logprobs=[0.0])
    return Trajectory(id=tid, task_id="add", end_reason="terminated", transitions=[step])


def judge_policy(replies: list, seen: list | None = None) -> ScriptedPolicy:
    """A judge that says each of `replies` in turn (an exception is raised instead of said)."""
    it = iter(replies)

    def say(messages, tools):
        if seen is not None:
            seen.append(messages)
        reply = next(it)
        if isinstance(reply, Exception):
            raise reply
        return reply
    return ScriptedPolicy(say, models.tiny()[1])


@pytest.fixture
def store(tmp_path):
    with TrajectoryStore(tmp_path / "t.db") as s:
        s.add_many([attempt("The answer is 5.", "good"), attempt("Maybe 6?", "bad"), attempt("5", "terse")])
        yield s


def test_a_rubric_verdict_is_scored_recorded_and_cached(store):
    seen: list = []
    judge = RubricJudge(judge_policy(['{"score": 0.9, "reason": "correct and plain"}'], seen), RUBRIC, store=store)
    good = store.get("good")
    assert judge.score(good) == 0.9
    assert RUBRIC in seen[0][-1]["content"] and "The answer is 5." in seen[0][-1]["content"]
    assert [m["role"] for m in seen[0]] == ["system", "user", "assistant", "user"]  # a worked example first
    assert parse_json(seen[0][2]["content"])["score"] == 1
    assert judge.score(good) == 0.9 and judge.calls == 1  # cached by what was judged: no second call
    (event,) = store.feedback(["good"])["good"]  # recorded once
    assert (event.key, event.value, event.comment, event.source) == ("judge", 0.9, "correct and plain",
                                                                     "judge:ScriptedPolicy")


def test_a_malformed_verdict_is_asked_again_with_its_error(store):
    seen: list = []
    judge = RubricJudge(judge_policy(["I think it is fine.", '{"score": 7}', '```json\n{"score": 0.25}\n```'], seen),
                        RUBRIC, store=store, retries=2)
    assert judge.score(store.get("bad")) == 0.25 and judge.calls == 3
    assert "not JSON" in seen[1][-1]["content"] and "[0, 1]" in seen[2][-1]["content"]  # told what was wrong


def test_a_judge_that_keeps_failing_gives_no_score_never_a_zero(store):
    judge = RubricJudge(judge_policy(["nope", "still nope"]), RUBRIC, store=store, retries=1)
    assert judge.score(store.get("bad")) is None and judge.calls == 2 and "malformed" in judge.failures[0]
    assert judge.score(store.get("bad")) is None and judge.calls == 2  # stayed malformed: cached, not asked again
    down = RubricJudge(judge_policy([PolicyUnavailable("the judge timed out"), '{"score": 0.5}']), RUBRIC, store=store)
    assert down.score(store.get("bad")) is None and down.calls == 1 and "timed out" in down.failures[0]
    assert down.score(store.get("terse")) == 0.5  # an outage is not cached: asked again next time
    url = RubricJudge("http://127.0.0.1:9/v1", RUBRIC, store=store, timeout_s=2)
    assert url.score(store.get("bad")) is None and "unreachable" in url.failures[0]
    assert store.feedback(["bad"]) == {}  # nothing recorded, so the episode's reward stays missing
    assert feedback_reward(store.feedback(["bad"]).get("bad", [])) is None
    failed = store.events("judge_failed")  # each failed verdict is in the store, with why
    assert [e["detail"]["episodes"] for e in failed] == [["bad"]] * 4
    assert [word in e["detail"]["error"] for word, e in zip(("malformed", "(cached)", "timed out", "unreachable"),
                                                           failed)] == [True] * 4


def test_the_transcript_leaves_out_call_ids_so_equal_work_is_judged_once(store):
    def called(call_id: str) -> Trajectory:
        messages = [{"role": "user", "content": "What is 2 plus 3?"},
                    {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function", "function": {
                        "name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
                    {"role": "tool", "tool_call_id": call_id, "content": "5"}]
        step = Transition(observation=Observation(messages=messages), action=Action(content="It is 5."),
                          prompt_token_ids=[1], completion_token_ids=[2], completion_logprobs=[0.0])
        return Trajectory(id=call_id, task_id="add", end_reason="terminated", transitions=[step])

    seen: list = []
    judge = RubricJudge(judge_policy(['{"score": 1, "reason": "right"}'], seen), RUBRIC, store=store)
    first, second = called("call_a1"), called("call_b2")
    store.add_many([first, second])
    assert judge.score(first) == judge.score(second) == 1.0 and judge.calls == 1
    assert "assistant:  [calls add({\"a\": 2, \"b\": 3})]\ntool: 5\nassistant: It is 5." in seen[0][-1]["content"]
    assert "call_a1" not in seen[0][-1]["content"]
    assert [e.value for e in store.feedback(["call_b2"])["call_b2"]] == [1.0]  # each episode still gets its verdict


def test_a_group_is_ranked_in_one_call(store):
    verdict = {"scores": [{"id": "t0", "score": 1.0, "reason": "right"}, {"id": "t1", "score": 0.0, "reason": "wrong"},
                          {"id": "t2", "score": 0.7, "reason": "right, terse"}]}
    incomplete = {"scores": verdict["scores"][:2]}
    judge = RelativeJudge(judge_policy([json.dumps(incomplete), json.dumps(verdict)]), RUBRIC, store=store,
                          key="ruler")
    group = [store.get(i) for i in ("good", "bad", "terse")]
    assert judge.scores(group) == [1.0, 0.0, 0.7] and judge.calls == 2  # the one missing t2 was asked again
    assert {tid: [e.value for e in events] for tid, events in store.feedback().items()} == \
           {"good": [1.0], "bad": [0.0], "terse": [0.7]}
    assert RelativeJudge(judge_policy(["{}"] * 3), RUBRIC).scores(group) is None  # the group is not trained on


def test_bad_settings_are_refused():
    with pytest.raises(InvalidArgument, match="rubric"):
        RubricJudge(judge_policy([]), "  ")
    with pytest.raises(InvalidArgument, match="retries"):
        RubricJudge(judge_policy([]), RUBRIC, retries=-1)
    with pytest.raises(WrongType, match="judge"):
        RubricJudge("not a url", RUBRIC)
    assert parse_json('Sure: {"score": 1}') == {"score": 1}
