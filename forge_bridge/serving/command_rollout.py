"""Rollouts that are other programs: the user's agent process, pointed at the gateway.

`CommandRollout(cmd, policy)` is a rollout function (`task -> reward`, recording into the
trainer's current episode): for each rollout it serves that episode at its own gateway URL,
starts the command with `OPENAI_BASE_URL` and `OPENAI_API_KEY` (OpenAI's clients) and
`ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` (Anthropic's: the same URL without `/v1`) set to
it (and `{base_url}` in the command line), waits (killing the whole process group at the
timeout: the episode is then truncated), and takes the reward from the process. The trajectory
is exactly the process's model calls, in order, with the policy's token ids, because every call
goes through the recording protocol inside the gateway.

With `sandbox=InSandbox(...)` (`forge_bridge.envs.in_sandbox`) the command is an agent harness
(Codex, Claude Code, OpenClaw: `forge_bridge.serving.harnesses`) run in the terminal
environment's sandbox, the gateway its only reachable address; the task is a `ToolTask`, its
`setup` writes the working directory's files, `{prompt}` in the command is its prompt, and the
reward is its `check(answer, terminal)` over the files the harness left (the answer: what it
printed). Its environment is only `env`, the gateway's URLs and token, not the trainer's.

The reward, by `reward=`:
- `"stdout"` (default): the last line of standard output that is a JSON object with a
  `"reward"`, else the reward the process gave with `POST <episode>/finish`;
- `"exit_code"`: 1.0 when the process exits 0, else 0.0;
- a function `(task, stdout) -> float`, a checker over what the agent printed.
A process that gives no reward, or exits non-zero with `"stdout"`, crashed: the episode is
recorded as `crashed` (never trained on) with the end of its standard error.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

from forge_bridge.core.episode import current_episode
from forge_bridge.core.errors import AgentError, InvalidArgument, InvalidState, WrongType
from forge_bridge.policies.base import Policy
from forge_bridge.serving.gateway import Gateway

if TYPE_CHECKING:
    from forge_bridge.envs.in_sandbox import InSandbox


def _reward_line(stdout: str) -> float | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and "reward" in data:
                return data["reward"]
    return None


def _filled(arg: str, fill: dict[str, str]) -> str:
    """`arg` with each placeholder replaced in one pass (a prompt that contains `{episode_id}`
    stays as written)."""
    out, i = [], 0
    while i < len(arg):
        for key, value in fill.items():
            if arg.startswith(key, i):
                out.append(value)
                i += len(key)
                break
        else:
            out.append(arg[i])
            i += 1
    return "".join(out)


def _prompt(task: Any) -> str:
    """A task's prompt: a `ToolTask`'s, or a mapping's "prompt" (else empty)."""
    prompt = task.get("prompt") if isinstance(task, dict) else getattr(task, "prompt", None)
    return prompt if isinstance(prompt, str) else ""


