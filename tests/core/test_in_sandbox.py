"""An agent program in the terminal's sandbox (`CommandRollout(sandbox=InSandbox(...))`): its model
calls reach the gateway, and nothing else does; it sees the task's files and none of the trainer's
environment; the reward is the task's check over the files it left; a program that fails or hangs
is recorded as such. The program here is plain Python on the standard library, so this runs
wherever bubblewrap does (the real harnesses: tests/e2e/test_harness_clis.py)."""

import json
import os
import socket
import shutil
import tempfile
import textwrap
import threading

import pytest

import forge_bridge as fb
from forge_bridge.core.errors import AgentError, InvalidArgument
from forge_bridge.envs.in_sandbox import InSandbox
from forge_bridge.envs.relay import Relay
from forge_bridge.envs.sandbox import Bind, bwrap_problem
from forge_bridge.envs.tool import ToolTask
from forge_bridge.policies.models import tiny_tokenizer
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.serving.command_rollout import CommandRollout

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap here: {bwrap_problem()}")

# The agent: one chat completion at $OPENAI_BASE_URL, then what it can reach and see, into files.
AGENT = textwrap.dedent("""
    import json, os, socket, sys, urllib.request
    other = int(sys.argv[1])
    body = json.dumps({"model": "forge", "messages": [{"role": "user", "content": open("numbers.txt").read()}]})
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body.encode(), {
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["message"]["content"]
    open("total.txt", "w").write(answer)
    try:
        socket.create_connection(("127.0.0.1", other), timeout=5).close()
        reached = "reached"
    except OSError as exc:
        reached = type(exc).__name__
    json.dump({"other_port": reached, "env": sorted(os.environ), "home": os.environ["HOME"], "cwd": os.getcwd(),
               "uid": os.getuid()}, open("seen.json", "w"))
    print("wrote total.txt")
""")


def adder(messages, tools):
    return str(sum(int(x) for x in messages[-1]["content"].split()))


def task(expected: int, seen: list) -> ToolTask:
    def setup(terminal):
        terminal.write_file("numbers.txt", "3 4 5\n")

    def check(answer, terminal):
        seen.append(json.loads(terminal.read_file("seen.json")) | {"answer": answer})
        return terminal.read_file("total.txt").strip() == str(expected)
    return ToolTask(f"sum-{expected}", "Sum the numbers in numbers.txt into total.txt.", check=check, setup=setup)


