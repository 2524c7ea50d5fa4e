import asyncio
import threading

import pytest

from forge_bridge.core.episode import Recorder, current_episode, episode
from forge_bridge.core.errors import EpisodeClosed
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Observation, ToolCall, Transition


@pytest.fixture
def recorder(tmp_path):
    return Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="s")


def step(tag: str, call_id: str | None = None) -> Transition:
    calls = [ToolCall(id=call_id, name="add", arguments="{}")] if call_id else []
    return Transition(observation=Observation(messages=[{"role": "user", "content": tag}]),
                      action=Action(content=tag, tool_calls=calls), prompt_token_ids=[1],
                      completion_token_ids=[2], completion_logprobs=[-1.0])


def test_episode_records_steps_tool_results_and_rewards(recorder):
    with episode("t1", "g1", recorder=recorder) as ep:
        assert current_episode() is ep
        ep.record(step("a", call_id="c1"))
        ep.record(step("b"))
        assert ep.add_tool_result("c1", {"content": "5", "status": "success"}) == 0
        assert ep.add_tool_result("unknown", {"content": "x"}) is None
        ep.step_reward(0.25)
        ep.reward(1.0)
        # Written as it happens: the store already has both steps while the episode is open.
        assert len(recorder.store.get(ep.id)) == 2
    assert current_episode() is None
    traj = recorder.store.get(ep.id)
    assert traj.status == "complete" and traj.reward == 1.0 and traj.task_id == "t1"
    assert traj.transitions[0].info["tool_results"]["c1"]["content"] == "5"
    assert [t.reward for t in traj] == [0.0, 0.25]
    with pytest.raises(EpisodeClosed):
        ep.record(step("late"))


def test_an_exception_ends_the_episode_as_failed_with_the_reason(recorder):
    with pytest.raises(ZeroDivisionError):
        with episode("t", recorder=recorder) as ep:
            ep.record(step("a"))
            1 / 0
    traj = recorder.store.get(ep.id)
    assert traj.status == "failed" and traj.end_reason == "crashed" and len(traj) == 1
    assert "ZeroDivisionError" in traj.end_detail
    assert not traj.transitions[-1].terminated and not traj.transitions[-1].truncated


def test_bad_rewards_are_refused(recorder):
    with episode(recorder=recorder) as ep:
        with pytest.raises(ValueError, match="reward"):
            ep.reward(float("nan"))
        with pytest.raises(ValueError, match="no step"):
            ep.step_reward(1.0)


def test_concurrent_threads_and_tasks_keep_their_own_episodes(recorder):
    seen = {}

    def agent(i: int) -> None:
        with episode(f"thread-{i}", recorder=recorder) as ep:
            for j in range(5):
                current_episode().record(step(f"{i}-{j}"))
            seen[i] = ep.id

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def async_agent(i: int) -> str:
        with episode(f"task-{i}", recorder=recorder) as ep:
            for j in range(3):
                await asyncio.sleep(0)
                current_episode().record(step(f"a{i}-{j}"))
            return ep.id

    async def main():
        return await asyncio.gather(*(async_agent(i) for i in range(8)))

    task_ids = asyncio.run(main())
    for i, tid in seen.items():
        assert [t.action.content for t in recorder.store.get(tid)] == [f"{i}-{j}" for j in range(5)]
    for i, tid in enumerate(task_ids):
        assert [t.action.content for t in recorder.store.get(tid)] == [f"a{i}-{j}" for j in range(3)]


def test_nested_episodes_restore_the_outer_one(recorder):
    with episode("outer", recorder=recorder) as outer:
        with episode("inner", recorder=recorder) as inner:
            assert current_episode() is inner
        assert current_episode() is outer


def test_truncated_episode_ends_truncated_not_failed(recorder):
    with episode("loop", recorder=recorder) as ep:
        ep.record(step("a"))
        ep.truncate("more than 4 model calls")
    traj = recorder.store.get(ep.id)
    assert traj.status == "truncated" and traj.end_reason == "truncated"
    assert traj.end_detail == "more than 4 model calls"
    assert traj.transitions[-1].truncated and not traj.transitions[-1].terminated


def test_reward_given_after_an_adapter_ended_the_episode_is_kept(recorder):
    with episode("late", recorder=recorder) as ep:
        ep.record(step("a"))
        ep.fail("malformed tool call", "policy_fault")
        ep.reward(0.0)
    traj = recorder.store.get(ep.id)
    assert traj.status == "failed" and traj.reward == 0.0 and traj.end_reason == "policy_fault"
    assert traj.trainable and traj.transitions[-1].terminated


def test_a_finished_task_marks_its_last_step_terminated(recorder):
    with episode("done", recorder=recorder) as ep:
        ep.record(step("a"))
        ep.record(step("b"))
        ep.reward(1.0)
    traj = recorder.store.get(ep.id)
    assert traj.end_reason == "terminated" and traj.status == "complete"
    assert [(t.terminated, t.truncated) for t in traj] == [(False, False), (True, False)]


def test_the_graver_end_reason_wins(recorder):
    with episode("x", recorder=recorder) as ep:
        ep.record(step("a"))
        ep.truncate("step limit")
        ep.mark_end("outage", "PolicyUnavailable: down")
        ep.truncate("another limit")
    traj = recorder.store.get(ep.id)
    assert traj.end_reason == "outage" and traj.end_detail == "PolicyUnavailable: down"
    assert not traj.trainable


def test_a_registered_framework_limit_escaping_the_episode_ends_it_truncated(recorder):
    from forge_bridge.core.episode import register_truncation

    class LoopLimit(RuntimeError):
        pass

    register_truncation(LoopLimit, "the framework's loop limit")
    with pytest.raises(LoopLimit):
        with episode("loop", recorder=recorder) as ep:
            ep.record(step("a"))
            raise LoopLimit("25 steps")
    traj = recorder.store.get(ep.id)
    assert traj.end_reason == "truncated" and traj.end_detail == "the framework's loop limit: 25 steps"
    assert traj.trainable and traj.transitions[-1].truncated
