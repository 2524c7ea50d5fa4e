"""A terminal as an environment: a fresh temporary working directory per episode, and three
tools -- `run(command)`, `read_file(path)`, `write_file(path, content)`.

Commands run confined (`forge_bridge.envs.confined`): inside the working directory, with a time
limit, CPU / memory / file-size limits and no network where the OS allows it. By default a
command is split like a shell would (`shlex`) but run without one, so `;`, `|`, `$(...)` and
backticks in the model's text are plain arguments, not shell syntax; arguments that name a path
outside the working directory are refused before anything runs. `shell=True` hands the line to
`/bin/sh -c` instead (pipes work; the process limits and the network cut still apply, the
path check cannot). The file tools resolve every path, symlinks included, inside the working
directory. None of this is a full file-system sandbox: for untrusted code at scale, run the
trainer in a container.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from forge_bridge.core.errors import WrongType
from forge_bridge.envs.confined import CommandLimits, run_confined
from forge_bridge.envs.tool import ToolEnvironment, ToolError, ToolTask, function_schema


class TerminalEnvironment(ToolEnvironment):
    """Shell-like tools over a per-episode working directory; the task's checker decides."""

    def __init__(self, limits: CommandLimits = CommandLimits(), *, shell: bool = False,
                 root: str | None = None, keep_workdir: bool = False,
                 max_observation_chars: int = 8000) -> None:
        if not isinstance(limits, CommandLimits):
            raise WrongType(f"limits: expected a CommandLimits, got {type(limits).__name__}")
        self.limits, self.shell, self.root, self.keep_workdir = limits, shell, root, keep_workdir
        self.workdir: Path | None = None
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
        self.commands = []

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
            for arg in argv[1:]:
                for part in (arg, arg.split("=", 1)[-1]):
                    if part.startswith(("/", "~")) or ".." in Path(part).parts:
                        self.inside(part.replace("~", str(self.workdir), 1) if part.startswith("~") else part)
        result = run_confined(argv, self.workdir, self.limits)
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
        return f"wrote {len(content)} characters to {target.relative_to(self.workdir)}"


__all__ = ["CommandLimits", "TerminalEnvironment"]
