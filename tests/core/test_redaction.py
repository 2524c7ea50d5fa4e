"""Redaction: what it removes leaves no trace in the SQLite files (their bytes grepped, the WAL's
too), in text or in tokens, while the agent still gets the unredacted reply; a step it does not
touch keeps the exact tokens the policy sampled."""

import re

import httpx
import pytest

from forge_bridge.app import testing
from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument, WrongType
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies import models
from forge_bridge.policies.redaction import Redaction, scrub
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.serving.gateway import Gateway

SECRET = "alice.smith@example.com"
EMAIL = re.compile(r"[\w.]+@\w+(?:\.\w+)+")


def hide(text: str) -> str:
    return EMAIL.sub("[email]", text)


def store_bytes(path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))  # the file, its -wal and -shm


def test_scrub_reaches_every_string_but_identifiers():
    step = {"messages": [{"role": "user", "content": f"mail {SECRET}"}],
            "tool_calls": [{"id": "call_1", "function": {"arguments": f'{{"to": "{SECRET}"}}'}}], "n": [1, 2]}
    assert scrub(step, hide) == {"messages": [{"role": "user", "content": "mail [email]"}],
                                 "tool_calls": [{"id": "call_1", "function": {"arguments": '{"to": "[email]"}'}}],
                                 "n": [1, 2]}
    with pytest.raises(WrongType, match="str -> str"):
        scrub("x", lambda s: None)
    with pytest.raises(InvalidArgument, match="redaction"):
        Recorder(TrajectoryStore(":memory:"), redaction="hide")


def test_what_redaction_removes_never_reaches_the_store(tmp_path):
    tokenizer = models.tiny()[1]
    reply = iter([{"tool": "add", "args": {"a": 2, "b": 3}}, f"Sent the answer, 5, to {SECRET}."])
    policy = ScriptedPolicy(lambda m, t: next(reply), tokenizer)
    path = tmp_path / "t.db"
    store = TrajectoryStore(path)
    with Gateway(policy, Recorder(store, redaction=Redaction(hide, tokenizer))) as gw:
        url = gw.episode_url("r-1") + "/chat/completions"
        ask = [{"role": "user", "content": f"What is 2 plus 3? Mail it to {SECRET}"}]
        first = httpx.post(url, json={"messages": ask, "tools": [testing.ADD_TOOL], "temperature": 0}).json()
        call = first["choices"][0]["message"]["tool_calls"][0]
        history = ask + [first["choices"][0]["message"],
                         {"role": "tool", "tool_call_id": call["id"], "content": f"5 (for {SECRET})"}]
        second = httpx.post(url, json={"messages": history, "tools": [testing.ADD_TOOL], "temperature": 0}).json()
        assert SECRET in second["choices"][0]["message"]["content"]  # the agent sees it
        assert httpx.post(gw.address + "/episodes/r-1/finish", json={"reward": 1}).status_code == 200
    traj = store.get("r-1")
    store.close()
    data = store_bytes(path)
    assert SECRET.encode() not in data and b"alice" not in data
    first_step, second_step = traj.transitions
    assert "[email]" in first_step.observation.messages[0]["content"] and first_step.info["redacted"]
    assert second_step.action.content == "Sent the answer, 5, to [email]."
    assert first_step.info["tool_results"][call["id"]]["content"] == "5 (for [email])"
    secret_ids = tokenizer.encode(SECRET, add_special_tokens=False)
    for step in traj.transitions:  # the tokens were rendered again from the scrubbed text
        assert "alice" not in tokenizer.decode(step.prompt_token_ids + step.completion_token_ids)
        ids = step.prompt_token_ids + step.completion_token_ids
        assert not any(ids[i:i + len(secret_ids)] == secret_ids for i in range(len(ids)))
        assert set(step.completion_logprobs) == {0.0}


def test_a_step_redaction_leaves_alone_keeps_its_sampled_tokens(tmp_path, taught_model_dir):
    from forge_bridge.policies.local import LocalPolicy

    policy = LocalPolicy(str(taught_model_dir))
    store = TrajectoryStore(tmp_path / "t.db")
    with Gateway(policy, Recorder(store, redaction=Redaction(hide, policy.tokenizer))) as gw:
        out = httpx.post(gw.episode_url("clean") + "/chat/completions",
                         json={"messages": testing.ASK, "tools": [testing.ADD_TOOL], "temperature": 1.0,
                               "max_tokens": 48, "seed": 3}).json()
    (step,) = store.get("clean").transitions
    assert step.completion_token_ids == out["choices"][0]["token_ids"]  # what was sampled, as sampled
    assert "redacted" not in step.info and any(lp < 0 for lp in step.completion_logprobs)
    store.close()
    policy.close()
