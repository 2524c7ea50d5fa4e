"""Guarded promotion on the taught tiny model with two adapters, while an agent's requests keep
arriving through the gateway: a worse candidate is refused and never serves a request; a better
one is promoted, then rolled back when its live scores fall; no request fails; every decision is
an event in the store."""

import contextlib
import threading
import time

import httpx
import pytest

from forge_bridge.app import testing
from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import AdapterError, InvalidArgument
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies.local import LocalPolicy
from forge_bridge.serving.gateway import Gateway
from forge_bridge.serving.promotion import CANDIDATE, Gate, Promotion

GRADES = {"Version one.": 1.0, "Version two.": 0.0}
"""The user's held-out check: 'Version one.' is the answer wanted, 'Version two.' a wrong one, and
the base model's tool call half right."""


@contextlib.contextmanager
def agent_traffic(gw: Gateway):
    """An agent's requests to the gateway, all along while inside; yields their status codes."""
    statuses, stop = [], threading.Event()

    def traffic() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                r = client.post(gw.base_url + "/chat/completions", json={
                    "messages": testing.ASK, "tools": [testing.ADD_TOOL], "max_tokens": 32, "temperature": 0})
                statuses.append(r.status_code)

    user = threading.Thread(target=traffic)
    user.start()
    try:
        yield statuses
    finally:
        stop.set()
        user.join()


def test_a_worse_candidate_never_serves_and_a_falling_one_is_rolled_back(taught_model_dir, adapter_dirs, tmp_path):
    policy = LocalPolicy(str(taught_model_dir))
    store = TrajectoryStore(tmp_path / "t.db")

    def evaluate(slot: str) -> float:
        return GRADES.get(policy.chat(testing.ASK, [testing.ADD_TOOL], slot=slot, temperature=0, max_tokens=32).text, 0.5)

    promotion = Promotion(policy, evaluate, Gate(margin=0.0, window=5, drop=0.3), store=store)
    with Gateway(policy, Recorder(store)) as gw, agent_traffic(gw) as statuses:
        for _ in range(5):
            assert promotion.observe(0.5) is False  # the base model's live scores: the baseline
        assert promotion.consider(adapter_dirs["v2"], "worse") is False
        assert policy.current() is None and policy.current(CANDIDATE) is None
        assert promotion.consider(adapter_dirs["v1"], "better") is True
        assert policy.current() == "better"
        deadline = time.monotonic() + 120
        while store.count(version="better") < 2 and time.monotonic() < deadline:  # the users get it
            time.sleep(0.1)
        for _ in range(4):
            assert promotion.observe(0.1) is False  # not a full window yet
        assert promotion.observe(0.1) is True  # 0.1 < 0.5 - 0.3 over the window
        assert policy.current() is None  # back to the base model, at once
    assert statuses and set(statuses) == {200}
    recorded = {s.version for t in store.trajectories() for s in t.transitions}
    assert "worse" not in recorded and "better" in recorded  # the refused candidate never served a user
    events = store.events()
    assert [(e["kind"], e["version"]) for e in events] == [("refused", "worse"), ("promoted", "better"),
                                                           ("rolled back", "better")]
    assert events[0]["detail"]["candidate"] == 0.0 and events[0]["detail"]["serving"] == 0.5
    assert events[2]["detail"]["back_to"] is None and events[2]["detail"]["live_mean"] == pytest.approx(0.1)
    store.close()
    policy.close()


def test_the_gate_and_promote_are_checked(taught_model_dir):
    with pytest.raises(InvalidArgument, match="window"):
        Gate(window=0)
    with pytest.raises(InvalidArgument, match="drop"):
        Gate(drop=-1)
    policy = LocalPolicy(str(taught_model_dir))
    with pytest.raises(AdapterError, match="not what slot"):
        policy.promote("nothing", CANDIDATE)
    with pytest.raises(InvalidArgument, match="score"):
        Promotion(policy, lambda slot: 0.0).observe(float("nan"))
    policy.close()


def test_a_check_that_fails_leaves_the_candidate_unserved(taught_model_dir, adapter_dirs):
    policy = LocalPolicy(str(taught_model_dir))

    def broken(slot: str) -> float:
        raise RuntimeError("the held-out suite crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        Promotion(policy, broken).consider(adapter_dirs["v1"], "cand-1")
    assert policy.current() is None and policy.current(CANDIDATE) is None
    policy.close()


def test_a_shadow_run_judges_the_candidate_on_live_requests_the_users_never_see(taught_model_dir, adapter_dirs,
                                                                                tmp_path):
    import json
    import re

    from forge_bridge.core.errors import InvalidState
    from forge_bridge.policies import models
    from forge_bridge.policies.scripted import ScriptedPolicy
    from forge_bridge.rewards.judges import RelativeJudge
    from forge_bridge.serving.promotion import Shadow

    def grade(messages, tools):  # a judge that grades each attempt by its last line, as GRADES does
        attempts = re.split(r"--- (t\d) ---\n", messages[-1]["content"])[1:]
        return json.dumps({"scores": [{"id": i, "score": GRADES.get(text.strip().splitlines()[-1].removeprefix(
            "assistant: ").strip(), 0.5)} for i, text in zip(attempts[::2], attempts[1::2])]})

    policy = LocalPolicy(str(taught_model_dir))
    store = TrajectoryStore(tmp_path / "t.db")
    shadow = Shadow(RelativeJudge(ScriptedPolicy(grade, models.tiny()[1]), "The answer wanted is 'Version one.'"),
                    share=1.0, requests=4, timeout_s=120)
    promotion = Promotion(policy, shadow, Gate(margin=0.0, window=5, drop=0.3), store=store)
    with Gateway(policy, Recorder(store), shadow=shadow) as gw, agent_traffic(gw) as statuses:
        assert promotion.consider(adapter_dirs["v2"], "worse") is False  # judged on live requests, refused
        assert policy.current() is None and policy.current(CANDIDATE) is None
        assert promotion.consider(adapter_dirs["v1"], "better") is True
    assert statuses and set(statuses) == {200}
    served = [s.version for t in store.trajectories() for s in t.transitions]
    assert "worse" not in served  # the candidate's shadow answers reached no user and no episode
    refused, promoted = store.events()
    assert (refused["kind"], refused["detail"]["candidate"], refused["detail"]["serving"]) == ("refused", 0.0, 0.5)
    assert (promoted["kind"], promoted["detail"]["candidate"], promoted["detail"]["serving"]) == ("promoted", 1.0, 0.5)
    quiet = Promotion(policy, Shadow(shadow.judge, requests=2, timeout_s=0.5), store=store)
    with pytest.raises(InvalidState, match="0 of 2 live requests judged"):  # no traffic, no verdict
        quiet.consider(adapter_dirs["v2"], "worse-again")
    assert policy.current() == "better" and policy.current(CANDIDATE) is None
    with pytest.raises(InvalidArgument, match="share"):
        Shadow(shadow.judge, share=0)
    store.close()
    policy.close()
