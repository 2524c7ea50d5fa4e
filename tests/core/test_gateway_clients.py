"""Clients an agent process really uses, against the gateway: the OpenAI SDK's async client
(plain and streaming), CrewAI's own LLM class (`hosted_vllm/...`, no forge-bridge in the crew) and
plain curl. Each call is recorded into its episode with the policy's token ids."""

import asyncio
import json
import subprocess

import openai
import pytest

from forge_bridge.app import testing
from forge_bridge.core.episode import Recorder
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.local import LocalPolicy
from forge_bridge.serving.gateway import Gateway


@pytest.fixture(scope="module")
def policy(taught_model_dir):
    with LocalPolicy(str(taught_model_dir)) as p:
        yield p


@pytest.fixture
def recorder(tmp_path):
    return Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="clients")


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
