"""TerminalEnvironment: tasks solved through its tools pass their checker; escapes, runaway
commands and floods of output are contained and recorded."""

import json
import os
import socket

import pytest

from forge_bridge.core.types import Action, ToolCall
from forge_bridge.envs.confined import CommandLimits, network_isolation_prefix, run_confined
from forge_bridge.envs.terminal import TerminalEnvironment
from forge_bridge.envs.tool import ToolTask


def call(name: str, **args) -> Action:
    return Action(tool_calls=[ToolCall(id=f"c-{name}", name=name, arguments=json.dumps(args))])


def result_of(env: TerminalEnvironment, action: Action) -> dict:
    step = env.step(action)
    assert not step.done
    (outcome,) = step.info["tool_results"].values()
    assert step.observation[0]["content"] == outcome["content"]  # what the model sees is what is recorded
    return outcome


def greeting_task() -> ToolTask:
    def check(answer: str, env: TerminalEnvironment) -> bool:
        path = env.workdir / "hello.txt"
        return path.is_file() and path.read_text().strip() == "hello"

    return ToolTask("greet", "Create hello.txt containing 'hello'.", check=check)


def test_a_task_done_through_the_tools_passes_its_checker():
    with TerminalEnvironment() as env:
        first = env.reset(greeting_task())
        assert first == [{"role": "user", "content": "Create hello.txt containing 'hello'."}]
        assert result_of(env, call("write_file", path="hello.txt", content="hello\n"))["status"] == "success"
        listed = result_of(env, call("run", command="ls -1"))
        assert listed["exit_code"] == 0 and "hello.txt" in listed["content"]
        assert "hello" in result_of(env, call("read_file", path="hello.txt"))["content"]
        end = env.step(Action(content="Done."))
        assert end.terminated and end.reward == 1.0


def test_each_episode_gets_a_fresh_working_directory_removed_at_the_end():
    env = TerminalEnvironment()
    env.reset(greeting_task())
    first = env.workdir
    env.step(call("write_file", path="hello.txt", content="hello"))
    env.reset(greeting_task())
    assert env.workdir != first and not first.exists()
    assert list(env.workdir.iterdir()) == []
    assert env.step(Action(content="done")).reward == 0.0  # nothing written this episode
    second = env.workdir
    env.close()
    assert not second.exists()


@pytest.mark.parametrize("sandbox,args", [
    ("bwrap", {"name": "read_file", "path": "../../etc/passwd"}),
    ("bwrap", {"name": "read_file", "path": "/etc/passwd"}),
    ("bwrap", {"name": "read_file", "path": "/work/../etc/passwd"}),
    ("bwrap", {"name": "write_file", "path": "../escaped.txt", "content": "x"}),
    # without a sandbox, the arguments that look like paths are checked before anything runs
    ("none", {"name": "run", "command": "cat /etc/passwd"}),
    ("none", {"name": "run", "command": "ls ../"}),
    ("none", {"name": "run", "command": "cp x --target-directory=/tmp"}),
])
@pytest.mark.filterwarnings("ignore:sandbox='none'")
def test_paths_outside_the_working_directory_are_refused_and_recorded(sandbox, args, tmp_path):
    # the sandbox user must reach the working directory: under the system's temporary folder then
    with TerminalEnvironment(sandbox=sandbox, root=str(tmp_path) if sandbox == "none" else None) as env:
        env.reset(greeting_task())
        name = args.pop("name")
        outcome = result_of(env, call(name, **args))
        assert outcome["status"] == "error" and "outside the working directory" in outcome["error"]
        assert not (env.workdir.parent / "escaped.txt").exists()
        assert "exit_code" not in outcome  # refused before anything ran


def test_a_symlink_out_of_the_working_directory_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    with TerminalEnvironment() as env:
        env.reset(greeting_task())
        os.symlink(secret, env.workdir / "link")
        outcome = result_of(env, call("read_file", path="link"))
        assert outcome["status"] == "error" and "s3cret" not in outcome["content"]


def test_shell_syntax_is_not_interpreted_without_shell():
    with TerminalEnvironment() as env:
        env.reset(greeting_task())
        outcome = result_of(env, call("run", command="echo hi; touch pwned $(touch pwned2) `touch pwned3`"))
        assert outcome["exit_code"] == 0
        assert "hi; touch pwned" in outcome["content"]  # echo printed the text, no shell ran it
        assert list(env.workdir.iterdir()) == []


def test_a_command_past_its_time_limit_is_killed_and_recorded():
    with TerminalEnvironment(CommandLimits(timeout_s=1.0)) as env:
        env.reset(greeting_task())
        outcome = result_of(env, call("run", command="sleep 30"))
        assert outcome["status"] == "error" and outcome["timed_out"] and outcome["limit_hit"] == "timeout"
        assert outcome["duration_s"] < 10


