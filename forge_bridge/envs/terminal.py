"""A terminal as an environment: a fresh temporary working directory per episode, and three
tools -- `run(command)`, `read_file(path)`, `write_file(path, content)`.

Commands run in a sandbox (`sandbox="bwrap"`, the default; see `forge_bridge.envs.sandbox`):
the working directory, seen as `/work`, is the only place they can write, the system is
read-only, the host's other files (the trainer's, the store, the adapters, home folders) are not
there, and there is no network unless `CommandLimits.network`; time, CPU, memory, file-size and
process limits apply (`forge_bridge.envs.confined`). Where bubblewrap cannot run, the
environment refuses to start unless `sandbox="none"` is passed explicitly, which warns what it
exposes and checks only the arguments that look like paths.

By default a command is split like a shell would (`shlex`) but run without one, so `;`, `|`,
`$(...)` and backticks in the model's text are plain arguments; `shell=True` hands the line to
`/bin/sh -c` inside the sandbox. The file tools resolve every path, symlinks included, inside
the working directory (`/work/x` and `x` name the same file).
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from forge_bridge.core.errors import InvalidArgument, WrongType
from forge_bridge.envs.confined import CommandLimits, run_confined
from forge_bridge.envs.sandbox import SANDBOX_WORKDIR, check_reachable, hand_over, require_sandbox
from forge_bridge.envs.tool import ToolEnvironment, ToolError, ToolTask, function_schema


class TerminalEnvironment(ToolEnvironment):
    """Shell-like tools over a per-episode working directory; the task's checker decides."""

    def __init__(self, limits: CommandLimits = CommandLimits(), *, sandbox: str = "bwrap", shell: bool = False,
                 root: str | None = None, keep_workdir: bool = False,
                 max_observation_chars: int = 8000) -> None:
        if not isinstance(limits, CommandLimits):
            raise WrongType(f"limits: expected a CommandLimits, got {type(limits).__name__}")
        require_sandbox(sandbox)  # SandboxUnavailable here, before any episode, not mid-run
        self.limits, self.sandbox, self.shell, self.root, self.keep_workdir = limits, sandbox, shell, root, keep_workdir
        self.workdir: Path | None = None
        self._handed_over = False
        self.commands: list[dict] = []
        super().__init__(max_observation_chars, tool_timeout_s=limits.timeout_s + 30)

    def tool_functions(self) -> dict[str, tuple[dict, Callable[..., Any]]]:
        how = "a shell line (sh -c)" if self.shell else "one command and its arguments (no shell: no pipes or redirection)"
        return {
            "run": (function_schema("run", f"Run {how} in the working directory; returns exit code, stdout and stderr.",
                                    {"command": {"type": "string"}}, ("command",)), self.run),
            "read_file": (function_schema("read_file", "Read a text file in the working directory.",
                                          {"path": {"type": "string"}}, ("path",)), self.read_file),
            "write_file": (function_schema("write_file", "Write a text file in the working directory.",
                                           {"path": {"type": "string"}, "content": {"type": "string"}},
                                           ("path", "content")), self.write_file),
        }

    # ------------------------------------------------------------------ episode
    def begin(self, task: ToolTask) -> None:
        self._remove_workdir()
        self.workdir = Path(tempfile.mkdtemp(prefix="forge-terminal-", dir=self.root)).resolve()
        if self.sandbox == "bwrap":
            try:  # refuse the episode now, not every command in it
                check_reachable(self.workdir)
            except InvalidArgument:
                self._remove_workdir()
                raise
        self.commands = []
        self._handed_over = False  # the task's setup may write files next

    def close(self) -> None:
        self._remove_workdir()

    def _remove_workdir(self) -> None:
        if self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None

    # ------------------------------------------------------------------ tools
    def inside(self, path: str) -> Path:
        """`path` resolved (symlinks too) inside the working directory, or a refusal."""
        if self.workdir is None:
            raise ToolError("no episode is running")
        if self.sandbox == "bwrap" and (path == SANDBOX_WORKDIR or path.startswith(SANDBOX_WORKDIR + "/")):
            path = path[len(SANDBOX_WORKDIR):].lstrip("/") or "."  # the name commands see it by
        target = (self.workdir / path).resolve()
        if target != self.workdir and self.workdir not in target.parents:
            raise ToolError(f"path {path!r} is outside the working directory")
        return target

    def run(self, command: str) -> tuple[str, dict]:
        if not command.strip():
            raise ToolError("empty command")
        if self.shell:
            argv = ["/bin/sh", "-c", command]
        else:
            try:
                argv = shlex.split(command)
            except ValueError as exc:
                raise ToolError(f"cannot split the command: {exc}") from None
        if self.sandbox == "none" and not self.shell:  # without a sandbox, a best effort on arguments
            for arg in argv[1:]:
                for part in (arg, arg.split("=", 1)[-1]):
                    if part.startswith(("/", "~")) or ".." in Path(part).parts:
                        self.inside(part.replace("~", str(self.workdir), 1) if part.startswith("~") else part)
        if self.workdir is None:
            raise ToolError("no episode is running")
        if not self._handed_over:  # files the task's setup or write_file made, to the sandbox user
            hand_over(self.workdir)
            self._handed_over = True
        result = run_confined(argv, self.workdir, self.limits, self.sandbox)
        record = {"exit_code": result.exit_code, "timed_out": result.timed_out,
                  "limit_hit": result.limit_hit, "stdout_bytes": result.stdout_bytes,
                  "stderr_bytes": result.stderr_bytes, "duration_s": round(result.duration_s, 3),
                  "confinement": result.confinement}
        self.commands.append({"command": command, **record})
        head = (f"timed out after {self.limits.timeout_s} s (killed)" if result.timed_out
                else f"exit code {result.exit_code}" + (f" ({result.limit_hit} limit)" if result.limit_hit else ""))
        text = f"{head}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        if result.exit_code is None or result.timed_out or result.limit_hit:
            raise ToolError(text, **record)
        return text, record

    def read_file(self, path: str) -> str:
        target = self.inside(path)
        if not target.is_file():
            raise ToolError(f"no such file: {path}")
        with open(target, "rb") as f:
            data = f.read(self.max_observation_chars + 1)
        return data.decode("utf-8", errors="replace")

    def write_file(self, path: str, content: str) -> str:
        target = self.inside(path)
        limit = self.limits.file_size_mb * 1024 * 1024
        if len(content.encode("utf-8")) > limit:
            raise ToolError(f"content larger than the file-size limit ({self.limits.file_size_mb} MiB)")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        self._handed_over = False
        assert self.workdir is not None  # inside() refused the call without one
        return f"wrote {len(content)} characters to {target.relative_to(self.workdir)}"


__all__ = ["CommandLimits", "TerminalEnvironment"]
