"""Anthropic's Messages API (`/v1/messages`) on the gateway, with the real client: the `anthropic`
SDK's `messages.create` and `messages.stream`, a tool, and a `tool_result` turn; its `x-api-key`
is the gateway's token. Every reply and event is checked against the SDK's own models; each call
is one recorded step with the reply's exact tokens, marked `info['api'] == 'messages'`."""

import anthropic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from forge_bridge.core.episode import Recorder
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.models import tiny_tokenizer
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.serving.gateway import Gateway

ASK = [{"role": "user", "content": "What is 2 plus 3?"}]
ADD = {"name": "add", "description": "Add two integers.",
       "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"]}}
TOKEN = "s3cret"


def adder(messages, tools):
    if any(m["role"] == "tool" for m in messages):
        return "The answer is 5."
    return {"tool": "add", "args": {"a": 2, "b": 3}}


@pytest.fixture
def recorder(tmp_path):
    return Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="messages")


@pytest.fixture
def gateway(recorder):
    with Gateway(ScriptedPolicy(adder, tiny_tokenizer()), recorder, token=TOKEN) as gw:
        yield gw


def client(gateway: Gateway, episode: str, key: str = TOKEN) -> anthropic.Anthropic:
    """Anthropic's client on an episode's URL: its base URL is the part before `/v1`."""
    return anthropic.Anthropic(base_url=gateway.episode_url(episode).removesuffix("/v1"), api_key=key, max_retries=0)


def same_tokens(step, message) -> None:
    extra = message.model_extra
    assert step.prompt_token_ids == extra["prompt_token_ids"] and step.completion_token_ids == extra["token_ids"]
    assert step.completion_logprobs == extra["logprobs"] and step.completion_token_ids
    assert step.info["api"] == "messages" and step.info["source"] == "gateway"
    assert message.usage.output_tokens == len(step.completion_token_ids)


def test_create_with_a_tool_then_its_result(gateway, recorder):
    c = client(gateway, "m-1")
    first = Message.model_validate(c.messages.create(model="forge", max_tokens=64, system="Use the tools.",
                                                     messages=ASK, tools=[ADD], temperature=0).to_dict())
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "add" and use.input == {"a": 2, "b": 3}
    assert first.stop_reason == "tool_use"
    turn = ASK + [{"role": "assistant", "content": [b.to_dict() for b in first.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]}]
    second = Message.model_validate(c.messages.create(model="forge", max_tokens=64, system="Use the tools.",
                                                      messages=turn, tools=[ADD]).to_dict())
    assert [b.text for b in second.content] == ["The answer is 5."] and second.stop_reason == "end_turn"
    steps = recorder.store.get("m-1").transitions
    assert len(steps) == 2
    same_tokens(steps[0], first)
    same_tokens(steps[1], second)
    assert steps[1].observation.messages == [
        {"role": "system", "content": "Use the tools."}, ASK[0],
        {"role": "assistant", "content": "", "tool_calls": [{"id": use.id, "type": "function", "function": {
            "name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "5"}]
    assert steps[0].info["tool_results"][use.id]["content"] == "5"


def test_stream_sends_the_messages_events_and_the_helper_assembles_them(gateway, recorder):
    c = client(gateway, "m-2")
    adapter = TypeAdapter(RawMessageStreamEvent)
    events = [adapter.validate_python(e.to_dict()) for e in c.messages.create(
        model="forge", max_tokens=64, messages=ASK, tools=[ADD], stream=True)]
    assert [e.type for e in events] == ["message_start", "content_block_start", "content_block_delta",
                                        "content_block_stop", "message_delta", "message_stop"]
    assert events[2].delta.type == "input_json_delta" and events[4].delta.stop_reason == "tool_use"
    use = events[1].content_block
    turn = ASK + [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": "add",
                                                     "input": {"a": 2, "b": 3}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": [{"type": "text", "text": "5"}]}]}]
    with c.messages.stream(model="forge", max_tokens=64, messages=turn, tools=[ADD]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "The answer is 5." and final.stop_reason == "end_turn"
    first, second = recorder.store.get("m-2").transitions
    assert first.action.tool_calls[0].id == use.id and events[0].message.model_extra["token_ids"] == \
        first.completion_token_ids
    same_tokens(second, final)


def test_the_stream_helper_assembles_a_tool_use_from_its_json_deltas(gateway):
    with client(gateway, "m-3").messages.stream(model="forge", max_tokens=64, messages=ASK, tools=[ADD]) as stream:
        final = stream.get_final_message()
    assert final.content[0].input == {"a": 2, "b": 3} and final.stop_reason == "tool_use"


def test_errors_are_anthropic_shaped_and_the_key_is_the_token(gateway, recorder):
    with pytest.raises(anthropic.AuthenticationError):
        client(gateway, "m-4", key="wrong").messages.create(model="forge", max_tokens=8, messages=ASK)
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\].content\[0\].type: images") as refused:
        client(gateway, "m-4").messages.create(model="forge", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    assert recorder.store.count() == 0


def test_count_tokens_counts_in_the_policys_tokenizer_and_records_nothing(gateway, recorder):
    # Claude Code asks it to size its context; it is no model call
    c = client(gateway, "m-count")
    short = c.messages.count_tokens(model="forge", messages=ASK)
    longer = c.messages.count_tokens(model="forge", messages=ASK, system="Use the tools.", tools=[ADD])
    beta = c.beta.messages.count_tokens(model="forge", messages=ASK, system="Use the tools.", tools=[ADD])
    tokenizer = tiny_tokenizer()
    assert short.input_tokens == len(tokenizer.encode(ASK[0]["content"], add_special_tokens=False))
    assert longer.input_tokens > short.input_tokens and beta.input_tokens == longer.input_tokens
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\]\.type: images"):
        c.messages.count_tokens(model="forge", messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    with pytest.raises(anthropic.BadRequestError, match="unknown field max_tokens"):
        c.post("/v1/messages/count_tokens", cast_to=object, body={"model": "forge", "messages": ASK, "max_tokens": 5})
    with pytest.raises(anthropic.AuthenticationError):
        client(gateway, "m-count", key="wrong").messages.count_tokens(model="forge", messages=ASK)
    assert recorder.store.trajectories(run_id="messages") == []


def test_what_claude_code_sends_is_served_system_turns_and_deferred_tools_included(gateway, recorder):
    c = client(gateway, "m-cc")
    deferred = {**ADD, "name": "later", "defer_loading": True}
    body = {"model": "forge", "max_tokens": 64, "messages": [*ASK, {"role": "system", "content": [
        {"type": "text", "text": "The working directory is /work.", "cache_control": {"type": "ephemeral"}}]}],
        "tools": [{**ADD, "eager_input_streaming": True}, deferred], "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"}, "context_management": {"edits": []}}
    reply = c.post("/v1/messages", cast_to=object, body=body)
    assert reply["content"][0]["name"] == "add"
    (step,) = recorder.store.get("m-cc").transitions
    assert [m["role"] for m in step.observation.messages] == ["user", "system"]
    assert [t["function"]["name"] for t in step.observation.tools] == ["add"]  # the deferred tool is not offered
    for field, value, refusal in (("output_config", "high", "output_config: expected an object"),
                                  ("tools", [{**ADD, "defer_loading": "yes"}], r"tools\[0\]\.defer_loading")):
        with pytest.raises(anthropic.BadRequestError, match=refusal):
            c.post("/v1/messages", cast_to=object, body={**body, field: value})
    assert len(recorder.store.get("m-cc").transitions) == 1
