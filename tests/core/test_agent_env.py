"""A wrapped LangChain agent used as an Environment: HarnessAgent drives it step by step, each
of the agent's model calls one recorded step, the agent's own tools and prompts unchanged."""

import json

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import tool

import forge_bridge as fb
from forge_bridge.adapters.langchain import ForgeMiddleware
from forge_bridge.envs.agent import AgentEnvironment
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy

ran: list[tuple[int, int]] = []


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    ran.append((a, b))
    return a + b


def build(policy):
    return create_agent(FakeListChatModel(responses=["unused"]), [add], middleware=[ForgeMiddleware(policy)])


def run(agent, task):
    return agent.invoke({"messages": [{"role": "user", "content": task["question"]}]})["messages"][-1].content


def check(task, answer):
    return str(task["answer"]) in answer


def expert(messages, tools):
    if not any(m["role"] == "tool" for m in messages):
        return '<tool_call>\n' + json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}}) + '\n</tool_call>'
    return f"The answer is {messages[-1]['content']}."


@pytest.fixture
def policy():
    return ScriptedPolicy(expert, models.tiny_tokenizer())


def test_a_langchain_agent_as_an_environment_is_driven_one_model_call_per_step(policy, tmp_path):
    ran.clear()
    env = AgentEnvironment(build, run, check)
    traj = HarnessAgent(policy, env).run({"id": "add", "question": "What is 2 plus 3?", "answer": 5},
                                         recorder=fb.Recorder(tmp_path / "t.db"))
    assert traj.status == "complete" and traj.reward == 1.0
    assert ran == [(2, 3)]  # LangChain ran its own tool
    first, second = traj.transitions
    assert first.prompt_token_ids and first.completion_token_ids
    assert [t["function"]["name"] for t in first.observation.tools] == ["add"]  # LangChain's schema
    # the second prompt is exactly what LangChain built: its tool message carries the result
    assert [m["role"] for m in second.observation.messages] == ["user", "assistant", "tool"]
    assert second.observation.messages[-1]["content"] == "5"
    assert second.action.content == "The answer is 5."
    env.close()


def test_the_same_environment_runs_episode_after_episode(policy, tmp_path):
    env = AgentEnvironment(build, run, check)
    harness = HarnessAgent(policy, env)
    recorder = fb.Recorder(tmp_path / "t.db")
    rewards = [harness.run({"id": f"t{i}", "question": "What is 2 plus 3?", "answer": answer},
                           recorder=recorder).reward for i, answer in enumerate([5, 6, 5])]
    assert rewards == [1.0, 0.0, 1.0]
    env.close()


def test_an_episode_cut_short_releases_the_waiting_agent(policy, tmp_path):
    loop = ScriptedPolicy(lambda m, t: '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>',
                          models.tiny_tokenizer())
    env = AgentEnvironment(build, run, check, timeout_s=10)
    traj = HarnessAgent(loop, env, max_model_calls=2).run({"id": "t", "question": "q", "answer": 2},
                                                    recorder=fb.Recorder(tmp_path / "t.db"))
    assert traj.status == "truncated" and len(traj.transitions) == 2
    waiting = env._thread
    traj = HarnessAgent(policy, env).run({"id": "t", "question": "What is 2 plus 3?", "answer": 5},
                                         recorder=fb.Recorder(tmp_path / "t.db"))
    assert traj.reward == 1.0 and not waiting.is_alive()  # the cut agent was unblocked, not leaked
    env.close()


def test_an_agent_that_raises_fails_the_episode_with_the_reason(policy, tmp_path):
    def broken(agent, task):
        raise KeyError("question")

    with pytest.raises(RuntimeError, match="the agent raised KeyError: 'question'"):
        AgentEnvironment(build, broken, check).reset({"id": "t"})
    with pytest.raises(RuntimeError, match="finished without calling the model"):
        AgentEnvironment(build, lambda agent, task: "no model needed", check).reset({"id": "t"})

    def fails_after_a_call(agent, task):
        agent.invoke({"messages": [{"role": "user", "content": "What is 2 plus 3?"}]})
        raise KeyError("boom")

    env = AgentEnvironment(build, fails_after_a_call, check)
    with pytest.raises(RuntimeError, match="the agent raised KeyError"):
        HarnessAgent(policy, env).run({"id": "t"}, recorder=fb.Recorder(tmp_path / "t.db"))
    with fb.TrajectoryStore(tmp_path / "t.db") as store:
        (traj,) = store.trajectories()
    assert traj.status == "failed" and "KeyError" in traj.end_detail and len(traj.transitions) == 2
