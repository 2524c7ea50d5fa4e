"""The gateway as an HTTP server: every malformed request gets a clean OpenAI-style error, and the
connection it came on keeps serving (no keep-alive desync), whatever the client sends."""

import socket

import httpx
import pytest

from forge_bridge.app import testing
from forge_bridge.core.episode import Recorder
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.serving.gateway import Gateway

GOOD = {"model": "forge", "messages": testing.ASK, "max_tokens": 32}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    policy = ScriptedPolicy(lambda m, t: "The answer is 5.", models.tiny()[1])
    recorder = Recorder(TrajectoryStore(tmp_path_factory.mktemp("gw") / "t.db"), run_id="http")
    with Gateway(policy, recorder, token="s3cret", max_body_bytes=4096) as gw:
        yield gw


AUTH = {"Authorization": "Bearer s3cret"}


def openai_error(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert err["code"] == status and isinstance(err["type"], str)
    return err["message"]


def test_a_refused_request_does_not_desync_the_connection(gateway):
    url = gateway.base_url + "/chat/completions"
    with httpx.Client(timeout=30) as client:  # one client: its keep-alive connection is reused
        statuses = [client.post(url, json=GOOD).status_code,  # no token: 401, body left unread
                    client.post(url, json=GOOD, headers=AUTH).status_code,
                    client.post(url, content=b"{not json", headers=AUTH).status_code,
                    client.post(url, json=GOOD, headers=AUTH).status_code]
    assert statuses == [401, 200, 400, 200]


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "invalid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"messages": "hi"}', 400, "messages"),
    (b'{"messages": []}', 400, "messages"),
    (b'{"messages": [{"content": "no role"}]}', 400, "messages[0]"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400, "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}', 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}', 400, "tools"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 3}', 400, "n=1"),
    (b'{"messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}', 413, "over 4096 bytes"),
])
def test_malformed_requests_get_clean_errors_and_the_server_keeps_serving(gateway, body, status, words):
    with httpx.Client(timeout=30, headers=AUTH) as client:
        assert words in openai_error(client.post(gateway.base_url + "/chat/completions", content=body), status)
        ok = client.post(gateway.base_url + "/chat/completions", json=GOOD)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "The answer is 5."


def test_unknown_routes_methods_and_episode_ids_are_clean_errors(gateway):
    with httpx.Client(timeout=30, headers=AUTH) as client:
        assert "no route" in openai_error(client.get(gateway.address + "/v2/nothing"), 404)
        assert "not allowed" in openai_error(client.get(gateway.base_url + "/chat/completions"), 405)
        assert "no open episode" in openai_error(
            client.post(gateway.address + "/episodes/never-opened/finish", json={"reward": 1}), 404)
        assert "episode id" in openai_error(
            client.post(gateway.base_url + "/chat/completions", json=GOOD,
                        headers={"X-Forge-Episode": "bad id!"}), 400)
        assert client.get(gateway.base_url + "/models").json()["data"][0]["id"] == "forge"
        assert client.get(gateway.address + "/health").json() == {"status": "ok"}


def test_a_body_larger_than_declared_or_chunked_is_still_bounded(gateway):
    def chunks():
        for _ in range(10):
            yield b"x" * 1000

    with httpx.Client(timeout=30, headers=AUTH) as client:  # chunked: no Content-Length to trust
        assert "over 4096 bytes" in openai_error(
            client.post(gateway.base_url + "/chat/completions", content=chunks()), 413)
        assert client.post(gateway.base_url + "/chat/completions", json=GOOD).status_code == 200


def test_a_raw_socket_sending_garbage_does_not_take_the_server_down(gateway):
    host, port = gateway.address.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        raw.recv(1024)  # an error status line, or the connection closed: either is fine
    with httpx.Client(timeout=30, headers=AUTH) as client:
        assert client.post(gateway.base_url + "/chat/completions", json=GOOD).status_code == 200
