"""The trainer trains in an Environment through HarnessAgent, and the same trainer object then
trains a wrapped LangChain agent: one rollout interface, no code path of its own for either."""

import json

import torch

import forge_bridge as fb
from forge_bridge.app import testing
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.envs.terminal import TerminalEnvironment
from forge_bridge.envs.tool import ToolTask
from forge_bridge.policies import models

import training_task

PROMPT = "Create hello.txt containing hello."


def check(answer: str, env: TerminalEnvironment) -> bool:
    path = env.workdir / "hello.txt"
    return path.is_file() and path.read_text() == "hello"


TASKS = [ToolTask("hello-file", PROMPT, check=check)]


def write_call(content: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "write_file", "arguments": {
        "path": "hello.txt", "content": content}}) + "\n</tool_call>"


def terminal_model(path) -> str:
    """A tiny model taught two ways to start (right and wrong content), then to finish."""
    model, tokenizer = models.tiny(seed=2)
    tools = TerminalEnvironment().tools
    ask = [{"role": "user", "content": PROMPT}]

    def after(content: str) -> list[dict]:
        call = {"id": "c", "type": "function", "function": {"name": "write_file", "arguments": json.dumps(
            {"path": "hello.txt", "content": content})}}
        return ask + [{"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "c", "content": "wrote 5 characters to hello.txt"}]

    testing.teach(model, tokenizer, [(ask, tools, write_call("hello")), (ask, tools, write_call("hullo")),
                                     (after("hello"), tools, "Done."), (after("hullo"), tools, "Done.")],
                  steps=150)
    return str(models.save(model, tokenizer, path))


def test_grpo_trains_on_a_terminal_environment_then_on_a_langchain_agent(tmp_path):
    torch.manual_seed(0)
    policy = fb.LocalPolicy(terminal_model(tmp_path / "model"))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=8, lr=3e-3, lora_rank=8, lora_alpha=16,
                                                   out_dir=str(tmp_path / "run"), run_name="env",
                                                   progress=False, concurrency=4, seed=0))
    harness = HarnessAgent(policy, TerminalEnvironment, max_model_calls=4, temperature=1.0, max_tokens=64)
    history = trainer.train(harness, TASKS, iterations=2)

    assert [h["version"] for h in history] == ["env-v1", "env-v2"] and policy.current() == "env-v2"
    assert sum(h["batch_samples"] for h in history) > 0  # trained on the terminal rollouts
    assert any(0 < h["reward_mean"] < 1 for h in history)
    with fb.TrajectoryStore(tmp_path / "run" / "trajectories.db") as store:
        trajs = store.trajectories()
    assert len(trajs) == 16
    second = [t for t in trajs if t.metadata["iteration"] == 2]
    assert {s.version for t in second for s in t.transitions} == {"env-v1"}  # served by the published v1
    writes = [r for t in trajs for s in t.transitions for r in s.info.get("tool_results", {}).values()]
    assert writes and all(r["name"] == "write_file" for r in writes)

    # the same trainer object, the same `train`, now on an ordinary LangChain agent
    lc_rollout = training_task.make_rollout(training_task.agent_for(policy))
    history = trainer.train(lc_rollout, training_task.TASKS, iterations=3)
    assert history[-1]["version"] == "env-v3" and policy.current() == "env-v3"
    with fb.TrajectoryStore(tmp_path / "run" / "trajectories.db") as store:
        lc = [t for t in store.trajectories() if t.metadata["iteration"] == 3]
    assert len(lc) == 8 and all(s.info["source"] == "langchain" for t in lc for s in t.transitions)
    policy.close()
