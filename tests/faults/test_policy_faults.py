"""Policy faults: the server is killed and restarted, answers HTTP 500, malformed JSON, no token
ids, or too slowly. Safe cases are retried; otherwise the episode ends failed with the reason,
no step without token ids is stored, and the trainer skips the failed episodes and counts them."""

import time

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import tool

import forge_bridge as fb
from forge_bridge.adapters.langchain import ForgeMiddleware
from forge_bridge.policies.vllm import VLLMPolicy

from fake_vllm import FakeVLLM

QUESTION = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent_on(policy):
    return create_agent(FakeListChatModel(responses=["unused"]), [add], middleware=[ForgeMiddleware(policy)])


@pytest.fixture
def server():
    fake = FakeVLLM()
    yield fake
    fake.stop()


@pytest.fixture
def recorder(tmp_path):
    return fb.Recorder(tmp_path / "faults.db", run_id="faults")


def run_episode(policy, recorder, task_id="t"):
    """One agent episode; returns the stored trajectory whatever happened."""
    try:
        with fb.episode(task_id, recorder=recorder) as ep:
            agent_on(policy).invoke(QUESTION)
            ep.reward(1.0)
    except fb.PolicyError:
        pass
    return recorder.store.get(ep.id)


def test_transient_http_500s_are_retried_and_the_episode_completes(server, recorder):
    server.fail_first = 2
    traj = run_episode(VLLMPolicy(server.url, retries=3, backoff_s=0.01), recorder)
    assert traj.status == "complete" and len(traj.transitions) == 2
    assert server.requests == 4  # 2 failures + 2 model calls


@pytest.mark.parametrize("mode, reason", [
    ("500", "HTTP 500"),
    ("not-json", "not JSON"),
    ("no-token-ids", "no token ids"),
])
def test_a_bad_answer_fails_the_episode_with_the_reason_and_stores_no_untrainable_step(
        server, recorder, mode, reason):
    server.mode = mode
    traj = run_episode(VLLMPolicy(server.url, retries=1, backoff_s=0.01), recorder)
    assert traj.status == "failed" and reason in traj.end_detail
    assert traj.transitions == []  # nothing without token ids was recorded
    assert all(t.has_tokens for t in recorder.store.get(traj.id).transitions)


def test_a_slow_server_times_out_into_a_failed_episode(server, recorder):
    server.mode, server.slow_s = "slow", 5.0
    t0 = time.perf_counter()
    traj = run_episode(VLLMPolicy(server.url, timeout_s=0.5, retries=1, backoff_s=0.01), recorder)
    assert time.perf_counter() - t0 < 4  # two tries of 0.5 s, not the server's 5 s each
    assert traj.status == "failed" and "Timeout" in traj.end_detail


def test_a_server_killed_mid_episode_and_restarted_within_the_retry_window_loses_nothing(server, recorder):
    policy = VLLMPolicy(server.url, retries=4, backoff_s=0.3)
    original = agent_on(policy)

    def kill_then_restart_after_the_first_call():
        server.stop()
        import threading
        threading.Timer(0.5, server.start).start()

    with fb.episode("restart", recorder=recorder) as ep:
        first = policy.chat(QUESTION["messages"], [])  # the agent's first model call, by hand
        kill_then_restart_after_the_first_call()
        result = original.invoke(QUESTION)  # its calls wait out the restart through retries
        ep.reward(1.0)
    assert first.completion_token_ids
    traj = recorder.store.get(ep.id)
    assert traj.status == "complete" and len(traj.transitions) == 2
    assert "5" in str(result["messages"][-1].content)


def test_a_server_down_for_longer_fails_that_episode_and_the_next_one_runs_after_restart(server, recorder):
    policy = VLLMPolicy(server.url, retries=1, backoff_s=0.01)
    server.stop()
    down = run_episode(policy, recorder, "while-down")
    assert down.status == "failed" and "unreachable" in down.end_detail
    server.start()
    up = run_episode(policy, recorder, "after-restart")
    assert up.status == "complete" and len(up.transitions) == 2


def test_the_trainer_skips_failed_episodes_counts_them_and_trains_on_the_rest(server, tmp_path, caplog):
    from forge_bridge.policies import models

    model_dir = models.save(*models.tiny(), tmp_path / "tiny")
    policy = VLLMPolicy(server.url, retries=0)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, concurrency=1, out_dir=str(tmp_path / "run"),
                                                   run_name="faults", progress=False),
                             model=str(model_dir))
    agent = agent_on(policy)
    calls = {"n": 0}

    def rollout(task) -> float:
        calls["n"] += 1
        server.mode = "500" if calls["n"] % 2 == 0 else "ok"  # every other rollout meets an outage
        agent.invoke(QUESTION)
        return float(calls["n"] % 4 == 1)  # the surviving rollouts score 1, 0, 1, 0, ...

    history = trainer.train(rollout, [{"id": "a"}], iterations=1)
    metrics = history[0]
    assert metrics["episodes"] == 4 and metrics["episodes_failed"] == 2
    assert metrics["episodes_outage"] == 2 and metrics["episodes_crashed"] == 0
    assert "not training on 2 episode(s) (e.g. outage: PolicyResponseError" in caplog.text  # progress=False too
    assert metrics["batch_samples"] > 0  # the two complete rollouts (rewards 1 and 0) were trained on
    assert ("load_lora_adapter", "faults-v1") in server.adapters  # and the result was published
    stored = trainer.recorder.store.trajectories()
    assert sorted(t.status for t in stored) == ["complete", "complete", "failed", "failed"]
