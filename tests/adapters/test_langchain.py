"""The LangChain integration with the real langchain/langgraph packages, on both policy backends."""

import asyncio
import threading

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool

import forge_bridge as fb
from forge_bridge.adapters.langchain import ForgeChatModel, ForgeMiddleware
from forge_bridge.app import testing
from forge_bridge.core.errors import PolicyUnavailable
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.policies.vllm import VLLMPolicy
from forge_bridge.policies.vllm_server import free_port

QUESTION = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool("add")
def broken_add(a: int, b: int) -> int:
    """Add two integers."""
    raise RuntimeError("calculator is on fire")  # the taught model answers testing.TOOL_ERROR


def user_model():
    """Stands in for the model the user built the agent with; ForgeMiddleware replaces it."""
    return FakeListChatModel(responses=["the original model must never answer"])


@pytest.fixture
def recorder(tmp_path):
    return fb.Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="lc")


def agent_on(policy, tools=(add,)):
    return create_agent(user_model(), list(tools),
                        middleware=[ForgeMiddleware(policy, temperature=0, max_tokens=48)])


def test_two_step_tool_loop_is_recorded_with_the_exact_tokens(backend, recorder):
    agent = agent_on(backend)
    with fb.episode("t1", "g1", recorder=recorder) as ep:
        result = agent.invoke(QUESTION)
        ep.reward(1.0)
    messages = result["messages"]
    assert [type(m).__name__ for m in messages] == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert messages[-1].content == "The answer is 5." and messages[2].content == "5"
    traj = recorder.store.get(ep.id)
    assert traj.status == "complete" and traj.reward == 1.0 and len(traj) == 2
    first, second = traj.transitions
    # The recorded tokens are the ones the policy returned to the agent...
    for step, msg in ((first, messages[1]), (second, messages[3])):
        assert step.completion_token_ids == msg.response_metadata["token_ids"]
        assert step.prompt_token_ids == msg.response_metadata["prompt_token_ids"]
        assert step.completion_logprobs == msg.response_metadata["logprobs"]
    # ...and exactly what the policy produces for that observation.
    direct = backend.chat(first.observation.messages, first.observation.tools, temperature=0, max_tokens=48)
    assert direct.completion_token_ids == first.completion_token_ids
    assert direct.prompt_token_ids == first.prompt_token_ids
    # The tool result sits in the step that asked for it, under its call id.
    call_id = messages[1].tool_calls[0]["id"]
    assert first.action.tool_calls[0].id == call_id == messages[2].tool_call_id
    result0 = first.info["tool_results"][call_id]
    assert result0["content"] == "5" and result0["status"] == "success" and result0["args"] == {"a": 2, "b": 3}
    assert result0["latency_s"] >= 0 and "tool_results" not in second.info
    assert second.observation.messages[-1] == {"role": "tool", "tool_call_id": call_id, "content": "5",
                                               "name": "add"}


def test_eight_concurrent_agents_never_mix_steps(backend, recorder):
    agent = agent_on(backend)
    ids, errors = [], []

    def run(i):
        try:
            with fb.episode(f"task-{i}", recorder=recorder) as ep:
                agent.invoke(QUESTION)
                ids.append(ep.id)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(ids) == 8
    for tid in ids:
        traj = recorder.store.get(tid)
        assert len(traj) == 2 and traj.status == "complete"
        (call,) = traj.transitions[0].action.tool_calls
        assert list(traj.transitions[0].info["tool_results"]) == [call.id]
        assert traj.transitions[1].observation.messages[-1]["tool_call_id"] == call.id


def test_raising_tool_is_recorded_and_the_episode_goes_on(taught_model_dir, recorder):
    policy = fb.LocalPolicy(str(taught_model_dir))
    agent = agent_on(policy, tools=[broken_add])
    with fb.episode("boom", recorder=recorder) as ep:
        result = agent.invoke(QUESTION)
    tool_msg = result["messages"][2]
    assert tool_msg.status == "error" and tool_msg.content == testing.TOOL_ERROR
    assert result["messages"][-1].content == "Sorry, the tool failed."
    traj = recorder.store.get(ep.id)
    assert len(traj) == 2 and traj.status == "complete"  # the model saw the error and went on
    (res,) = traj.transitions[0].info["tool_results"].values()
    assert res["status"] == "error" and res["error"] == "RuntimeError: calculator is on fire"


