"""Record-only mode: the gateway forwards every call to an upstream OpenAI-compatible server (the
agent's own model; here a second gateway on the taught tiny model) and records its replies in the
student's tokens. The steps it records equal, field by field and token by token, what the
upstream's own local-policy path recorded for the same calls; the agent sees the upstream's
answers; an unreachable upstream is an outage, recorded, and a 502 for the agent."""

import httpx
import openai
import pytest

from forge_bridge.app import testing
from forge_bridge.core.episode import Recorder
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies import models
from forge_bridge.policies.local import LocalPolicy
from forge_bridge.policies.upstream import UpstreamPolicy
from forge_bridge.serving.gateway import Gateway


@pytest.fixture(scope="module")
def upstream(taught_model_dir, tmp_path_factory):
    """The agent's own model: a gateway on the taught model, recording on its own side."""
    policy = LocalPolicy(str(taught_model_dir))
    store = TrajectoryStore(tmp_path_factory.mktemp("upstream") / "own.db")
    with Gateway(policy, Recorder(store), token="upstream-key") as gw:
        yield gw, store
    store.close()
    policy.close()


def agent_run(base_url: str, api_key: str, stream: bool = False) -> list:
    """The two calls of the add-2-and-3 agent (a tool call, then the answer), greedy."""
    c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    first = c.chat.completions.create(model="forge", messages=testing.ASK, tools=[testing.ADD_TOOL],
                                      temperature=0, max_tokens=48)
    tc = first.choices[0].message.tool_calls[0]
    history = testing.ASK + [first.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": tc.id, "content": "5"}]
    if stream:
        chunks = list(c.chat.completions.create(model="forge", messages=history, tools=[testing.ADD_TOOL],
                                                temperature=0, max_tokens=48, stream=True))
        return [first, "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)]
    return [first, c.chat.completions.create(model="forge", messages=history, tools=[testing.ADD_TOOL],
                                             temperature=0, max_tokens=48)]


@pytest.mark.parametrize("stream", [False, True])
def test_passthrough_records_what_the_local_path_records_token_for_token(upstream, taught_model_dir, tmp_path, stream):
    own, own_store = upstream
    tokenizer = models.load_tokenizer(str(taught_model_dir))
    store = TrajectoryStore(tmp_path / "recorded.db")
    before = {t.id for t in own_store.trajectories()}
    with Gateway(UpstreamPolicy(own.base_url, tokenizer, api_key="upstream-key"), Recorder(store)) as gw:
        first, second = agent_run(gw.episode_url("prod-1"), "unused", stream)
        assert httpx.post(gw.address + "/episodes/prod-1/finish", json={}).status_code == 200
    # the agent saw the upstream's answers
    assert first.choices[0].message.tool_calls[0].function.name == "add"
    assert (second if stream else second.choices[0].message.content) == "The answer is 5."
    recorded = store.get("prod-1")
    assert recorded.behaviour == "upstream" and recorded.status == "complete" and len(recorded) == 2
    theirs = sorted((t for t in own_store.trajectories() if t.id not in before), key=lambda t: t.id)
    assert len(theirs) == 2 and all(t.behaviour == "policy" for t in theirs)
    theirs = sorted((t.transitions[0] for t in theirs), key=lambda s: len(s.prompt_token_ids))
    # the agent got the upstream's reply as it gave it: its usage, none of the student's token ids
    assert "prompt_token_ids" not in (first.model_extra or {}) and "token_ids" not in (first.choices[0].model_extra or {})
    assert first.usage.prompt_tokens == len(theirs[0].prompt_token_ids)
    for mine, local in zip(recorded.transitions, theirs):
        assert mine.prompt_token_ids == local.prompt_token_ids
        assert mine.completion_token_ids == local.completion_token_ids
        assert mine.observation.messages == local.observation.messages
        assert mine.observation.tools == local.observation.tools
        assert mine.action.content == local.action.content
        assert [(c.name, c.arguments) for c in mine.action.tool_calls] == \
               [(c.name, c.arguments) for c in local.action.tool_calls]
        assert mine.action.finish_reason == local.action.finish_reason
        assert mine.info["upstream"] and mine.info["upstream_latency_s"] > 0
    store.close()


def test_an_unreachable_upstream_is_a_recorded_outage(taught_model_dir, tmp_path):
    tokenizer = models.load_tokenizer(str(taught_model_dir))
    store = TrajectoryStore(tmp_path / "t.db")
    with Gateway(UpstreamPolicy("http://127.0.0.1:9/v1", tokenizer, timeout_s=2), Recorder(store)) as gw:
        resp = httpx.post(gw.episode_url("down-1") + "/chat/completions", json={"messages": testing.ASK})
        assert resp.status_code == 502 and "unreachable" in resp.json()["error"]["message"]
    traj = store.get("down-1")
    assert traj.end_reason == "outage" and traj.behaviour == "upstream"
    store.close()


def test_an_upstream_is_not_trained_here(taught_model_dir, adapter_dirs):
    from forge_bridge.core.errors import Unsupported

    policy = UpstreamPolicy("http://127.0.0.1:9/v1", models.load_tokenizer(str(taught_model_dir)))
    with pytest.raises(Unsupported, match="not trained here"):
        policy.load_adapter(adapter_dirs["v1"], "v1")
    policy.close()
