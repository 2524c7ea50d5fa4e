"""An agent program (a harness such as Codex or Claude Code) run for one task in the terminal
environment's sandbox, with only the gateway reachable; the task's checker reads its files.

`InSandbox(...)` is what `CommandRollout(cmd, policy, sandbox=InSandbox(...))` runs its command
in, once per rollout:

- a `TerminalEnvironment` episode: a fresh working directory (`/work` inside), the task's
  `setup` writing its files there, and, at the end, the task's `check(answer, terminal)` over
  what the program left (`terminal.read_file(...)`), the answer being its standard output;
- the program confined as every terminal command is (bubblewrap: the system read-only, the
  working directory the only writable place, uid 65534, a PID namespace, its limits), its
  install folders (`read_only`) bound read-only at their own paths, `HOME` the sandbox's
  private `/tmp`, and the environment only what the caller gives (no secrets of the trainer's);
- no network but the gateway: the sandbox's network namespace is empty; a relay
  (`forge_bridge.envs.relay`) listens on the sandbox's own 127.0.0.1 at the gateway's port and
  carries each connection through a Unix socket to the gateway, so the episode's URL is the
  same inside as outside and every other address is unreachable.

The model's tool calls run as the harness runs them (its shell, its file edits), inside the same
sandbox. With `sandbox="none"` (after its warning) the program runs unconfined but for the limits,
with the host's network, and reaches the gateway directly.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from forge_bridge.core.errors import InvalidArgument, WrongType
from forge_bridge.core.types import Action
from forge_bridge.envs import relay
from forge_bridge.envs.confined import CommandLimits, CommandResult, run_confined
from forge_bridge.envs.sandbox import Bind, check_sandbox, hand_over
from forge_bridge.envs.terminal import TerminalEnvironment
from forge_bridge.envs.tool import ToolTask

PROGRAM_LIMITS = CommandLimits(timeout_s=300.0, cpu_s=600, memory_mb=1 << 20, file_size_mb=256, open_files=4096,
                               max_output_bytes=65536, processes=512, tmp_mb=512)
"""Limits for a whole agent program: minutes, not seconds; a JavaScript runtime's address space
(V8 and JavaScriptCore reserve far more than they use, so the memory limit is not what bounds
them); hundreds of threads; a /tmp that holds the harness's own state."""
RELAY_DIR = "/run/forge"
"""Where the relay script and the gateway's socket appear inside the sandbox."""
SANDBOX_HOME = "/tmp"


@dataclass(frozen=True)
class ProgramRun:
    """What one run of the program did, and what the task's checker made of it."""

    result: CommandResult
    reward: float | None
    """The checker's reward; None when the program failed (timed out, exited non-zero)."""
    workdir: str | None
    """The working directory, when kept (`keep_workdir`)."""


@dataclass(frozen=True)
class InSandbox:
    """How an agent program runs: its limits, the host folders it needs, the sandbox."""

    limits: CommandLimits = PROGRAM_LIMITS
    read_only: tuple[str, ...] = ()
    """Host folders the program needs (its install: an npm prefix, a virtual environment), bound
    read-only at the same paths. A global npm install under /usr needs none."""
    path: tuple[str, ...] = ()
    """Folders put first on PATH inside (the install's `node_modules/.bin`)."""
    sandbox: str = "bwrap"
    root: str | None = None
    """Where working directories are made (default: the system's temporary folder)."""
    keep_workdir: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the program always gets (on top of PATH, HOME, the gateway's URL and token)."""

    def __post_init__(self) -> None:
        if not isinstance(self.limits, CommandLimits):
            raise WrongType(f"InSandbox.limits: expected a CommandLimits, got {type(self.limits).__name__}")
        check_sandbox(self.sandbox)
        for name in ("read_only", "path"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(p, str) and p.startswith("/") for p in value):
                raise InvalidArgument(f"InSandbox.{name}: expected a tuple of absolute paths, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))  # read-only, as the rest

    def run(self, task: ToolTask, argv: list[str], env: Mapping[str, str], gateway: tuple[str, int],
            timeout_s: float | None = None) -> ProgramRun:
        """Run `argv` for `task` with `env` (the gateway's URL and token among it), the gateway
        listening at `gateway` (host, port) on this machine, within `timeout_s` (default: the
        limits')."""
        if not isinstance(task, ToolTask):
            raise WrongType(f"a sandboxed program's task is a ToolTask (prompt, setup, check), got "
                            f"{type(task).__name__}")
        limits = self.limits if timeout_s is None else replace(self.limits, timeout_s=timeout_s)
        terminal = TerminalEnvironment(limits, sandbox=self.sandbox, root=self.root, keep_workdir=self.keep_workdir)
        try:
            terminal.reset(task)  # the working directory, and the task's files in it
            assert terminal.workdir is not None  # reset made it
            hand_over(terminal.workdir)
            environment = {**self.env, **env, "HOME": SANDBOX_HOME,
                           "PATH": ":".join([*self.path, "/usr/local/bin", "/usr/bin", "/bin"])}
            result = self._run(argv, terminal.workdir, environment, gateway, limits)
            reward = None
            if result.exit_code == 0 and not result.timed_out:
                reward = terminal.step(Action(content=result.stdout)).reward
            return ProgramRun(result, reward, str(terminal.workdir) if self.keep_workdir else None)
        finally:
            terminal.close()

    def _run(self, argv: list[str], workdir: Path, env: dict[str, str], gateway: tuple[str, int],
             limits: CommandLimits) -> CommandResult:
        if self.sandbox == "none":  # the host's network: the gateway directly
            return run_confined(argv, workdir, replace(limits, network=True), "none", env=env)
        python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        if python is None:
            raise InvalidArgument("a sandboxed program reaches the gateway through a relay run by the system's "
                                  "python3 (under /usr), which is missing")
        # the relay's script and socket in a folder of their own, read-only inside (a socket on a
        # read-only mount still takes connections), reachable wherever forge_bridge is installed
        with tempfile.TemporaryDirectory(prefix="forge-relay-", dir=self.root) as folder:
            os.chmod(folder, 0o755)
            shutil.copyfile(relay.__file__, os.path.join(folder, "relay.py"))
            binds = [Bind(folder, RELAY_DIR), *(Bind(p, p) for p in self.read_only)]
            inside = [python, f"{RELAY_DIR}/relay.py", "--port", str(gateway[1]), "--socket",
                      f"{RELAY_DIR}/gateway.sock", "--", *argv]
            with relay.Relay(unix=os.path.join(folder, "gateway.sock"), tcp=gateway, on_unix=True):
                return run_confined(inside, workdir, limits, "bwrap", env=env, binds=binds)


__all__ = ["PROGRAM_LIMITS", "InSandbox", "ProgramRun"]