class CommandRollout:
    """`trainer.train(CommandRollout("python my_agent.py {task_json}", policy), tasks, ...)`"""

    def __init__(self, cmd: str | Sequence[str], policy: Policy | None = None, *,
                 gateway: Gateway | None = None, reward: str | Callable[[Any, str], float] = "stdout",
                 timeout_s: float = 300.0, env: Mapping[str, str] | None = None, cwd: str | None = None,
                 sandbox: "InSandbox | None" = None) -> None:
        """`cmd`: a command line (split like a shell does, never run by one) or an argument
        list; `{task_json}`, `{episode_id}`, `{prompt}` (the task's) and `{base_url}` (the
        episode's URL) in it are filled in per rollout. Give the policy (a gateway is started
        on 127.0.0.1 for it) or a running `gateway`. `sandbox`: run it in the terminal's
        sandbox, rewarded by the task's checker (above), within `timeout_s` (its limits' own
        timeout does not apply)."""
        if isinstance(cmd, str):
            cmd = shlex.split(cmd)
        if not cmd or not all(isinstance(a, str) for a in cmd):
            raise WrongType(f"cmd: expected a command line or a list of strings, got {cmd!r}")
        if (policy is None) == (gateway is None):
            raise InvalidArgument("CommandRollout: give either the policy or a running gateway")
        if reward not in ("stdout", "exit_code") and not callable(reward):
            raise InvalidArgument(f"reward: expected 'stdout', 'exit_code' or a function (task, stdout) "
                                  f"-> float, got {reward!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise InvalidArgument(f"timeout_s: expected a number > 0, got {timeout_s!r}")
        self.cmd, self.reward, self.timeout_s = list(cmd), reward, float(timeout_s)
        self.env, self.cwd, self.sandbox = dict(env or {}), cwd, sandbox
        if sandbox is not None and cwd is not None:
            raise InvalidArgument("cwd: a sandboxed command runs in its episode's working directory (/work)")
        if sandbox is not None and reward != "stdout":
            raise InvalidArgument("reward: a sandboxed command is rewarded by its task's check(answer, terminal)")
        self._own_gateway = gateway is None
        self.gateway = gateway or Gateway(cast(Policy, policy))  # given when no gateway is: checked above
        if self._own_gateway:
            self.gateway.start()

    def close(self) -> None:
        if self._own_gateway:
            self.gateway.stop()

    def __enter__(self) -> "CommandRollout":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, task: Any) -> float:
        ep = current_episode()
        if ep is None:
            raise InvalidState("CommandRollout(task) records into the current episode: call it inside "
                               "`with fb.episode(...)` or a trainer")
        task_json = json.dumps(task, default=str)
        url, token = self.gateway.episode_url(ep.id), self.gateway.token or "forge-bridge"
        fill = {"{task_json}": task_json, "{episode_id}": ep.id, "{prompt}": _prompt(task), "{base_url}": url}
        argv = [_filled(a, fill) for a in self.cmd]
        given = {**self.env, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": token,
                 "ANTHROPIC_BASE_URL": url.removesuffix("/v1"), "ANTHROPIC_API_KEY": token, "FORGE_TASK": task_json}
        self.gateway.attach(ep)
        if self.sandbox is not None:
            try:
                run = self.sandbox.run(task, argv, given, (self.gateway.host, self.gateway.port), self.timeout_s)
            finally:
                self.gateway.release(ep.id)
            return self._sandboxed(ep, run)
        env = {**os.environ, **given}
        try:
            proc = subprocess.Popen(argv, env=env, cwd=self.cwd, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                stdout, stderr = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the agent and anything it started
                proc.communicate()
                ep.truncate(f"the agent process ran past its {self.timeout_s:g} s timeout")
                return 0.0
        finally:
            self.gateway.release(ep.id)
        return self._reward(task, proc.returncode, stdout, stderr, ep.trajectory.reward)

    def _sandboxed(self, ep: Any, run: Any) -> float:
        result = run.result
        if result.timed_out:
            ep.truncate(f"the agent process ran past its {self.timeout_s:g} s timeout")
            return 0.0
        if run.reward is None:
            limit = f" ({result.limit_hit} limit)" if result.limit_hit else ""
            raise AgentError(f"the agent process exited with code {result.exit_code}{limit}: "
                             f"{result.stderr.strip()[-500:]}")
        return run.reward

    def _reward(self, task: Any, code: int, stdout: str, stderr: str, posted: float | None) -> float:
        if self.reward == "exit_code":
            return 1.0 if code == 0 else 0.0
        if code != 0:
            raise AgentError(f"the agent process exited with code {code}: {stderr.strip()[-500:]}")
        if callable(self.reward):
            return float(self.reward(task, stdout))
        value = _reward_line(stdout)
        if value is None:
            value = posted
        if value is None:
            raise AgentError("the agent process gave no reward: print a JSON line {\"reward\": r} or "
                             "POST it to $OPENAI_BASE_URL/../finish")
        return value


__all__ = ["CommandRollout"]
