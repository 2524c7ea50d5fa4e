"""Record-only mode (`--upstream`) in the Responses and Messages APIs: the agent speaks its own API
to the gateway, the gateway asks the upstream (an OpenAI chat server: here a second gateway on a
scripted model, recording on its own side) and answers in the agent's API with the upstream's
reply; the steps it records, in the student's tokens, equal token for token what the upstream's
own side recorded for the same calls, marked `behaviour='upstream'` and with the API they came by."""

import anthropic
import openai
import pytest

from forge_bridge.core.episode import Recorder
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.models import tiny_tokenizer
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.policies.upstream import UpstreamPolicy
from forge_bridge.serving.gateway import Gateway

ASK = "What is 2 plus 3?"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}


def adder(messages, tools):
    if any(m["role"] == "tool" for m in messages):
        return "The answer is 5."
    return {"tool": "add", "args": {"a": 2, "b": 3}}


@pytest.fixture
def gateways(tmp_path):
    """(the agent's gateway in record-only mode, its store, the upstream's own store)."""
    tokenizer = tiny_tokenizer()
    own, recorded = TrajectoryStore(tmp_path / "own.db"), TrajectoryStore(tmp_path / "recorded.db")
    with Gateway(ScriptedPolicy(adder, tokenizer), Recorder(own), token="upstream-key") as upstream:
        with Gateway(UpstreamPolicy(upstream.base_url, tokenizer, api_key="upstream-key"), Recorder(recorded),
                     token="s3cret") as gw:
            yield gw, recorded, own


def same_as_theirs(recorded: TrajectoryStore, own: TrajectoryStore, episode: str, api: str) -> None:
    mine = recorded.get(episode)
    assert mine.behaviour == "upstream" and len(mine) == 2
    theirs = sorted((t.transitions[0] for t in own.trajectories()), key=lambda s: len(s.prompt_token_ids))
    for a, b in zip(mine.transitions, theirs):
        assert a.info["api"] == api and b.info["api"] == "chat"  # the agent's API here, chat to the upstream
        assert a.prompt_token_ids == b.prompt_token_ids and a.completion_token_ids == b.completion_token_ids
        assert a.observation.messages == b.observation.messages


def test_responses_through_an_upstream(gateways):
    gw, recorded, own = gateways
    c = openai.OpenAI(base_url=gw.episode_url("up-r"), api_key="s3cret", max_retries=0)
    tools = [{"type": "function", "name": "add", "parameters": SCHEMA}]
    first = c.responses.create(model="forge", input=ASK, tools=tools)
    call = first.output[0]
    second = c.responses.create(model="forge", previous_response_id=first.id, tools=tools, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"}])
    assert call.name == "add" and second.output_text == "The answer is 5."
    assert "token_ids" not in (second.model_extra or {})  # the upstream's reply as it gave it
    same_as_theirs(recorded, own, "up-r", "responses")


def test_messages_through_an_upstream(gateways):
    gw, recorded, own = gateways
    c = anthropic.Anthropic(base_url=gw.episode_url("up-m").removesuffix("/v1"), api_key="s3cret", max_retries=0)
    tools = [{"name": "add", "input_schema": SCHEMA}]
    ask = [{"role": "user", "content": ASK}]
    first = c.messages.create(model="forge", max_tokens=64, messages=ask, tools=tools)
    (use,) = first.content
    with c.messages.stream(model="forge", max_tokens=64, tools=tools, messages=[
            *ask, {"role": "assistant", "content": [use.to_dict()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]}]) as s:
        assert s.get_final_text() == "The answer is 5."
    assert use.input == {"a": 2, "b": 3} and first.stop_reason == "tool_use"
    same_as_theirs(recorded, own, "up-m", "messages")
