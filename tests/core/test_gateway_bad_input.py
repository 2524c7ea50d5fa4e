"""Bad input on the Responses and Messages routes: each malformed body (wrong types, unknown item
and block kinds, tool results for calls never made, images, bodies past the limit or nested past
the parser) gets a 4xx naming what is wrong; a streaming client that hangs up mid-stream is a clean
close. After each, the gateway keeps serving, and the store holds no step of the refused call."""

import json
import socket

import httpx
import pytest

from forge_bridge.core.episode import Recorder
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.models import tiny_tokenizer
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.serving.gateway import Gateway

AUTH = {"Authorization": "Bearer s3cret"}
FN = {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {}}}
TOOL = {"name": "add", "input_schema": {"type": "object", "properties": {}}}
HI = [{"role": "user", "content": "hi"}]
GOOD = {"responses": {"model": "forge", "input": "hi"},
        "messages": {"model": "forge", "max_tokens": 16, "messages": HI}}
USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]}


def result(tool_use_id: str) -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": "5"}]}


BAD = [  # (api, body, the words the 4xx names)
    ("responses", [1, 2], "JSON object"),
    ("responses", {"model": "forge"}, "input: required"),
    ("responses", {"input": 5}, "input: expected a string or a list"),
    ("responses", {"input": ["hi"]}, "input[0]: expected an item object"),
    ("responses", {"input": [{"type": "telepathy"}]}, "input[0].type: unknown item type"),
    ("responses", {"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ("responses", {"input": [{"role": "user", "content": 7}]}, "input[0].content"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,x"}]}]},
     "input[0].content[0].type: images are not served"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": None}]}]},
     "input[0].content[0].text"),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "never", "output": "5"}]},
     "input[0].call_id: no function_call"),
    ("responses", {"input": [{"type": "function_call", "call_id": "c", "name": "add", "arguments": {"a": 1}}]},
     "input[0].arguments"),
    ("responses", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type: only function tools"),
    ("responses", {"input": "hi", "tools": [{**FN, "parameters": "x"}]}, "tools[0].parameters"),
    ("responses", {"input": "hi", "tools": {"add": FN}}, "tools: expected a list"),
    ("responses", {"input": "hi", "temperature": "hot"}, "temperature"),
    ("responses", {"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ("responses", {"input": "hi", "stream": "yes"}, "stream"),
    ("responses", {"input": "hi", "instructions": ["x"]}, "instructions"),
    ("responses", {"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format.type"),
    ("responses", {"input": "hi", "background": True}, "background"),
    ("responses", {"input": "hi", "temperatur": 0}, "unknown field temperatur"),
    ("responses", {"input": "hi", "previous_response_id": "resp_x"}, "previous_response_id"),
    ("responses", {"input": []}, "input: expected at least one item"),
    ("messages", "hi", "JSON object"),
    ("messages", {"max_tokens": 8, "messages": HI}, "model: required"),
    ("messages", {"model": "forge", "messages": HI}, "max_tokens: required"),
    ("messages", {"model": "forge", "max_tokens": "8", "messages": HI}, "max_tokens: expected an integer"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": []}, "messages: expected a non-empty list"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]},
     "messages[0].role"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]},
     "messages[0].content[0].type: unknown content block type"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}, "messages[0].content[0].type: images"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": [*HI, USE, result("t2")]},
     "messages[2].content[0].tool_use_id: no tool_use"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": [*HI, {**USE, "content": [
        {"type": "tool_use", "id": "t1", "name": "add", "input": "{}"}]}]}, "messages[1].content[0].input"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": [*HI, USE, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image"}]}]}]},
     "messages[2].content[0].content[0].type: images"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": HI, "tools": [{"type": "bash_20250124",
                                                                                "name": "bash"}]},
     "tools[0].type: only custom tools"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": HI, "tools": [{"name": "add"}]},
     "tools[0].input_schema"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": HI, "system": [{"type": "text", "text": 3}]},
     "system[0].text"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": HI, "temperature": [1]}, "temperature"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": HI, "tool_choice": {"type": "maybe"}},
     "tool_choice.type"),
    ("messages", {"model": "forge", "max_tokens": 8, "messages": HI, "max_tokenz": 8}, "unknown field max_tokenz"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return TrajectoryStore(tmp_path_factory.mktemp("bad") / "t.db")


@pytest.fixture(scope="module")
def gateway(store):
    def answer(messages, tools):
        return "x" * 3000 if "long" in messages[-1]["content"] else "Five."

    with Gateway(ScriptedPolicy(answer, tiny_tokenizer()), Recorder(store), token="s3cret",
                 max_body_bytes=4096) as gw:
        yield gw


def route(gateway: Gateway, api: str, episode: str) -> str:
    return f"{gateway.episode_url(episode)}/{api}"


def refusal(resp: httpx.Response, api: str) -> str:
    """The message of an error in the API's own shape."""
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    if api == "messages":
        assert body["type"] == "error"
    return body["error"]["message"]


def still_serving(client: httpx.Client, gateway: Gateway, api: str) -> None:
    ok = client.post(f"{gateway.base_url}/{api}", json=GOOD[api])
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("api, body, words", BAD, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD)])
def test_a_malformed_body_is_a_400_naming_the_field_and_records_nothing(gateway, store, api, body, words):
    episode = f"bad-{api}-{BAD.index((api, body, words))}"
    with httpx.Client(timeout=30, headers=AUTH) as client:
        resp = client.post(route(gateway, api, episode), json=body)
        assert resp.status_code == 400, resp.text
        assert words in refusal(resp, api)
        still_serving(client, gateway, api)
    assert episode not in {t.id for t in store.trajectories()}  # not a step, not even an empty episode


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_bodies_too_big_or_too_deep_are_refused(gateway, api):
    huge = {**GOOD[api], "metadata": {"pad": "x" * 5000}}
    with httpx.Client(timeout=30, headers=AUTH) as client:
        resp = client.post(f"{gateway.base_url}/{api}", json=huge)
        assert resp.status_code == 413 and "over 4096 bytes" in refusal(resp, api)
        chunked = client.post(f"{gateway.base_url}/{api}", content=iter([b"x" * 1000] * 10))  # no Content-Length
        assert chunked.status_code == 413
        deep = client.post(f"{gateway.base_url}/{api}", content=b"[" * 4000)
        assert deep.status_code == 400 and "invalid JSON" in refusal(deep, api)
        assert client.post(f"{gateway.base_url}/{api}", content=b"{not json").status_code == 400
        still_serving(client, gateway, api)


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_client_hanging_up_mid_stream_is_a_clean_close(gateway, store, api):
    body = json.dumps({**GOOD[api], "stream": True, **(
        {"input": "long", "max_output_tokens": 8192} if api == "responses" else
        {"messages": [{"role": "user", "content": "long"}], "max_tokens": 8192})})
    host, port = gateway.address.removeprefix("http://").split(":")
    path = f"/episodes/hangup-{api}/v1/{api}"
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer s3cret\r\nContent-Type: "
               f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode()
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(request)
        assert raw.recv(64).startswith(b"HTTP/1.1 200")  # the stream began; hang up before its end
    with httpx.Client(timeout=30, headers=AUTH) as client:
        still_serving(client, gateway, api)
    (step,) = store.get(f"hangup-{api}").transitions  # the call was answered: one whole step
    assert step.action.content == "x" * 3000 and step.completion_token_ids and step.info["api"] == api
