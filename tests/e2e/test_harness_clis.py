"""The harnesses themselves, as a user runs them: `codex exec`, `claude -p` and `openclaw agent exec`
(pinned in harnesses/package-lock.json; `make harnesses`), each through `CommandRollout` in the
terminal's sandbox with the gateway its only reachable address, a scripted policy answering.

For each: the episode is recorded (one step per model call, marked with the API the harness
spoke, the policy's tokens); the model's tool call ran in the sandbox (as uid 65534, in /work),
its output went back to the model in the harness's next request; and the reward is the task's
check of the files the harness left -- a wrong command leaves a wrong file and earns 0."""

import json
import os
from pathlib import Path

import pytest

import forge_bridge as fb
from forge_bridge.envs.in_sandbox import InSandbox
from forge_bridge.envs.sandbox import bwrap_problem
from forge_bridge.envs.tool import ToolTask
from forge_bridge.policies.models import tiny_tokenizer
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.serving import harnesses
from forge_bridge.serving.command_rollout import CommandRollout

ROOT = Path(__file__).resolve().parents[2]
INSTALL = (ROOT / "harnesses" / "node_modules").resolve()  # make harnesses may link it to /opt

pytestmark = [
    pytest.mark.skipif(not (INSTALL / ".installed").exists(), reason="the harnesses are not installed: make harnesses"),
    pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap here: {bwrap_problem()}"),
]

# each harness's shell tool, and the argument its command goes in
SHELL = {"codex": ("exec_command", "cmd"), "claude-code": ("Bash", "command"), "openclaw": ("exec", "command")}
RIGHT = "awk '{s += $1} END {print s}' numbers.txt > total.txt; id -u > uid.txt; pwd >> uid.txt"
WRONG = "echo 13 > total.txt; id -u > uid.txt; pwd >> uid.txt"


def expert(tool: str, key: str, command: str, calls: list):
    """The policy: the harness's shell tool once, then a final answer."""
    def script(messages, tools):
        calls.append((messages, [t["function"]["name"] for t in tools or []]))
        if any(m["role"] == "tool" for m in messages):
            return "total.txt holds the sum."
        return {"tool": tool, "args": {key: command}}
    return script


def sum_task(seen: list) -> ToolTask:
    def setup(terminal):
        terminal.write_file("numbers.txt", "3\n4\n5\n")

    def check(answer, terminal):
        seen.append({"answer": answer, "uid": terminal.read_file("uid.txt").split(),
                     "files": sorted(p.name for p in terminal.workdir.iterdir())})
        return terminal.read_file("total.txt").strip() == "12"
    return ToolTask("sum", "Write the sum of the numbers in numbers.txt to total.txt.", check=check, setup=setup)


def harness(name: str, config_dir: Path) -> harnesses.Harness:
    if name == "codex":
        return harnesses.codex()
    if name == "claude-code":
        return harnesses.claude_code()
    h = harnesses.openclaw(str(config_dir / "openclaw.json"))
    (config_dir / "openclaw.json").write_text(h.files["openclaw.json"])
    return h


@pytest.fixture
def config_dir():
    """A folder for a harness's config, where the sandbox's user can read it."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="forge-test-harness-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize("name", ["codex", "claude-code", "openclaw"])
def test_the_harness_does_a_task_in_the_sandbox_through_the_gateway(name, tmp_path, config_dir):
    h = harness(name, config_dir)
    tool, key = SHELL[name]
    sandbox = InSandbox(read_only=(str(INSTALL), str(config_dir)), path=(str(INSTALL / ".bin"),))
    recorder = fb.Recorder(tmp_path / "t.db", run_id=name)
    rewards, seen, calls = [], [], []
    for command in (RIGHT, WRONG):
        policy = ScriptedPolicy(expert(tool, key, command, calls), tiny_tokenizer())
        with CommandRollout(list(h.argv), policy, env=h.env, sandbox=sandbox, timeout_s=180) as rollout:
            with fb.episode("sum", recorder=recorder):
                rewards.append(rollout(sum_task(seen)))
    assert rewards == [1.0, 0.0]  # the reward is the check of the files the harness left
    assert seen[0]["uid"] == ["65534", "/work"]  # the model's command ran in the sandbox
    assert {"numbers.txt", "total.txt", "uid.txt"} <= set(seen[0]["files"])
    assert "total.txt holds the sum." in seen[0]["answer"]  # what the harness printed: the final answer
    first_messages, tools = calls[0]
    assert tool in tools and any("numbers.txt" in json.dumps(m["content"]) for m in first_messages)
    for traj in recorder.store.trajectories(run_id=name):
        assert traj.end_reason == "terminated" and len(traj) == 2
        use, answer = traj.transitions
        assert {use.info["api"], answer.info["api"]} == {h.api}
        assert use.has_tokens and answer.has_tokens and use.info["source"] == "gateway"
        (call,) = use.action.tool_calls
        assert call.name == tool and json.loads(call.arguments)[key] in (RIGHT, WRONG)
        # the harness ran it and sent its output back with the next request, filed on the step
        assert call.id in use.info["tool_results"]
        assert answer.action.content == "total.txt holds the sum." and not answer.action.tool_calls
    assert not (Path(os.getcwd()) / "total.txt").exists()


@pytest.mark.parametrize("harness, api, tool", [("codex", "responses", "exec_command"),
                                               ("claude-code", "messages", "Bash"),
                                               ("openclaw", "chat", "exec")])
def test_the_harness_example_runs_as_written(harness, api, tool, tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "harness_cli.py"), "--harness", harness], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "[sum] reward=1.0 status=complete steps=2"
    assert lines[1].startswith(f"  step 0 ({api}): ") and f"calls=['{tool}(" in lines[1]
    with fb.TrajectoryStore(tmp_path / "runs" / "examples" / "harnesses.db") as store:
        (traj,) = store.trajectories()
    assert traj.reward == 1.0 and [s.info["api"] for s in traj] == [api, api]
