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
from forge_bridge.core.errors import InvalidArgument, WrongType
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


class AnthropicStub:
    """An Anthropic Messages API on localhost that answers as the taught model does: a `tool_use`
    of add(2, 3), then, once the tool's result is in, 'The answer is 5.' (what it was sent: `seen`)."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.seen: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.seen.append(body)
                answered = any(isinstance(m.get("content"), list) and any(
                    block.get("type") == "tool_result" for block in m["content"]) for m in body["messages"])
                content = [{"type": "text", "text": "The answer is 5."}] if answered else \
                    [{"type": "tool_use", "id": f"toolu_{len(stub.seen)}", "name": "add", "input": {"a": 2, "b": 3}}]
                data = json.dumps({"id": f"msg_{len(stub.seen)}", "type": "message", "role": "assistant",
                                   "model": body["model"], "content": content,
                                   "stop_reason": "end_turn" if answered else "tool_use", "stop_sequence": None,
                                   "usage": {"input_tokens": 10, "output_tokens": 5}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_crew_on_its_own_anthropic_model_is_recorded_as_the_local_path_would(policy, tmp_path):
    import crew_demos
    from crewai import LLM
    from forge_bridge.adapters.crewai import CrewAIUpstream, ForgeLLM

    recorder = Recorder(TrajectoryStore(tmp_path / "prod.db"))
    with fb.episode("calc", recorder=recorder) as local:  # the student itself, for the reference
        assert crew_demos.calculator_crew(ForgeLLM(policy, temperature=0, max_tokens=48)).kickoff().raw == \
            "The answer is 5."
    stub = AnthropicStub()
    own = LLM(model="anthropic/claude-test", base_url=stub.url, api_key="test-key", max_tokens=48)
    assert type(own).__module__.startswith("crewai.llms.providers.anthropic")  # CrewAI's native client, not OpenAI's
    upstream = CrewAIUpstream(own, policy.tokenizer)
    with fb.episode("calc", recorder=recorder, behaviour="upstream") as ep:
        assert crew_demos.calculator_crew(ForgeLLM(upstream)).kickoff().raw == "The answer is 5."
    stub.close()
    assert len(stub.seen) == 2 and stub.seen[0]["tools"][0]["name"] == "add"  # the crew's tools, in Anthropic's form
    (mine,) = [t for t in recorder.store.trajectories() if t.metadata.get("parent") == ep.id]
    (theirs,) = [t for t in recorder.store.trajectories() if t.metadata.get("parent") == local.id]
    assert mine.behaviour == "upstream" and theirs.behaviour == "policy" and mine.role == "calculator"
    assert len(mine) == len(theirs) == 2
    for a, b in zip(mine.transitions, theirs.transitions):
        assert a.prompt_token_ids == b.prompt_token_ids and a.completion_token_ids == b.completion_token_ids
        assert a.action.content == b.action.content
        assert [(c.name, c.arguments) for c in a.action.tool_calls] == [(c.name, c.arguments) for c in b.action.tool_calls]
    call = mine.transitions[0].action.tool_calls[0]
    assert call.id == "toolu_1" and mine.transitions[0].info["tool_results"][call.id]["content"] == "5"
    assert mine.transitions[0].info["upstream"] == "claude-test"
    with pytest.raises(WrongType, match="the crew's own CrewAI LLM"):
        CrewAIUpstream(ForgeLLM(policy), policy.tokenizer)
