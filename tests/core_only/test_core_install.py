"""With the core alone installed (no LangChain, CrewAI, Ray, Playwright, MiniWoB++, matplotlib, pyarrow, wandb
or MLflow):
`forge_bridge` imports, an agent that only speaks HTTP is recorded through the gateway and
trained on, and each integration used without its extra says which `pip install` fixes it."""

from __future__ import annotations

import importlib
import importlib.util
import json

import httpx
import pytest

import forge_bridge as fb
from forge_bridge.app import testing
from forge_bridge.core.errors import MissingExtra
from forge_bridge.policies import models

EXTRA_MODULES = {"langchain": "langchain", "langchain_core": "langchain", "crewai": "crewai", "ray": "ray",
                 "playwright": "browser", "miniwob": "miniwob", "matplotlib": "plot", "pyarrow": "parquet",
                 "wandb": "wandb", "mlflow": "mlflow"}


def test_this_venv_holds_the_core_alone():
    present = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is not None]
    assert not present, f"not a core-only venv: {present} installed (make test builds .venv-core with pip install .)"


@pytest.mark.parametrize("module, extra", [("forge_bridge.adapters.crewai", "crewai"),
                                           ("forge_bridge.adapters.langchain", "langchain")])
def test_an_integration_without_its_extra_names_the_install(module, extra):
    with pytest.raises(MissingExtra, match=rf"pip install 'forge-bridge\[{extra}\]'"):
        importlib.import_module(module)


def test_the_other_extras_name_their_install(tmp_path):
    from forge_bridge.app.plot import plot_run
    from forge_bridge.core import exchange
    from forge_bridge.scale.cluster import require_ray

    with pytest.raises(MissingExtra, match=r"forge-bridge\[ray\]"):
        require_ray()
    with fb.TrajectoryStore(tmp_path / "s.db") as store:
        with pytest.raises(MissingExtra, match=r"forge-bridge\[parquet\]"):
            exchange.export_parquet(store, tmp_path / "out.parquet")
        assert exchange.export_jsonl(store, tmp_path / "out.jsonl") == 0  # JSONL needs nothing more
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1, "reward_mean": 0.5, "success_rate": 0.5}\n')
    with pytest.raises(MissingExtra, match=r"forge-bridge\[plot\]"):
        plot_run(tmp_path)
    from forge_bridge.envs.miniwob import MiniWoBTask

    with pytest.raises(MissingExtra, match=r"forge-bridge\[miniwob\]"):
        MiniWoBTask("click-test")
    from forge_bridge.trainer.trackers import open_trackers

    for tracker in ("wandb", "mlflow"):
        with pytest.raises(MissingExtra, match=rf"pip install 'forge-bridge\[{tracker}\]'"):
            open_trackers((tracker,), tmp_path, "run-1", "run", {})


def test_an_agent_recorded_through_the_gateway_is_trained_on(tmp_path):
    model, tokenizer = models.tiny()
    testing.teach(model, tokenizer, list(testing.BASE_EXAMPLES), steps=60)
    model_dir = models.save(model, tokenizer, tmp_path / "taught")
    policy = fb.LocalPolicy(str(model_dir))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, lr=1e-2, out_dir=str(tmp_path / "run"),
                                                   progress=False, seed=0))
    with fb.Gateway(policy, trainer.recorder) as gateway, httpx.Client(timeout=60) as client:
        def rollout(task) -> float:  # an agent that speaks only HTTP to its base_url
            episode_id = gateway.attach(fb.current_episode())
            try:
                reply = client.post(f"{gateway.episode_url(episode_id)}/chat/completions", json={
                    "model": "forge", "messages": testing.ASK, "tools": [testing.ADD_TOOL],
                    "temperature": 2.0, "max_tokens": 12}).json()
            finally:
                gateway.release(episode_id)
            message = reply["choices"][0]["message"]  # a reward that differs between different replies
            return sum(map(ord, json.dumps(message, sort_keys=True))) % 5 / 4

        history = trainer.train(rollout, [{"id": "ask"}], iterations=2)
    trainer.close()
    stored = trainer.recorder.store.trajectories(run_id=trainer.run_id)
    assert len(stored) == 8 and all(len(t) == 1 and t.transitions[0].completion_token_ids for t in stored)
    assert sum(h["batch_samples"] for h in history) > 0  # a group with a reward spread was trained
    assert policy.current() == "run-v2"
    policy.close()


def test_the_responses_and_messages_routes_need_neither_sdk(tmp_path):
    """The gateway's Responses and Messages routes are the core's own: no `openai`, no `anthropic`."""
    import sys

    from forge_bridge.policies.scripted import ScriptedPolicy

    policy = ScriptedPolicy(lambda messages, tools: "Five.", models.tiny_tokenizer())
    with fb.Gateway(policy, fb.Recorder(fb.TrajectoryStore(tmp_path / "t.db"))) as gateway:
        url = gateway.episode_url("apis")
        answer = httpx.post(f"{url}/responses", json={"model": "forge", "input": "2 + 3?"}).json()
        message = httpx.post(f"{url}/messages", json={"model": "forge", "max_tokens": 16, "messages": [
            {"role": "user", "content": "2 + 3?"}]}).json()
        steps = gateway.recorder.store.get("apis").transitions
    assert answer["output"][0]["content"][0]["text"] == "Five." and message["content"][0]["text"] == "Five."
    assert [s.info["api"] for s in steps] == ["responses", "messages"]
    assert not {"openai", "anthropic"} & set(sys.modules)