@pytest.fixture
def program():
    """The agent's file, where the sandbox's user can reach it (pytest's tmp_path is private to
    its owner)."""
    folder = tempfile.mkdtemp(prefix="forge-test-agent-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "agent.py")
    with open(path, "w") as f:
        f.write(AGENT)
    yield path
    shutil.rmtree(folder)


@pytest.fixture
def other_server():
    """A server on the host's 127.0.0.1 that the sandboxed program must not reach."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


def test_the_program_reaches_the_gateway_only_and_its_files_give_the_reward(program, other_server, tmp_path,
                                                                            monkeypatch):
    port, accepted = other_server
    monkeypatch.setenv("TRAINER_SECRET", "s3cret")
    recorder = fb.Recorder(tmp_path / "t.db", run_id="sandboxed")
    policy = ScriptedPolicy(adder, tiny_tokenizer())
    sandbox = InSandbox(read_only=(os.path.dirname(program),), env={"GIVEN": "1"})
    seen: list = []
    with CommandRollout(["python3", program, str(port)], policy, sandbox=sandbox, timeout_s=60) as rollout:
        rewards = []
        for expected in (12, 13):
            with fb.episode(f"sum-{expected}", recorder=recorder):
                rewards.append(rollout(task(expected, seen)))
    assert rewards == [1.0, 0.0]  # the same files, two checks: the reward is the check's
    inside = seen[0]
    assert inside["answer"] == "wrote total.txt\n"
    assert inside["other_port"] == "ConnectionRefusedError" and not accepted  # the host's other port: unreachable
    assert inside["cwd"] == "/work" and inside["home"] == "/tmp" and inside["uid"] == 65534
    assert "TRAINER_SECRET" not in inside["env"] and "GIVEN" in inside["env"]
    assert {"OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"} <= set(inside["env"])
    stored = recorder.store.trajectories(run_id="sandboxed")
    assert len(stored) == 2 and all(len(t) == 1 and t.end_reason == "terminated" for t in stored)
    step = stored[0].transitions[0]
    assert step.info["api"] == "chat" and step.action.content == "12" and step.completion_token_ids
    assert step.observation.messages == [{"role": "user", "content": "3 4 5\n"}]


def test_a_failing_program_crashes_its_episode_and_a_hanging_one_is_truncated(tmp_path):
    recorder = fb.Recorder(tmp_path / "t.db", run_id="faults")
    policy = ScriptedPolicy(adder, tiny_tokenizer())
    never = ToolTask("t", "p", check=lambda answer, terminal: 1.0)
    with CommandRollout(["sh", "-c", "echo broken >&2; exit 3"], policy, sandbox=InSandbox()) as rollout:
        with pytest.raises(AgentError, match="exited with code 3: broken"):
            with fb.episode("t", recorder=recorder):
                rollout(never)
    with CommandRollout(["sleep", "60"], policy, sandbox=InSandbox(), timeout_s=1) as rollout:
        with fb.episode("t", recorder=recorder):
            assert rollout(never) == 0.0
    ends = sorted(t.end_reason for t in recorder.store.trajectories(run_id="faults"))
    assert ends == ["crashed", "truncated"]


def test_a_missing_program_and_a_task_that_is_not_a_tool_task_are_refused(tmp_path):
    recorder = fb.Recorder(tmp_path / "t.db", run_id="refused")
    policy = ScriptedPolicy(adder, tiny_tokenizer())
    with CommandRollout(["no-such-harness"], policy, sandbox=InSandbox()) as rollout:
        with pytest.raises(AgentError, match="code 127: relay: could not start 'no-such-harness'"):
            with fb.episode("t", recorder=recorder):
                rollout(ToolTask("t", "p", check=lambda answer, terminal: 1.0))
        with pytest.raises(fb.ForgeBridgeError, match="ToolTask"):
            with fb.episode("t", recorder=recorder):
                rollout({"prompt": "a dict"})
    if os.geteuid() == 0:  # pytest's tmp_path is closed to others: the sandbox's user could not bind it
        with CommandRollout(["true"], policy, sandbox=InSandbox(read_only=(str(tmp_path),))) as rollout:
            with pytest.raises(InvalidArgument, match=f"bound folder {tmp_path}: the sandbox user"):
                with fb.episode("t", recorder=recorder):
                    rollout(ToolTask("t", "p", check=lambda answer, terminal: 1.0))
    with pytest.raises(InvalidArgument, match="absolute paths"):
        InSandbox(read_only=("relative/dir",))
    with pytest.raises(InvalidArgument, match="working directory"):
        Bind("/usr", "/work/usr")
    with pytest.raises(InvalidArgument, match="rewarded by its task"):
        CommandRollout(["true"], policy, sandbox=InSandbox(), reward="exit_code")


def test_the_relay_carries_a_conversation_both_ways_with_a_half_close(tmp_path):
    echo = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = echo.accept()
        data = b""
        while chunk := conn.recv(4):
            data += chunk
        conn.sendall(data.upper())
        conn.close()
    threading.Thread(target=serve, daemon=True).start()
    path = str(tmp_path / "s.sock")
    with Relay(unix=path, tcp=echo.getsockname(), on_unix=True):
        client = socket.socket(socket.AF_UNIX)
        client.connect(path)
        client.sendall(b"hello relay")
        client.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := client.recv(1024):
            reply += chunk
    assert reply == b"HELLO RELAY"
