"""The CrewAI integration with the real crewai package, on LocalPolicy and a real vLLM server."""

import socket
import uuid

import pytest

import forge_bridge as fb
from forge_bridge.adapters.crewai import ForgeLLM
from forge_bridge.core.errors import PolicyUnavailable
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.policies.vllm import VLLMPolicy
from forge_bridge.policies.vllm_server import free_port

import crew_demos

GREEDY = {"temperature": 0, "max_tokens": 64}


@pytest.fixture
def recorder(tmp_path):
    return fb.Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="crew")


@pytest.fixture(scope="module")
def tokenizer(taught_model_dir):
    return models.load(str(taught_model_dir))[1]


def role_trajectories(recorder, episode):
    return {c.trajectory.role: recorder.store.get(c.id) for c in episode.children.values()}


def test_single_agent_tool_loop_is_recorded_with_token_ids(backend, recorder):
    crew = crew_demos.calculator_crew(ForgeLLM(backend, **GREEDY))
    with fb.episode("calc", recorder=recorder) as ep:
        result = crew.kickoff()
        ep.reward(1.0)
    assert result.raw == "The answer is 5."
    trajs = role_trajectories(recorder, ep)
    traj = trajs["calculator"]
    assert traj.status == "complete" and traj.reward == 1.0 and len(traj) == 2
    assert traj.metadata == {"parent": ep.id} and traj.role == "calculator"
    call_step, answer_step = traj.transitions
    (call,) = call_step.action.tool_calls
    assert call.name == "add" and call_step.info["tool_results"][call.id]["content"] == "5"
    assert answer_step.action.content == "The answer is 5."
    for step in traj:
        assert step.has_tokens and step.info["role"] == "calculator" and step.info["task_attempt"] == 1
        assert not step.info["forced_final_answer"]
        direct = backend.chat(step.observation.messages, step.observation.tools, **GREEDY)
        assert direct.completion_token_ids == step.completion_token_ids
        assert direct.prompt_token_ids == step.prompt_token_ids
    parent = recorder.store.get(ep.id)
    assert parent.status == "complete" and len(parent) == 0  # the crew's steps live in its roles


def test_two_role_crew_routes_each_role_to_its_own_adapter(backend, recorder, adapter_dirs):
    tag = uuid.uuid4().hex[:6]
    researcher_v, writer_v = f"researcher-{tag}", f"writer-{tag}"
    backend.load_adapter(adapter_dirs["v1"], researcher_v, slot="researcher")
    backend.load_adapter(adapter_dirs["v2"], writer_v, slot="writer")
    assert backend.current() is None  # the default slot still serves the base model
    llm = ForgeLLM(backend, role_slot={"researcher": "researcher", "writer": "writer"}, **GREEDY)
    with fb.episode("research", recorder=recorder) as ep:
        crew_demos.research_crew(llm).kickoff()
        ep.reward(1.0)
        ep.reward(0.5, role="writer")
    trajs = role_trajectories(recorder, ep)
    assert set(trajs) == {"researcher", "writer"}
    assert trajs["researcher"].versions == {researcher_v} and trajs["writer"].versions == {writer_v}
    assert trajs["researcher"].reward == 1.0 and trajs["writer"].reward == 0.5
    # The served version proves it: each step's tokens are what that role's adapter produces.
    for role, traj in trajs.items():
        for step in traj:
            assert step.info["role"] == role
            direct = backend.chat(step.observation.messages, step.observation.tools, slot=role, **GREEDY)
            assert direct.version == step.version
            assert direct.completion_token_ids == step.completion_token_ids
    assert recorder.store.count(version=writer_v) == 1


def test_shared_adapter_without_role_mapping(taught_model_dir, recorder):
    policy = fb.LocalPolicy(str(taught_model_dir))
    with fb.episode("shared", recorder=recorder) as ep:
        result = crew_demos.research_crew(ForgeLLM(policy, **GREEDY)).kickoff()
    assert result.raw == "Paris is home to 2102650 people."
    trajs = role_trajectories(recorder, ep)
    assert [len(trajs["researcher"]), len(trajs["writer"])] == [2, 1]
    assert all(t.versions == {None} for t in trajs.values())
    lookup_step = trajs["researcher"].transitions[0]
    assert list(lookup_step.info["tool_results"].values())[0]["content"] == "2102650"