def test_megabytes_of_output_are_cut_and_the_size_recorded():
    with TerminalEnvironment(CommandLimits(max_output_bytes=2000)) as env:
        env.reset(greeting_task())
        outcome = result_of(env, call("run", command="seq 1 1000000"))
        assert outcome["stdout_bytes"] == sum(len(str(i)) + 1 for i in range(1, 1_000_001))
        assert len(outcome["content"]) < 2500 and "output cut" in outcome["content"]


def test_output_that_is_not_utf8_is_observed_with_replacement_characters():
    with TerminalEnvironment() as env:
        env.reset(greeting_task())
        (env.workdir / "bin.dat").write_bytes(b"ok \xff\xfe end")
        outcome = result_of(env, call("run", command="cat bin.dat"))
        assert "ok \ufffd\ufffd end" in outcome["content"]


def test_the_file_size_limit_stops_a_runaway_writer(workdir):
    limits = CommandLimits(file_size_mb=1, timeout_s=20)
    result = run_confined(["sh", "-c", "yes > big.txt"], workdir, limits)
    assert "rlimits" in result.confinement
    assert result.limit_hit == "file size"
    assert (workdir / "big.txt").stat().st_size <= 1024 * 1024


@pytest.mark.filterwarnings("ignore:sandbox='none'")
@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_commands_get_no_network_unless_asked(sandbox, workdir):
    if sandbox == "none" and not network_isolation_prefix():
        pytest.skip("this OS permits no network namespace (unshare); the command would run with network")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    confined = run_confined(["python3", "-c", probe], workdir, CommandLimits(), sandbox)
    assert "no-network" in confined.confinement and confined.exit_code != 0 and "connected" not in confined.stdout
    allowed = run_confined(["python3", "-c", probe], workdir, CommandLimits(network=True), sandbox)
    assert allowed.exit_code == 0 and "connected" in allowed.stdout  # the probe itself works
    server.close()


@pytest.mark.filterwarnings("ignore:sandbox='none'")
@pytest.mark.parametrize("sandbox,home", [("bwrap", "/work"), ("none", None)])
def test_secrets_in_the_trainers_environment_do_not_reach_commands(sandbox, home, monkeypatch, workdir):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    result = run_confined(["env"], workdir, CommandLimits(), sandbox)
    assert "sk-secret" not in result.stdout and f"HOME={home or workdir.resolve()}" in result.stdout


def test_tool_faults_become_error_observations():
    with TerminalEnvironment() as env:
        env.reset(greeting_task())
        for action, expected in [
            (call("rm_rf", path="."), "unknown tool 'rm_rf'"),
            (Action(tool_calls=[ToolCall(id="x", name="run", arguments="{not json")]), "not valid JSON"),
            (call("run", command=42), "argument 'command' must be string"),
            (call("run"), "missing argument(s) command"),
            (call("read_file", path="missing.txt"), "no such file"),
        ]:
            outcome = result_of(env, action)
            assert outcome["status"] == "error" and expected in outcome["content"], outcome


def test_a_missing_program_is_an_observed_exit_code_not_a_crash():
    with TerminalEnvironment() as env:
        env.reset(greeting_task())
        outcome = result_of(env, call("run", command="no-such-program-xyz --flag"))
        assert outcome["exit_code"] == 127 and "no-such-program-xyz" in outcome["content"]


def test_bad_limits_and_tasks_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="CommandLimits.timeout_s"):
        CommandLimits(timeout_s=0)
    with pytest.raises(ValueError, match="CommandLimits.memory_mb"):
        CommandLimits(memory_mb="lots")
    with pytest.raises(ValueError, match="ToolTask.check"):
        ToolTask("t", "p", check="yes")
    with TerminalEnvironment() as env:
        with pytest.raises(TypeError, match="ToolTask"):
            env.reset({"prompt": "x"})


def test_a_checker_that_raises_or_returns_nan_is_a_clear_error():
    with TerminalEnvironment() as env:
        env.reset(ToolTask("t", "p", check=lambda a, e: 1 / 0))
        with pytest.raises(ValueError, match="checker of task 't' raised ZeroDivisionError"):
            env.step(Action(content="done"))
        env.reset(ToolTask("t", "p", check=lambda a, e: float("nan")))
        with pytest.raises(ValueError, match="finite number"):
            env.step(Action(content="done"))


def test_cpu_and_memory_limits_stop_a_hog(workdir):
    spin = run_confined(["python3", "-c", "while True: pass"], workdir, CommandLimits(cpu_s=1, timeout_s=30))
    assert spin.limit_hit == "cpu" and spin.duration_s < 15
    hog = run_confined(["python3", "-c", "x = bytearray(4_000_000_000)"], workdir, CommandLimits(memory_mb=256))
    assert hog.exit_code != 0 and "MemoryError" in hog.stderr