def test_raising_tool_can_abort_when_configured(taught_model_dir, recorder):
    policy = fb.LocalPolicy(str(taught_model_dir))
    agent = create_agent(user_model(), [broken_add], middleware=[
        ForgeMiddleware(policy, temperature=0, max_tokens=48, handle_tool_errors=False)])
    with pytest.raises(RuntimeError, match="on fire"):
        with fb.episode("abort", recorder=recorder) as ep:
            agent.invoke(QUESTION)
    traj = recorder.store.get(ep.id)
    assert traj.status == "failed" and "on fire" in traj.end_detail and len(traj) == 1


def test_policy_outage_ends_the_episode_as_failed(recorder):
    down = VLLMPolicy(f"http://127.0.0.1:{free_port()}/v1", retries=0)
    with pytest.raises(PolicyUnavailable):
        with fb.episode("down", recorder=recorder) as ep:
            agent_on(down).invoke(QUESTION)
    traj = recorder.store.get(ep.id)
    assert traj.status == "failed" and "unreachable" in traj.end_detail


def test_malformed_tool_call_is_recorded_and_fails_the_episode(taught_model_dir, recorder):
    from forge_bridge.policies import models

    tokenizer = models.load(str(taught_model_dir))[1]
    bad = '<tool_call>{"name": "add", "arguments": {"a": 2,, "b": 3}}</tool_call>'
    policy = ScriptedPolicy(lambda messages, tools: bad, tokenizer)
    with fb.episode("bad", recorder=recorder) as ep:
        result = agent_on(policy).invoke(QUESTION)
    last = result["messages"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls and last.invalid_tool_calls
    traj = recorder.store.get(ep.id)
    assert traj.status == "failed" and "malformed tool call" in traj.end_detail
    (step,) = traj.transitions
    assert step.action.parse_errors and step.completion_token_ids[:-1] == tokenizer.encode(
        bad, add_special_tokens=False)


def test_adapter_published_between_invokes_serves_the_next_run(backend, recorder, adapter_dirs):
    agent = agent_on(backend)  # built once, never rebuilt
    with fb.episode("before", recorder=recorder) as ep1:
        agent.invoke(QUESTION)
    version = f"lc-{ep1.id[:8]}"
    backend.load_adapter(adapter_dirs["v1"], version)
    with fb.episode("after", recorder=recorder) as ep2:
        result = agent.invoke(QUESTION)
    assert recorder.store.get(ep1.id).versions == {None}
    assert recorder.store.get(ep2.id).versions == {version}
    assert "Version" in result["messages"][-1].content
    assert recorder.store.count(version=version) == 1


def test_streaming_messages_keep_the_token_ids(taught_model_dir, recorder):
    agent = agent_on(fb.LocalPolicy(str(taught_model_dir)))
    with fb.episode("stream", recorder=recorder) as ep:
        chunks = [msg for msg, _ in agent.stream(QUESTION, stream_mode="messages")]
    ai = [c for c in chunks if c.response_metadata.get("token_ids")]
    traj = recorder.store.get(ep.id)
    assert [c.response_metadata["token_ids"] for c in ai] == [t.completion_token_ids for t in traj]
    assert len(traj) == 2


def test_async_agent(taught_model_dir, recorder):
    agent = agent_on(fb.LocalPolicy(str(taught_model_dir)))

    async def run(i):
        with fb.episode(f"async-{i}", recorder=recorder) as ep:
            result = await agent.ainvoke(QUESTION)
            return ep.id, result

    async def main():
        return await asyncio.gather(*(run(i) for i in range(3)))

    for tid, result in asyncio.run(main()):
        assert result["messages"][-1].content == "The answer is 5."
        assert len(recorder.store.get(tid)) == 2


def test_chat_model_in_an_lcel_chain_records_when_an_episode_is_open(taught_model_dir, recorder):
    model = ForgeChatModel(fb.LocalPolicy(str(taught_model_dir)), temperature=0, max_tokens=48)
    chain = ChatPromptTemplate.from_messages([("user", "What is {x} plus {y}?")]) | model.bind_tools([add])
    msg = chain.invoke({"x": 2, "y": 3})  # no episode: routed, not recorded
    assert msg.tool_calls[0]["args"] == {"a": 2, "b": 3}
    assert recorder.store.count() == 0
    with fb.episode("chain", recorder=recorder) as ep:
        chain.invoke({"x": 2, "y": 3})
    assert len(recorder.store.get(ep.id)) == 1
    plain = model.invoke([HumanMessage("What is 2 plus 3?")])
    assert isinstance(plain, AIMessage) and plain.response_metadata["token_ids"]


def test_middleware_refuses_a_non_policy():
    with pytest.raises(TypeError, match="forge_bridge Policy"):
        ForgeMiddleware("gpt-4")


def test_wrap_replaces_a_chat_model_keeping_its_bound_tools(taught_model_dir, recorder):
    from langchain_openai import ChatOpenAI

    policy = fb.LocalPolicy(str(taught_model_dir))
    original = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1")
    wrapped = fb.wrap(original, policy)
    assert isinstance(wrapped, ForgeChatModel)
    bound = fb.wrap(original.bind_tools([add]), policy)
    with fb.episode("wrap", recorder=recorder) as ep:
        msg = bound.invoke([HumanMessage("What is 2 plus 3?")], temperature=0, max_tokens=48)
    assert msg.tool_calls[0]["name"] == "add"
    assert recorder.store.get(ep.id).transitions[0].observation.tools[0]["function"]["name"] == "add"


def test_wrap_says_what_it_accepts(taught_model_dir):
    policy = fb.LocalPolicy(str(taught_model_dir))
    with pytest.raises(TypeError, match="LangChain chat model .* CrewAI"):
        fb.wrap(object(), policy)
    with pytest.raises(TypeError, match="forge_bridge Policy"):
        fb.wrap(user_model(), "not a policy")


def test_unchanged_chatopenai_agent_is_recorded_through_the_gateway(taught_model_dir, recorder, monkeypatch):
    """Zero code change: the agent's own ChatOpenAI, pointed at the gateway by URL or env var."""
    from langchain_openai import ChatOpenAI

    policy = fb.LocalPolicy(str(taught_model_dir))
    with fb.Gateway(policy, recorder) as gw:
        agent = create_agent(ChatOpenAI(model="forge", api_key="unused", temperature=0, max_tokens=48,
                                        base_url=gw.episode_url("zero-1")), [add])
        result = agent.invoke(QUESTION)
        monkeypatch.setenv("OPENAI_BASE_URL", gw.episode_url("zero-2"))
        monkeypatch.setenv("OPENAI_API_KEY", "unused")
        env_agent = create_agent(ChatOpenAI(model="forge", temperature=0, max_tokens=48), [add])
        env_agent.invoke(QUESTION)
    assert result["messages"][-1].content == "The answer is 5."
    for eid in ("zero-1", "zero-2"):
        traj = recorder.store.get(eid)
        assert len(traj) == 2 and all(t.has_tokens for t in traj)
        assert traj.transitions[1].observation.messages[-1]["role"] == "tool"
        assert traj.transitions[1].observation.messages[-1]["content"] == "5"


def test_parallel_tool_calls_on_worker_threads_land_in_their_step(taught_model_dir, recorder):
    from forge_bridge.policies import models

    tokenizer = models.load(str(taught_model_dir))[1]

    def two_at_once(messages, tools):
        if messages[-1]["role"] == "tool":
            return "Both are done."
        return ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
                '<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call>')

    agent = create_agent(user_model(), [add], middleware=[
        ForgeMiddleware(ScriptedPolicy(two_at_once, tokenizer), max_tokens=128)])
    with fb.episode("parallel", recorder=recorder) as ep:
        result = agent.invoke(QUESTION)
    assert sorted(m.content for m in result["messages"] if m.type == "tool") == ["42", "5"]
    first = recorder.store.get(ep.id).transitions[0]
    ids = [c.id for c in first.action.tool_calls]
    assert len(ids) == 2 and sorted(first.info["tool_results"]) == sorted(ids)
    assert {r["content"] for r in first.info["tool_results"].values()} == {"5", "42"}
