"""HarnessAgent: the framework-free loop over an Environment records every model call as a
Transition with its token ids and tool results, like the framework integrations do."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import forge_bridge as fb
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.envs.terminal import TerminalEnvironment
from forge_bridge.envs.tool import ToolTask
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy


def hermes(name: str, **args) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def file_task(i: int = 0) -> ToolTask:
    def check(answer, env):
        path = env.workdir / "out.txt"
        return path.is_file() and path.read_text() == f"value {i}"

    return ToolTask(f"write-{i}", f"Write 'value {i}' to out.txt.", check=check)


def expert(messages, tools) -> str:
    """Writes the file, lists the folder, then answers."""
    wanted = messages[0]["content"].split("'")[1] if messages[0]["role"] == "user" else messages[1]["content"].split("'")[1]
    done = sum(m["role"] == "tool" for m in messages)
    if done == 0:
        return hermes("write_file", path="out.txt", content=wanted)
    if done == 1:
        return hermes("run", command="ls")
    return "Done: out.txt written."


@pytest.fixture(scope="module")
def tokenizer():
    return models.tiny_tokenizer()


def test_a_scripted_policy_solves_a_terminal_task_and_every_step_is_recorded(tokenizer, tmp_path):
    policy = ScriptedPolicy(expert, tokenizer)
    harness = HarnessAgent(policy, TerminalEnvironment, system="You are careful.")
    traj = harness.run(file_task(), recorder=fb.Recorder(tmp_path / "t.db", "harness"))
    assert traj.status == "complete" and traj.reward == 1.0 and traj.task_id == "write-0"
    assert len(traj.transitions) == 3
    first, second, last = traj.transitions
    for t in traj.transitions:
        assert t.prompt_token_ids and t.completion_token_ids and t.info["source"] == "harness"
        assert t.observation.tools and {x["function"]["name"] for x in t.observation.tools} == {
            "run", "read_file", "write_file"}
    assert first.observation.messages[0] == {"role": "system", "content": "You are careful."}
    (written,) = first.info["tool_results"].values()
    assert written["name"] == "write_file" and written["status"] == "success"
    (listed,) = second.info["tool_results"].values()
    assert listed["exit_code"] == 0 and "out.txt" in listed["content"]
    # the next prompt holds the assistant's call and the tool's answer, in order
    assert [m["role"] for m in last.observation.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert last.action.content == "Done: out.txt written." and not last.action.tool_calls
    with fb.TrajectoryStore(tmp_path / "t.db") as store:
        stored = store.get(traj.id)
    assert stored.status == "complete" and stored.transitions[1].info["tool_results"] == second.info["tool_results"]


def test_an_endless_tool_loop_is_cut_at_max_steps_and_recorded_as_truncated(tokenizer, tmp_path):
    policy = ScriptedPolicy(lambda m, t: hermes("run", command="ls"), tokenizer)
    traj = HarnessAgent(policy, TerminalEnvironment, max_model_calls=3).run(
        file_task(), recorder=fb.Recorder(tmp_path / "t.db"))
    assert traj.status == "truncated" and len(traj.transitions) == 3 and traj.reward == 0.0
    assert "more than 3 model calls" in traj.end_detail


def test_a_malformed_tool_call_fails_the_episode_as_the_policys_fault(tokenizer, tmp_path):
    policy = ScriptedPolicy(lambda m, t: '<tool_call>\n{"name": "run", "arguments": {oops}\n</tool_call>', tokenizer)
    traj = HarnessAgent(policy, TerminalEnvironment).run(file_task(), recorder=fb.Recorder(tmp_path / "t.db"))
    assert traj.status == "failed" and traj.end_reason == "policy_fault"
    assert len(traj.transitions) == 1 and traj.transitions[0].action.parse_errors


def test_concurrent_rollouts_each_get_their_own_environment(tokenizer, tmp_path):
    policy = ScriptedPolicy(expert, tokenizer)
    harness = HarnessAgent(policy, TerminalEnvironment)
    recorder = fb.Recorder(tmp_path / "t.db")
    with ThreadPoolExecutor(8) as pool:
        trajs = list(pool.map(lambda i: harness.run(file_task(i), recorder=recorder), range(16)))
    assert [t.reward for t in trajs] == [1.0] * 16  # no rollout saw another's working directory


def test_a_shared_environment_instance_runs_one_episode_at_a_time(tokenizer, tmp_path):
    env = TerminalEnvironment()
    harness = HarnessAgent(ScriptedPolicy(expert, tokenizer), env)
    recorder = fb.Recorder(tmp_path / "t.db")
    with ThreadPoolExecutor(4) as pool:
        trajs = list(pool.map(lambda i: harness.run(file_task(i), recorder=recorder), range(4)))
    assert [t.reward for t in trajs] == [1.0] * 4
    env.close()


def test_step_rewards_land_on_their_steps_and_the_last_one_is_the_outcome(tokenizer, tmp_path):
    class Counting(fb.Environment):
        tools = []

        def reset(self, task):
            self.n = 0
            return "count to three"

        def step(self, action):
            self.n += 1
            return fb.StepResult(observation=f"{self.n}", reward=0.25 if self.n < 3 else 1.0,
                                 terminated=self.n == 3)

    traj = HarnessAgent(ScriptedPolicy(lambda m, t: "next", tokenizer), Counting).run(
        "t", recorder=fb.Recorder(tmp_path / "t.db"), task_id="count")
    assert [t.reward for t in traj.transitions] == [0.25, 0.25, 0.0]
    assert traj.reward == 1.0 and traj.status == "complete"


def test_calling_the_rollout_outside_an_episode_and_bad_arguments_are_clear_errors(tokenizer):
    harness = HarnessAgent(ScriptedPolicy(expert, tokenizer), TerminalEnvironment)
    with pytest.raises(RuntimeError, match="inside `with fb.episode"):
        harness(file_task())
    with pytest.raises(TypeError, match="policy"):
        HarnessAgent("gpt-4", TerminalEnvironment)
    with pytest.raises(ValueError, match="max_model_calls"):
        HarnessAgent(ScriptedPolicy(expert, tokenizer), TerminalEnvironment, max_model_calls=0)