def test_raising_tool_is_recorded_and_the_crew_ends_cleanly(taught_model_dir, recorder):
    policy = fb.LocalPolicy(str(taught_model_dir))
    crew = crew_demos.calculator_crew(ForgeLLM(policy, **GREEDY), tools=[crew_demos.broken_add])
    with fb.episode("boom", recorder=recorder) as ep:
        result = crew.kickoff()
    assert result.raw == "Sorry, the tool failed."
    traj = role_trajectories(recorder, ep)["calculator"]
    assert traj.status == "complete" and len(traj) == 2
    (res,) = traj.transitions[0].info["tool_results"].values()
    assert "calculator is on fire" in res["content"]


def test_policy_outage_fails_the_episode_with_the_reason(recorder):
    down = VLLMPolicy(f"http://127.0.0.1:{free_port()}/v1", retries=0)
    crew = crew_demos.calculator_crew(ForgeLLM(down, **GREEDY))
    with pytest.raises(PolicyUnavailable):
        with fb.episode("down", recorder=recorder) as ep:
            crew.kickoff()
    parent = recorder.store.get(ep.id)
    assert parent.status == "failed" and "unreachable" in parent.end_detail
    child = role_trajectories(recorder, ep)["calculator"]
    assert child.status == "failed" and child.end_reason == parent.end_reason == "outage"
    assert "unreachable" in child.end_detail


def test_max_iter_exhaustion_marks_the_forced_final_answer(tokenizer, recorder):
    def stubborn(messages, tools):  # never answers while it may call tools
        return crew_demos.CALL.format(name="add", args='{"a": 2, "b": 3}') if tools else "Five."

    crew = crew_demos.calculator_crew(ForgeLLM(ScriptedPolicy(stubborn, tokenizer)), max_iter=2)
    with fb.episode("loop", recorder=recorder) as ep:
        result = crew.kickoff()
    assert result.raw == "Five."
    traj = role_trajectories(recorder, ep)["calculator"]
    flags = [t.info["forced_final_answer"] for t in traj]
    assert flags[-1] is True and not any(flags[:-1]) and len(flags) >= 2
    assert traj.transitions[-1].info["role"] == "calculator"  # CrewAI's forced call names no agent
    assert (traj.end_reason, traj.end_detail) == ("truncated", "CrewAI's max_iter")  # a limit cut it
    assert traj.transitions[-1].truncated and traj.trainable


def test_task_retry_after_an_error_is_marked_as_a_new_attempt(tokenizer, recorder):
    calls = {"n": 0}

    def flaky(messages, tools):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("transient failure")
        return crew_demos.expert(messages, tools)

    crew = crew_demos.calculator_crew(ForgeLLM(ScriptedPolicy(flaky, tokenizer)))
    with fb.episode("retry", recorder=recorder) as ep:
        result = crew.kickoff()
    assert result.raw == "The answer is 5."
    traj = role_trajectories(recorder, ep)["calculator"]
    assert [t.info["task_attempt"] for t in traj] == [1, 2, 2]


def test_no_network_connection_is_attempted(taught_model_dir, recorder, monkeypatch):
    attempts = []
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def loopback(host) -> bool:
        return str(host).startswith("127.") or host in ("localhost", "::1")

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not loopback(address[0]):
            attempts.append(address)
            raise OSError("network disabled in this test")
        return real_connect(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if not loopback(host):
            attempts.append(host)
            raise socket.gaierror("network disabled in this test")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    policy = fb.LocalPolicy(str(taught_model_dir))
    with fb.episode("offline", recorder=recorder):
        crew_demos.research_crew(ForgeLLM(policy, **GREEDY)).kickoff()
    assert attempts == []


def test_wrap_puts_forge_llm_on_agents_and_crews(taught_model_dir):
    from crewai import LLM

    policy = fb.LocalPolicy(str(taught_model_dir))
    crew = crew_demos.research_crew(LLM(model="gpt-4o-mini", api_key="unused"))
    wrapped = fb.wrap(crew, policy)
    assert wrapped is crew and all(isinstance(a.llm, ForgeLLM) for a in crew.agents)
    llm = fb.wrap(LLM(model="gpt-4o-mini", api_key="unused", temperature=0.3), policy)
    assert isinstance(llm, ForgeLLM) and llm.temperature == 0.3 and llm.supports_function_calling()


def test_forge_llm_refuses_a_non_policy():
    with pytest.raises(TypeError, match="forge_bridge Policy"):
        ForgeLLM("gpt-4")
