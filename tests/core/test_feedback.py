"""Delayed feedback: appended to the store whenever it arrives, through the API or the gateway;
the reward it makes is the latest value per key, combined; feedback for an unknown episode is a
clear error and writes nothing; 10,000 episodes' feedback from 32 threads while a reader scans
is stored exactly as sent."""

import math
import threading
import time

import httpx
import pytest

import forge_bridge as fb
from forge_bridge.app import testing
from forge_bridge.core.errors import NotFound, SchemaError, WrongType
from forge_bridge.core.episode import Recorder
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Feedback, Trajectory
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.rewards.feedback import feedback_reward, latest_by_key
from forge_bridge.serving.gateway import Gateway


def stored_episode(store: TrajectoryStore, episode_id: str = "ep-1") -> str:
    store.add_many([Trajectory(id=episode_id, task_id="t", reward=None, end_reason="terminated")])
    return episode_id


def test_the_reward_is_the_latest_value_per_key_then_combined():
    events = [Feedback("e", 1.0, key="user", seq=1), Feedback("e", 0.2, key="judge", seq=2),
              Feedback("e", 0.0, key="user", seq=3)]  # the user changed their mind
    assert {k: e.value for k, e in latest_by_key(events).items()} == {"user": 0.0, "judge": 0.2}
    assert feedback_reward(events) == pytest.approx(0.1)  # mean of 0.0 and 0.2
    assert feedback_reward(events, combine=lambda v: v["judge"]) == pytest.approx(0.2)
    assert feedback_reward(list(reversed(events))) == pytest.approx(0.1)  # arrival order, not list order
    assert feedback_reward([]) is None  # no feedback: no reward (left out of training), never 0
    unstored = [Feedback("e", 1.0), Feedback("e", 0.5)]  # not stored yet: the order given
    assert feedback_reward(unstored) == 0.5
    assert feedback_reward(events, combine=lambda v: v.get("reviewer")) is None  # its key has not arrived


def test_feedback_of_more_episodes_than_sqlite_takes_variables_in_one_statement(tmp_path):
    with TrajectoryStore(tmp_path / "t.db") as store:
        ids = [f"ep-{k}" for k in range(2500)]
        store.add_many([Trajectory(id=i, task_id="t", reward=None, end_reason="terminated") for i in ids])
        for k in (0, 999, 1000, 2499):
            fb.feedback(ids[k], k / 2499, store=store)
        fb.feedback(ids[999], 1.0, key="judge", store=store)
        got = store.feedback(ids + ids[:10])  # repeated ids are read once
        assert set(got) == {ids[0], ids[999], ids[1000], ids[2499]}
        assert [e.key for e in got[ids[999]]] == ["user", "judge"] and got[ids[2499]][0].value == 1.0
        assert store.feedback([]) == {}


def test_feedback_is_appended_and_read_back_with_its_order_and_time(tmp_path):
    with TrajectoryStore(tmp_path / "t.db") as store:
        ep = stored_episode(store)
        before = time.time()
        first = fb.feedback(ep, 1, store=store)
        second = fb.feedback(ep, 0.0, key="reviewer", comment="wrong unit", step=2, store=store)
        assert first.seq < second.seq and before <= first.at <= second.at <= time.time()
        assert first.value == 1.0 and isinstance(first.value, float) and first.source == "api"
        assert store.feedback([ep]) == {ep: [first, second]}
        assert store.feedback(after=first.seq) == {ep: [second]}
        assert store.feedback(["nobody"]) == {}
    by_path = fb.feedback(ep, 0.5, key="user", store=tmp_path / "t.db")  # a path opens the store
    with TrajectoryStore(tmp_path / "t.db", readonly=True) as store:
        assert [e.value for e in store.feedback()[ep]] == [1.0, 0.0, 0.5] and by_path.seq == 3
        assert feedback_reward(store.feedback()[ep]) == pytest.approx(0.25)  # user 0.5, reviewer 0.0


