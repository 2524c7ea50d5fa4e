"""ForgeMiddleware(passthrough=True): the agent keeps its own model (here LangChain's ChatOpenAI
on a gateway serving the taught tiny model, standing in for a hosted model); each of its replies
is recorded as the student would have written it, and the steps equal, token for token, what the
local-policy path records for the same agent run; the tools' results land in their steps."""

import pytest
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import forge_bridge as fb
from forge_bridge.adapters.langchain import ForgeMiddleware
from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.local import LocalPolicy
from forge_bridge.serving.gateway import Gateway

QUESTION = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(scope="module")
def policy(taught_model_dir):
    p = LocalPolicy(str(taught_model_dir))
    yield p
    p.close()


def test_passthrough_records_the_agents_own_model_as_the_local_path_would(policy, tmp_path):
    own_store = TrajectoryStore(tmp_path / "own.db")
    with Gateway(policy, Recorder(own_store)) as own:  # the agent's own model, behind an OpenAI API
        model = ChatOpenAI(base_url=own.base_url, api_key="unused", model="forge", temperature=0, max_tokens=48,
                           max_retries=0)
        agent = create_agent(model, [add], middleware=[ForgeMiddleware(policy, passthrough=True)])
        recorder = Recorder(TrajectoryStore(tmp_path / "prod.db"))
        with fb.episode("add-2-3", recorder=recorder, behaviour="upstream") as ep:
            result = agent.invoke(QUESTION)
            ep.reward(1.0)
    assert result["messages"][-1].content == "The answer is 5."  # the agent's own model answered
    recorded = recorder.store.get(ep.id)
    assert recorded.behaviour == "upstream" and recorded.status == "complete" and len(recorded) == 2
    theirs = sorted((t.transitions[0] for t in own_store.trajectories()), key=lambda s: len(s.prompt_token_ids))
    assert len(theirs) == 2
    for mine, local in zip(recorded.transitions, theirs):
        assert mine.prompt_token_ids == local.prompt_token_ids
        assert mine.completion_token_ids == local.completion_token_ids
        assert mine.action.content == local.action.content
        assert [(c.name, c.arguments) for c in mine.action.tool_calls] == \
               [(c.name, c.arguments) for c in local.action.tool_calls]
        assert mine.observation.tools == local.observation.tools
    call = recorded.transitions[0].action.tool_calls[0]
    assert recorded.transitions[0].info["tool_results"][call.id]["content"] == "5"  # the tool ran and was recorded
    assert recorded.transitions[0].info["upstream"] == "forge"
    own_store.close()


def test_passthrough_refuses_an_episode_of_the_students_own_samples(policy, tmp_path):
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage

    class OwnModel(FakeMessagesListChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    agent = create_agent(OwnModel(responses=[AIMessage(content="Five.")] * 2), [add],
                         middleware=[ForgeMiddleware(policy, passthrough=True)])
    with fb.episode("t", recorder=Recorder(TrajectoryStore(tmp_path / "t.db"))):
        with pytest.raises(InvalidArgument, match="behaviour='upstream'"):
            agent.invoke(QUESTION)
    assert agent.invoke(QUESTION)["messages"][-1].content == "Five."  # outside an episode: only answered
    with pytest.raises(InvalidArgument, match="tokenizer"):
        ForgeMiddleware(fb.VLLMPolicy("http://127.0.0.1:9/v1"), passthrough=True)


def test_a_crew_on_its_own_openai_compatible_model_is_recorded_per_role(policy, tmp_path):
    import crew_demos
    from forge_bridge.adapters.crewai import ForgeLLM
    from forge_bridge.policies.upstream import UpstreamPolicy

    own_store = TrajectoryStore(tmp_path / "own.db")
    with Gateway(policy, Recorder(own_store)) as own:  # the crew's own model, behind an OpenAI API
        upstream = UpstreamPolicy(own.base_url, policy.tokenizer)
        crew = crew_demos.calculator_crew(ForgeLLM(upstream, temperature=0, max_tokens=48))
        recorder = Recorder(TrajectoryStore(tmp_path / "prod.db"))
        with fb.episode("calc", recorder=recorder, behaviour="upstream") as ep:
            assert crew.kickoff().raw == "The answer is 5."
        with fb.episode("calc", recorder=recorder) as wrong:  # the student's own samples: refused
            with pytest.raises(InvalidArgument, match="behaviour='upstream'"):
                ForgeLLM(upstream).call([{"role": "user", "content": "What is 2 plus 3?"}])
        wrong.fail("refused")
    (role,) = [t for t in recorder.store.trajectories() if t.metadata.get("parent") == ep.id]
    assert role.behaviour == "upstream" and role.role == "calculator" and len(role) == 2
    theirs = sorted((t.transitions[0] for t in own_store.trajectories()), key=lambda s: len(s.prompt_token_ids))
    for mine, local in zip(role.transitions, theirs):
        assert mine.prompt_token_ids == local.prompt_token_ids
        assert mine.completion_token_ids == local.completion_token_ids
    call = role.transitions[0].action.tool_calls[0]
    assert role.transitions[0].info["tool_results"][call.id]["content"] == "5"
    upstream.close()
    own_store.close()
