"""Clients against the Gateway: the official `openai` client (sync, async, streaming), CrewAI's own
`LLM(model="hosted_vllm/...")` and plain curl; calls are recorded with exact token ids."""

import asyncio
import json
import subprocess

import httpx
import openai
import pytest

from forge_bridge.app import testing
from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import PolicyUnavailable
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.base import Policy
from forge_bridge.policies.local import LocalPolicy
from forge_bridge.serving.gateway import Gateway


@pytest.fixture(scope="module")
def policy(taught_model_dir):
    with LocalPolicy(str(taught_model_dir)) as p:
        yield p


@pytest.fixture
def recorder(tmp_path):
    return Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="gw")


@pytest.fixture
def gateway(policy, recorder):
    with Gateway(policy, recorder) as gw:
        yield gw


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0)


def test_openai_client_call_is_recorded_with_token_ids(gateway, recorder):
    resp = client(gateway.base_url).chat.completions.create(
        model="forge", messages=testing.ASK, tools=[testing.ADD_TOOL], temperature=0, max_tokens=48)
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert resp.choices[0].finish_reason == "tool_calls"
    extra = resp.model_extra
    (traj,) = recorder.store.trajectories(run_id="gw")
    assert traj.status == "complete" and traj.metadata["single_call"] is True
    (step,) = traj.transitions
    assert step.prompt_token_ids == extra["prompt_token_ids"]
    assert step.completion_token_ids == resp.choices[0].model_extra["token_ids"]
    assert step.action.tool_calls[0].id == call.id
    assert step.observation.messages == testing.ASK and step.info["source"] == "gateway"


def test_episode_named_by_url_collects_every_call_until_finished(gateway, recorder):
    url = gateway.episode_url("ep-1")
    c = client(url)
    first = c.chat.completions.create(model="forge", messages=testing.ASK, tools=[testing.ADD_TOOL],
                                      temperature=0, max_tokens=48)
    tc = first.choices[0].message.tool_calls[0]
    history = testing.ASK + [first.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": tc.id, "content": "5"}]
    second = c.chat.completions.create(model="forge", messages=history, tools=[testing.ADD_TOOL],
                                       temperature=0, max_tokens=48)
    assert second.choices[0].message.content == "The answer is 5."
    assert recorder.store.get("ep-1").status == "incomplete"
    done = httpx.post(url.removesuffix("/v1") + "/finish", json={"reward": 1.0}).json()
    assert done == {"id": "ep-1", "status": "complete", "reward": 1.0, "steps": 2}
    traj = recorder.store.get("ep-1")
    assert traj.reward == 1.0 and [len(t.completion_token_ids) > 0 for t in traj] == [True, True]
    # The tool result the agent sent back landed in the step that asked for it.
    assert traj.transitions[0].info["tool_results"][tc.id]["content"] == "5"
    late = httpx.post(url + "/chat/completions", json={"messages": testing.ASK, "max_tokens": 4})
    assert late.status_code == 409


def test_episode_named_by_header(gateway, recorder):
    c = openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0,
                      default_headers={"X-Forge-Episode": "hdr-1", "X-Forge-Task": "t9"})
    c.chat.completions.create(model="forge", messages=testing.AFTER_TOOL, temperature=0, max_tokens=16)
    traj = recorder.store.get("hdr-1")
    assert traj.task_id == "t9" and len(traj) == 1


def test_streaming_keeps_the_token_ids(gateway, recorder):
    stream = client(gateway.base_url).chat.completions.create(
        model="forge", messages=testing.ASK, tools=[testing.ADD_TOOL], temperature=0, max_tokens=48,
        stream=True)
    chunks = list(stream)
    assert chunks[0].model_extra["prompt_token_ids"]
    token_ids = [t for c in chunks for t in (c.choices[0].model_extra or {}).get("token_ids", [])]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["add"] and chunks[-1].choices[0].finish_reason == "tool_calls"
    (traj,) = recorder.store.trajectories()
    assert traj.transitions[0].completion_token_ids == token_ids
    assert traj.transitions[0].prompt_token_ids == chunks[0].model_extra["prompt_token_ids"]


def test_models_lists_the_policy(gateway):
    names = [m.id for m in client(gateway.base_url).models.list()]
    assert names[0] == "forge"