@pytest.mark.parametrize("kwargs, error, words", [
    ({"episode_id": "nobody", "value": 1.0}, NotFound, "no episode 'nobody'"),
    ({"episode_id": "ep-1", "value": math.nan}, SchemaError, "feedback.value"),
    ({"episode_id": "ep-1", "value": "good"}, SchemaError, "feedback.value"),
    ({"episode_id": "ep-1", "value": True}, SchemaError, "feedback.value"),
    ({"episode_id": "ep-1", "value": 1.0, "key": ""}, SchemaError, "feedback.key"),
    ({"episode_id": "ep-1", "value": 1.0, "step": -1}, SchemaError, "feedback.step"),
    ({"episode_id": "ep-1", "value": 1.0, "comment": 3}, SchemaError, "feedback.comment"),
])
def test_bad_feedback_is_refused_and_writes_nothing(tmp_path, kwargs, error, words):
    with TrajectoryStore(tmp_path / "t.db") as store:
        stored_episode(store)
        with pytest.raises(error, match=words):
            fb.feedback(**kwargs, store=store)
        assert store.feedback() == {}
    with pytest.raises(NotFound, match="no trajectory store"):
        fb.feedback("ep-1", 1.0, store=tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()  # no empty store left behind
    with pytest.raises(WrongType, match="store"):
        fb.feedback("ep-1", 1.0, store=42)


def test_the_gateway_takes_feedback_for_an_ended_episode_with_its_token(tmp_path):
    policy = ScriptedPolicy(lambda m, t: "The answer is 5.", models.tiny()[1])
    store = TrajectoryStore(tmp_path / "t.db")
    with Gateway(policy, Recorder(store), token="s3cret") as gw:
        auth = {"Authorization": "Bearer s3cret"}
        url = gw.episode_url("ep-9")
        assert httpx.post(url + "/chat/completions", json={"messages": testing.ASK}, headers=auth).status_code == 200
        assert httpx.post(gw.address + "/episodes/ep-9/finish", json={"reward": 0.0}, headers=auth).status_code == 200
        late = httpx.post(gw.address + "/episodes/ep-9/feedback", json={"value": 1, "comment": "thanks"}, headers=auth)
        assert late.status_code == 200 and late.json()["seq"] == 1 and late.json()["key"] == "user"
        assert httpx.post(gw.address + "/episodes/ep-9/feedback", json={"value": 1}).status_code == 401
        missing = httpx.post(gw.address + "/episodes/ep-404/feedback", json={"value": 1}, headers=auth)
        assert missing.status_code == 404 and "no episode 'ep-404'" in missing.json()["error"]["message"]
        for body in ({"key": "user"}, {"value": "great"}, {"value": 1, "rating": 5}, [1]):
            assert httpx.post(gw.address + "/episodes/ep-9/feedback", json=body, headers=auth).status_code == 400
    (event,) = store.feedback()["ep-9"]
    assert (event.value, event.comment, event.source) == (1.0, "thanks", "gateway")
    assert store.get("ep-9").reward == 0.0  # the episode's own reward is untouched; feedback lives beside it
    store.close()


def test_feedback_for_10000_episodes_from_32_threads_while_a_reader_scans(tmp_path):
    path = tmp_path / "t.db"
    ids = [f"ep-{i}" for i in range(10_000)]
    with TrajectoryStore(path) as store:
        store.add_many([Trajectory(id=i, task_id="t", end_reason="terminated") for i in ids])
    writer = TrajectoryStore(path)  # one store object shared by the threads, as a server holds one
    sent, errors, scans = [0] * 32, [], []
    done = threading.Event()

    def send(k: int) -> None:
        try:
            for i in ids[k::32]:
                fb.feedback(i, (hash(i) % 5) / 4, key="user" if k % 2 else "judge", store=writer)
                sent[k] += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def scan() -> None:
        with TrajectoryStore(path, readonly=True) as reader:
            while not done.is_set():
                seen = reader.feedback()
                scans.append(sum(map(len, seen.values())))

    threads = [threading.Thread(target=send, args=(k,)) for k in range(32)]
    reader = threading.Thread(target=scan)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    writer.close()
    assert not errors and sum(sent) == 10_000
    with TrajectoryStore(path, readonly=True) as store:
        stored = store.feedback()
    assert len(stored) == 10_000 and all(len(events) == 1 for events in stored.values())
    assert sorted(e.seq for events in stored.values() for e in events) == list(range(1, 10_001))
    assert len(scans) >= 2 and scans == sorted(scans)  # the reader saw it grow, never shrink


def test_events_naming_an_episode_are_found_by_its_exact_id(tmp_path):
    with TrajectoryStore(tmp_path / "t.db") as store:
        for ids in (["ep_1"], ["EP_1", "ep-2"], ["ep%1"], ["ep_1", "ep-3"]):
            store.add_event("judge_failed", detail={"episodes": ids, "error": "x"})
        store.add_event("promoted", version="v1", detail={"episodes": ["ep_1"]})
        assert [e["detail"]["episodes"] for e in store.events("judge_failed", episode="ep_1")] == [
            ["ep_1"], ["ep_1", "ep-3"]]  # not EP_1 (LIKE ignores case), not ep%1 (a wildcard)
        assert [e["kind"] for e in store.events(episode="ep_1")] == ["judge_failed", "judge_failed", "promoted"]
        assert store.events("judge_failed", episode="ep") == []
