import asyncio
import threading

import pytest

from forge_bridge.session import EpisodeClosed, Recorder, current_episode, episode
from forge_bridge.store import TrajectoryStore
from forge_bridge.types import Action, Observation, ToolCall, Transition


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
    assert traj.status == "failed" and "ZeroDivisionError" in traj.metadata["error"] and len(traj) == 1


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
    assert traj.status == "truncated" and traj.metadata["truncated"] == "more than 4 model calls"


def test_reward_given_after_an_adapter_ended_the_episode_is_kept(recorder):
    with episode("late", recorder=recorder) as ep:
        ep.record(step("a"))
        ep.fail("malformed tool call", policy_fault=True)
        ep.reward(0.0)
    traj = recorder.store.get(ep.id)
    assert traj.status == "failed" and traj.reward == 0.0 and traj.metadata["policy_fault"] is True