def test_token_is_required_when_configured(policy, recorder):
    with Gateway(policy, recorder, token="s3cret") as gw:
        with pytest.raises(openai.AuthenticationError):
            client(gw.base_url, "wrong").chat.completions.create(model="f", messages=testing.ASK)
        ok = client(gw.base_url, "s3cret").chat.completions.create(
            model="f", messages=testing.AFTER_TOOL, tools=[testing.ADD_TOOL], temperature=0,
            max_tokens=16)
        assert ok.choices[0].message.content == "The answer is 5."
    assert recorder.store.count() == 1  # the refused call recorded nothing


def test_binds_loopback_by_default(gateway):
    assert gateway.base_url.startswith("http://127.0.0.1:")


def test_bad_requests_are_clear_errors(gateway):
    r = httpx.post(gateway.base_url + "/chat/completions", content=b"{nope")
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]
    r = httpx.post(gateway.base_url + "/chat/completions", json={"messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    assert httpx.post(gateway.base_url + "/nowhere", json={}).status_code == 404


class DownPolicy(Policy):
    def generate(self, messages, tools, sampling, adapter):
        raise PolicyUnavailable("vLLM at http://127.0.0.1:1/v1 is unreachable")

    def load_version(self, path, version):
        pass

    def unload_version(self, version):
        pass


def test_policy_outage_is_a_502_and_the_episode_ends_failed(recorder):
    with Gateway(DownPolicy(), recorder) as gw:
        r = httpx.post(gw.episode_url("down-1") + "/chat/completions",
                       json={"messages": testing.ASK, "max_tokens": 8})
    assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
    traj = recorder.store.get("down-1")
    assert traj.status == "failed" and "unreachable" in traj.end_detail


# ----------------------------------------------------------------------------- other clients
def test_the_async_openai_client_plain_and_streaming(policy, recorder):
    async def run(url: str) -> tuple:
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        plain, streamed = await asyncio.gather(
            client.chat.completions.create(model="forge", messages=testing.ASK, tools=[testing.ADD_TOOL],
                                           temperature=0, max_tokens=48),
            client.chat.completions.create(model="forge", messages=testing.AFTER_TOOL, tools=[testing.ADD_TOOL],
                                           temperature=0, max_tokens=48, stream=True))
        chunks = [c async for c in streamed]
        return plain, chunks

    with Gateway(policy, recorder) as gw:
        plain, chunks = asyncio.run(run(gw.episode_url("async-1")))
        gw.finish("async-1", 1.0, None)
    assert plain.choices[0].message.tool_calls[0].function.name == "add"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The answer is 5."
    traj = recorder.store.get("async-1")
    assert len(traj) == 2 and all(s.has_tokens for s in traj) and traj.end_reason == "terminated"
    streamed_ids = [i for c in chunks if c.choices for i in (c.choices[0].model_extra or {}).get("token_ids") or []]
    assert streamed_ids in [s.completion_token_ids for s in traj]


def test_crewai_own_llm_class_through_the_gateway(policy, recorder):
    from crewai import LLM

    with Gateway(policy, recorder) as gw:
        llm = LLM(model="hosted_vllm/forge", base_url=gw.episode_url("crew-1"), api_key="unused",
                  temperature=0, max_tokens=48)
        answer = llm.call(testing.AFTER_TOOL)
    assert isinstance(answer, str) and answer
    (step,) = recorder.store.get("crew-1").transitions
    assert step.has_tokens and step.observation.messages[-1]["role"] == "tool"
    assert step.action.content == answer


def test_plain_curl(policy, recorder):
    with Gateway(policy, recorder, token="s3cret") as gw:
        body = json.dumps({"model": "forge", "messages": testing.ASK, "temperature": 0, "max_tokens": 16})
        out = subprocess.run(["curl", "-sS", "-H", "Authorization: Bearer s3cret", "-H",
                              "Content-Type: application/json", "-H", "X-Forge-Episode: curl-1",
                              "-d", body, gw.base_url + "/chat/completions"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    reply = json.loads(out)
    (step,) = recorder.store.get("curl-1").transitions
    assert reply["prompt_token_ids"] == step.prompt_token_ids
    assert reply["choices"][0]["token_ids"] == step.completion_token_ids
