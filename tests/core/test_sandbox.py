"""The terminal's sandbox (bubblewrap): commands a model writes cannot read or write outside their
working directory, reach the trainer's machine, or outlive their time. Each escape names the
layer that stopped it; `sandbox="none"` shows the same command succeeding without it."""

import json
import os
import socket
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from forge_bridge.core.errors import InvalidArgument, SandboxUnavailable
from forge_bridge.core.types import Action, ToolCall
from forge_bridge.envs import sandbox as sandbox_module
from forge_bridge.envs.confined import CommandLimits, run_confined
from forge_bridge.envs.terminal import TerminalEnvironment
from forge_bridge.envs.tool import ToolTask

HOST_PASSWD = Path("/etc/passwd").read_text()


@pytest.fixture
def trainer_files(tmp_path):
    """What a training run keeps beside its environments: a store, adapters, a secret."""
    (tmp_path / "adapters" / "v3").mkdir(parents=True)
    (tmp_path / "adapters" / "v3" / "adapter_model.safetensors").write_bytes(b"weights")
    (tmp_path / "store.db").write_text("trajectories")
    (tmp_path / "secret.txt").write_text("s3cret-token")
    return tmp_path


def run(argv, workdir, sandbox="bwrap", **limits):
    return run_confined(argv, workdir, CommandLimits(**limits), sandbox)


def test_reading_the_hosts_passwd_through_an_interpreter_sees_only_the_sandboxs(workdir):
    # layer: sandbox-fs (only a synthetic one-user /etc/passwd is bound)
    for argv in (["python3", "-c", "print(open('/etc/passwd').read())"],
                 ["sh", "-c", "cat /etc/passwd /etc/shadow"]):
        result = run(argv, workdir)
        assert "sandbox-fs" in result.confinement
        assert HOST_PASSWD not in result.stdout and "sandbox:x:65534" in result.stdout
        assert "root:x:0:0:root:/root" not in result.stdout
    with pytest.warns(RuntimeWarning, match="whole file system"):  # today's behaviour without it
        exposed = run(["python3", "-c", "print(open('/etc/passwd').read())"], workdir, "none")
    assert HOST_PASSWD in exposed.stdout


def test_the_trainers_store_adapters_and_home_are_not_there(workdir, trainer_files):
    # layer: sandbox-fs (nothing of the host is bound but /usr, a few /etc files and /work)
    found = run(["find", "/", "-name", "store.db", "-o", "-name", "*.safetensors", "-o", "-name", "secret.txt"],
                workdir)
    assert found.stdout == ""
    for path in (trainer_files / "store.db", trainer_files / "adapters", trainer_files / "secret.txt",
                 Path.home(), Path("/root"), Path(os.getcwd())):
        listed = run(["sh", "-c", f"ls {path} && cat {path}"], workdir)
        assert listed.exit_code != 0 and "No such file or directory" in listed.stderr, path
        assert "s3cret" not in listed.stdout and "trajectories" not in listed.stdout
    with pytest.warns(RuntimeWarning):
        exposed = run(["sh", "-c", f"cat {trainer_files / 'secret.txt'}"], workdir, "none")
    assert "s3cret-token" in exposed.stdout


@pytest.mark.parametrize("target", ["/usr/pwned", "/etc/pwned", "/pwned", "/bin/pwned"])
def test_writing_outside_the_working_directory_is_refused(workdir, target):
    # layer: sandbox-fs (the system is bound read-only, the sandbox's root remounted read-only)
    result = run(["sh", "-c", f"echo x > {target}"], workdir)
    assert result.exit_code != 0 and "Read-only file system" in result.stderr
    assert not Path(target).exists()


def test_writing_into_the_hosts_folders_by_their_real_path_is_refused(workdir, trainer_files):
    result = run(["python3", "-c", f"open('{trainer_files}/store.db', 'w').write('gone')"], workdir)
    assert result.exit_code != 0 and "No such file or directory" in result.stderr
    assert (trainer_files / "store.db").read_text() == "trajectories"


def test_the_working_directory_is_writable_at_work_and_tmp_is_private(workdir):
    result = run(["sh", "-c", "pwd; echo hi > note.txt; echo t > /tmp/t; cat /work/note.txt"], workdir)
    assert result.exit_code == 0 and result.stdout.split() == ["/work", "hi"]
    assert (workdir / "note.txt").read_text() == "hi\n"
    assert not Path("/tmp/t").exists() or Path("/tmp/t").read_text() != "t\n"


def test_a_port_on_the_hosts_loopback_cannot_be_reached(workdir):
    # layer: no-network (a new network namespace: its 127.0.0.1 is the sandbox's own)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    result = run(["python3", "-c", probe], workdir)
    server.close()
    assert "no-network" in result.confinement and "connected" not in result.stdout
    assert "ConnectionRefusedError" in result.stderr


