"""Run one command confined: in a sandbox (`forge_bridge.envs.sandbox`: bubblewrap namespaces,
the working directory the only writable place), with a wall-clock limit and CPU / memory /
file-size / process limits, no network unless asked, no shell unless asked for.

Limits are applied by util-linux's `prlimit`, placed in front of the sandbox, so no Python runs
in the child between fork and exec (a `preexec_fn` can deadlock in a threaded trainer). The
result lists which confinements applied. Output goes to files outside the working directory,
capped by the file-size limit, and only the first `max_output_bytes` are read back: a command
that prints gigabytes costs neither memory nor the run.

`sandbox="none"` skips the sandbox (after a warning saying what that exposes): the limits and,
where `unshare -n` is permitted, the network cut still apply.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.envs.sandbox import (
    Bind,
    bwrap_argv,
    check_reachable,
    command_environment,
    hand_over,
    privilege_drop_prefix,
    processes_allowed,
    require_sandbox,
)


@dataclass(frozen=True)
class CommandLimits:
    """What one command may use."""

    timeout_s: float = 10.0
    """Wall-clock limit; the whole process group is killed when it passes."""
    cpu_s: int = 10
    """CPU-seconds limit (RLIMIT_CPU)."""
    memory_mb: int = 1024
    """Address-space limit in MiB (RLIMIT_AS)."""
    file_size_mb: int = 16
    """Largest file the command may write, its captured output included (RLIMIT_FSIZE)."""
    open_files: int = 256
    """Open file descriptors (RLIMIT_NOFILE)."""
    max_output_bytes: int = 8000
    """Bytes of stdout and of stderr read back into the observation."""
    processes: int = 64
    """Processes and threads the command may start (RLIMIT_NPROC; enforced in the sandbox)."""
    tmp_mb: int = 64
    """Size of the sandbox's private /tmp (a tmpfs, so it counts against memory)."""
    network: bool = False
    """Allow network access (False: an empty network namespace). True shares the host's network
    namespace: the command can then reach services on the host's 127.0.0.1 (a vLLM server, the
    gateway, the inspector) and abstract Unix sockets; grant it only to commands you trust that far."""

    def __post_init__(self) -> None:
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise InvalidArgument(f"CommandLimits.timeout_s: expected a number > 0, got {self.timeout_s!r}")
        for name in ("cpu_s", "memory_mb", "file_size_mb", "open_files", "max_output_bytes", "processes", "tmp_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"CommandLimits.{name}: expected an int >= 1, got {value!r}")
        if not isinstance(self.network, bool):
            raise InvalidArgument(f"CommandLimits.network: expected a bool, got {self.network!r}")


@dataclass
class CommandResult:
    """What a confined command did."""

    exit_code: int | None
    """The exit status; negative: killed by that signal; None: never started."""
    stdout: str
    stderr: str
    stdout_bytes: int
    """Bytes the command wrote to stdout (the observation holds at most max_output_bytes)."""
    stderr_bytes: int
    timed_out: bool
    duration_s: float
    confinement: list[str] = field(default_factory=list)
    """Which confinements applied: 'timeout', 'rlimits', 'nproc', 'sandbox-fs' (bubblewrap: only
    the working directory writable, the host's files unseen), 'pid-namespace', 'unprivileged'
    (uid 65534, no capabilities), 'no-network'."""

    @property
    def limit_hit(self) -> str | None:
        """Which limit ended the command, if one did."""
        if self.timed_out:
            return "timeout"
        # a signal kills the command (-N), or a shell reports its child's death (128 + N)
        by_signal: dict[int, str] = {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file size", signal.SIGKILL: "killed"}
        code = self.exit_code or 0
        return by_signal.get(-code) or by_signal.get(code - 128)


@functools.lru_cache(maxsize=None)
def network_isolation_prefix() -> tuple[str, ...]:
    """`unshare` arguments that give the command an empty network namespace, or () where the
    OS does not allow one (no util-linux, no user namespaces)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for flags in (["-n"], ["-r", "-n"]):
        try:
            probe = subprocess.run([unshare, *flags, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return (unshare, *flags, "--")
    return ()


def rlimit_prefix(limits: CommandLimits, nproc: int | None = None) -> tuple[str, ...]:
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return ()
    mib = 1024 * 1024
    return (prlimit, f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",  # SIGXCPU first, then KILL
            f"--as={limits.memory_mb * mib}", f"--fsize={limits.file_size_mb * mib}",
            f"--nofile={limits.open_files}", "--core=0", *([f"--nproc={nproc}"] if nproc else []), "--")


def _read_head(path: Path, limit: int) -> tuple[str, int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(limit)
    text = head.decode("utf-8", errors="replace")
    if size > limit:
        text += f"\n[... output cut: {size} bytes in all, first {limit} shown]"
    return text, size


def _confinement(workdir: Path, limits: CommandLimits, sandbox: str,
                 binds: Sequence[Bind]) -> tuple[tuple[str, ...], dict[str, str], list[str]]:
    """The argv prefix, the environment and the names of the confinements that apply."""
    confinement = ["timeout"]
    if sandbox == "bwrap":
        prefix: tuple[str, ...] = rlimit_prefix(limits, processes_allowed(limits.processes))
        confinement += ["rlimits", "nproc"] if prefix else []
        check_reachable(workdir)
        for bind in binds:
            check_reachable(Path(bind.host), "bound folder")
        hand_over(workdir, recursive=False)
        prefix += privilege_drop_prefix() + tuple(bwrap_argv(workdir, network=limits.network, tmp_mb=limits.tmp_mb,
                                                             binds=binds))
        confinement += ["sandbox-fs", "pid-namespace", "unprivileged"] + ([] if limits.network else ["no-network"])
        return prefix, command_environment(), confinement
    if binds:
        raise InvalidArgument("binds: only the bubblewrap sandbox binds folders (sandbox='none' sees the host's)")
    prefix = rlimit_prefix(limits)
    confinement += ["rlimits"] if prefix else []
    if not limits.network:
        net = network_isolation_prefix()
        confinement += ["no-network"] if net else []
        prefix += net
    return prefix, command_environment(home=str(workdir), tmp=str(workdir)), confinement


def run_confined(argv: list[str], workdir: str | os.PathLike, limits: CommandLimits,
                 sandbox: str = "bwrap", *, env: Mapping[str, str] | None = None,
                 binds: Sequence[Bind] = ()) -> CommandResult:
    """Run `argv` (no shell) in `workdir` under `limits`, inside `sandbox` ("bwrap" or "none").
    `env`: variables on top of the minimal environment; `binds`: host folders the command sees
    (bubblewrap only).

    In the sandbox the working directory is `/work`. As root, the command runs as uid 65534:
    `workdir` is handed to that user, files the caller put in it are not (see
    `sandbox.hand_over`). Raises `SandboxUnavailable` when bubblewrap cannot run here."""
    if not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidArgument(f"argv: expected a non-empty list of strings, got {argv!r}")
    require_sandbox(sandbox)
    workdir = Path(workdir).resolve()
    prefix, environment, confinement = _confinement(workdir, limits, sandbox, binds)
    environment.update(env or {})
    with tempfile.TemporaryDirectory(prefix="forge-cmd-") as capture:
        out_path, err_path = Path(capture) / "stdout", Path(capture) / "stderr"
        t0 = time.perf_counter()
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen([*prefix, *argv], cwd=workdir, env=environment,
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        start_new_session=True)
            except OSError as exc:
                return CommandResult(None, "", f"could not start {argv[0]!r}: {exc.strerror or exc}",
                                     0, 0, False, time.perf_counter() - t0, confinement)
            try:
                code = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):  # it may have ended as the timer fired
                    os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
        duration = time.perf_counter() - t0
        stdout, out_bytes = _read_head(out_path, limits.max_output_bytes)
        stderr, err_bytes = _read_head(err_path, limits.max_output_bytes)
    if sandbox == "bwrap" and code == 1 and stderr.startswith("bwrap: execvp "):
        code = 127  # the program does not exist: the exit code a shell gives, with or without the sandbox
    return CommandResult(code, stdout, stderr, out_bytes, err_bytes, timed_out, duration, confinement)



__all__ = ["CommandLimits", "CommandResult", "network_isolation_prefix", "run_confined"]
