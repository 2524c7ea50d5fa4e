"""The Responses API (`/v1/responses`) on the gateway, with the real clients: the `openai` SDK's
`responses.create` (plain, streamed, and its `responses.stream` helper), a second turn carrying
the tool's output (the whole conversation, or only the new item after `previous_response_id`),
and the `openai-agents` SDK's `Runner.run` on its default (Responses) model with a function tool.
Every reply and event is checked against the SDK's own models; each call is one recorded step
with the reply's exact tokens, marked `info['api'] == 'responses'`."""

import asyncio
import json

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from forge_bridge.core.episode import Recorder
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.models import tiny_tokenizer
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.serving.gateway import Gateway

ASK = "What is 2 plus 3?"
ADD = {"type": "function", "name": "add", "description": "Add two integers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]}}
TOKEN = "s3cret"


def adder(messages, tools):
    """The stand-in model: a call to `add` (when it has the tool), then, once a result is in, the answer."""
    if any(m["role"] == "tool" for m in messages):
        return "The answer is 5."
    return {"tool": "add", "args": {"a": 2, "b": 3}} if tools else "I cannot add."


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def recorder(tmp_path):
    return Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="responses")


@pytest.fixture
def gateway(tokenizer, recorder):
    with Gateway(ScriptedPolicy(adder, tokenizer), recorder, token=TOKEN) as gw:
        yield gw


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=TOKEN, max_retries=0)


def checked(resp) -> Response:
    """The SDK builds its objects without validating them: validate what the gateway sent."""
    return Response.model_validate(resp.to_dict())


def same_tokens(step, extra: dict) -> None:
    assert step.prompt_token_ids == extra["prompt_token_ids"] and step.completion_token_ids == extra["token_ids"]
    assert step.completion_logprobs == extra["logprobs"] and step.completion_token_ids
    assert step.info["api"] == "responses" and step.info["source"] == "gateway"


def test_a_tool_call_then_its_output_in_the_whole_conversation(gateway, recorder):
    c = client(gateway.episode_url("r-1"))
    first = checked(c.responses.create(model="forge", input=ASK, tools=[ADD], instructions="Use the tools.",
                                       temperature=0, max_output_tokens=48, store=False))
    (call,) = first.output
    assert call.type == "function_call" and call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    history = [{"role": "user", "content": ASK}, *[item.to_dict() for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    second = checked(c.responses.create(model="forge", input=history, tools=[ADD], instructions="Use the tools.",
                                        temperature=0, max_output_tokens=48, store=False))
    assert second.output_text == "The answer is 5." and second.status == "completed"
    assert second.usage.output_tokens == len(second.model_extra["token_ids"])
    steps = recorder.store.get("r-1").transitions
    assert len(steps) == 2
    same_tokens(steps[0], first.model_extra)
    same_tokens(steps[1], second.model_extra)
    assert steps[1].observation.messages == [
        {"role": "system", "content": "Use the tools."}, {"role": "user", "content": ASK},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": "add", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "5"}]
    assert steps[1].observation.tools[0]["function"]["name"] == "add"
    assert steps[0].info["tool_results"][call.call_id]["content"] == "5"  # the output landed in its call's step


def test_previous_response_id_carries_the_conversation_within_the_episode(gateway, recorder):
    c = client(gateway.episode_url("r-2"))
    first = c.responses.create(model="forge", input=ASK, tools=[ADD], instructions="Be brief.", temperature=0)
    call = first.output[0]
    second = c.responses.create(model="forge", previous_response_id=first.id, tools=[ADD], instructions="Be brief.",
                                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}])
    assert second.output_text == "The answer is 5." and second.previous_response_id == first.id
    steps = recorder.store.get("r-2").transitions
    assert [m["role"] for m in steps[1].observation.messages] == ["system", "user", "assistant", "tool"]
    # an id this episode never answered, and an output for a call never made, are 400s naming the field
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        c.responses.create(model="forge", previous_response_id="resp_nope", input="hi")
    with pytest.raises(openai.BadRequestError, match=r"input\[0\].call_id"):
        c.responses.create(model="forge", previous_response_id=second.id,
                           input=[{"type": "function_call_output", "call_id": "call_never", "output": "5"}])
    assert len(recorder.store.get("r-2")) == 2  # the refused calls recorded nothing
    assert httpx.post(gateway.address + "/episodes/r-2/finish", json={"reward": 1},
                      headers={"Authorization": f"Bearer {TOKEN}"}).json()["steps"] == 2


def test_streaming_sends_the_responses_events_and_records_the_same_tokens(gateway, recorder):
    stream = client(gateway.episode_url("r-3")).responses.create(model="forge", input=ASK, tools=[ADD],
                                                                 temperature=0, stream=True)
    adapter = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_python(e.to_dict()) for e in stream]
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert json.loads(events[4].arguments) == {"a": 2, "b": 3} and done.output[0].call_id == events[5].item.call_id
    (step,) = recorder.store.get("r-3").transitions
    same_tokens(step, done.model_extra)


def test_the_sdks_stream_helper_assembles_the_text(gateway, recorder):
    history = [{"role": "user", "content": ASK},
               {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 2, "b": 3}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "5"}]
    with client(gateway.base_url).responses.stream(model="forge", input=history, tools=[ADD]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "The answer is 5."
    (traj,) = recorder.store.trajectories()
    assert traj.metadata["single_call"] and traj.status == "complete"
    same_tokens(traj.transitions[0], final.model_extra)


def test_a_wrong_token_is_refused_and_records_nothing(gateway, recorder):
    bad = openai.OpenAI(base_url=gateway.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.responses.create(model="forge", input=ASK)
    assert recorder.store.count() == 0


def test_the_openai_agents_sdk_runs_its_default_model_through_the_gateway(gateway, recorder, monkeypatch):
    import agents.usage
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider
    from openai.types.responses.response_usage import InputTokensDetails

    class Details(InputTokensDetails):
        cache_write_tokens: int = 0

    # openai-agents 0.13.6 (the last release beside websockets 17) builds its empty usage as
    # InputTokensDetails(cached_tokens=0), which openai 2.54 refuses (cache_write_tokens became
    # required): any Runner.run fails before its first call. Give the field its default here.
    monkeypatch.setattr(agents.usage, "InputTokensDetails", Details)

    ran = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    api = openai.AsyncOpenAI(base_url=gateway.episode_url("agents-1"), api_key=TOKEN, max_retries=0)
    config = RunConfig(model_provider=OpenAIProvider(openai_client=api), tracing_disabled=True)
    agent = Agent(name="adder", instructions="Add with the tool.", tools=[add], model="forge")
    result = asyncio.run(Runner.run(agent, ASK, run_config=config))
    assert type(config.model_provider.get_model("forge")).__name__ == "OpenAIResponsesModel"  # the default: Responses
    assert result.final_output == "The answer is 5." and ran == [(2, 3)]
    steps = recorder.store.get("agents-1").transitions
    assert len(steps) == 2 and all(s.info["api"] == "responses" and s.completion_token_ids for s in steps)
    (call,) = steps[0].action.tool_calls
    assert steps[0].info["tool_results"][call.id]["content"] == "5"
    assert steps[1].observation.messages[0] == {"role": "system", "content": "Add with the tool."}