def test_a_fork_bomb_is_bounded_and_the_trainer_keeps_running(workdir):
    # layer: nproc (RLIMIT_NPROC for the sandbox user) and the PID namespace
    t0 = time.perf_counter()
    # The shell then waits on builtins only (about 0.2 s of CPU here): an external `sleep` would need
    # a fork of its own while the bomb holds every slot, and dash exits when a fork fails.
    busy = "i=0; while [ $i -lt 300000 ]; do i=$((i + 1)); done"
    result = run(["sh", "-c", f"f(){{ f|f& }}; f; {busy}; echo survived"], workdir, processes=32, timeout_s=20)
    assert "nproc" in result.confinement and "Cannot fork" in result.stderr
    assert "survived" in result.stdout and time.perf_counter() - t0 < 15
    assert subprocess.run(["true"]).returncode == 0  # this process can still fork


def test_processes_left_behind_die_with_the_command(workdir):
    # layer: pid-namespace (its init ends with the command; the kernel kills the rest)
    marker = "4242.5"
    result = run(["sh", "-c", f"setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & echo started"],
                 workdir)
    assert result.exit_code == 0 and "pid-namespace" in result.confinement
    deadline = time.monotonic() + 10  # the kernel kills them as the namespace's init ends: wait for that
    while (left := subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == ""  # they sleep for an hour: still there after 10 s, they escaped


def test_the_command_sees_only_its_own_processes_and_has_no_privileges(workdir):
    # layers: pid-namespace, unprivileged (uid 65534, no capabilities, no new user namespaces)
    result = run(["sh", "-c", "ls /proc | grep -c '^[0-9]'; id -u; grep CapEff /proc/self/status; "
                              "mount -o remount,rw /usr; unshare -r true"], workdir)
    count, uid, caps = result.stdout.split("\n")[:3]
    assert int(count) < 10  # the trainer's machine runs hundreds; the sandbox sees sh, ls and its init
    assert uid == "65534" and caps.split()[-1] == "0000000000000000"
    assert "must be superuser" in result.stderr or "Permission denied" in result.stderr
    assert "unshare failed" in result.stderr or "Operation not permitted" in result.stderr


def test_huge_outputs_and_a_full_tmp_are_bounded(workdir):
    # layers: rlimits (file size, output capture) and the size-capped /tmp
    flood = run(["sh", "-c", "yes | head -c 200000000"], workdir, max_output_bytes=1000, file_size_mb=4)
    assert flood.limit_hit == "file size" and len(flood.stdout) < 1200
    full = run(["sh", "-c", "head -c 50000000 /dev/zero > /tmp/big"], workdir, tmp_mb=8, file_size_mb=100)
    assert full.exit_code != 0 and "No space left on device" in full.stderr


def test_shell_mode_inside_the_sandbox_is_still_confined():
    task = ToolTask("t", "p", check=lambda answer, env: True)
    with TerminalEnvironment(shell=True) as env:
        env.reset(task)
        step = env.step(Action(tool_calls=[ToolCall(id="c", name="run", arguments=json.dumps(
            {"command": "cat /etc/passwd | head -1 > first.txt; echo done > /usr/x"}))]))
        (outcome,) = step.info["tool_results"].values()
        assert (env.workdir / "first.txt").read_text().startswith("root:x:0:0:root:/nonexistent")
        assert "Read-only file system" in outcome["content"]


def test_files_the_trainer_writes_can_be_changed_by_the_command():
    task = ToolTask("t", "p", check=lambda answer, env: True,
                    setup=lambda env: (env.workdir / "seed.txt").write_text("one\n"))
    with TerminalEnvironment(shell=True) as env:
        env.reset(task)
        env.step(Action(tool_calls=[ToolCall(id="w", name="write_file", arguments=json.dumps(
            {"path": "/work/sub/new.txt", "content": "two\n"}))]))
        step = env.step(Action(tool_calls=[ToolCall(id="r", name="run", arguments=json.dumps(
            {"command": "echo more >> seed.txt && echo more >> sub/new.txt && cat seed.txt sub/new.txt"}))]))
        (outcome,) = step.info["tool_results"].values()
        assert outcome["status"] == "success" and outcome["content"].count("more") == 2


def test_without_bubblewrap_the_terminal_refuses_unless_told_none(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox_module.bwrap_problem.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap .* not installed.*sandbox='none'"):
            TerminalEnvironment()
        with pytest.warns(RuntimeWarning, match="see its whole file system"):
            TerminalEnvironment(sandbox="none").close()
    finally:
        monkeypatch.undo()
        sandbox_module.bwrap_problem.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the sandbox itself warns nothing
        TerminalEnvironment().close()


def test_bad_sandbox_names_and_unreachable_workdirs_are_clear_errors(tmp_path):
    with pytest.raises(InvalidArgument, match="sandbox: expected one of"):
        TerminalEnvironment(sandbox="docker")
    with pytest.raises(InvalidArgument, match="processes"):
        CommandLimits(processes=0)
    if os.geteuid() == 0:  # pytest's tmp_path is closed to other users: the sandbox user cannot bind it
        with pytest.raises(InvalidArgument, match="cannot reach it"):
            run(["true"], tmp_path / "")
        with TerminalEnvironment(root=str(tmp_path)) as env:  # refused at reset, not command by command
            with pytest.raises(InvalidArgument, match="cannot reach it"):
                env.reset(ToolTask("t", "p", check=lambda answer, env: True))
            assert list(tmp_path.iterdir()) == []
