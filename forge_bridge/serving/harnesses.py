"""The command lines of the agent harnesses users run, pointed at an episode's gateway URL.

Each is what a user types, with the settings that make the harness talk to the gateway only:

| harness | command | API it speaks | pointed at the gateway by |
| --- | --- | --- | --- |
| Codex (`@openai/codex`) | `codex exec` | Responses (`/v1/responses`) | a custom provider (`-c model_providers.forge=...`) whose `base_url` is the episode's |
| Claude Code (`@anthropic-ai/claude-code`) | `claude -p` | Messages (`/v1/messages`) | `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` |
| OpenClaw (`openclaw`) | `openclaw agent exec` | chat completions (`/v1/chat/completions`) | a config whose provider's `baseUrl` is `${OPENAI_BASE_URL}` |

`CommandRollout(h.argv, policy, env=h.env, sandbox=InSandbox(...))` runs one per rollout:
`{prompt}` is the task's prompt, `{base_url}` the episode's URL; CommandRollout sets
`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY`. None logs in,
updates itself or reports telemetry in these settings (each was run in a sandbox whose only
reachable address is the gateway). Their own sandboxes are off: they cannot nest in bubblewrap,
and the terminal's sandbox confines them and every command they run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from forge_bridge.core.errors import InvalidArgument

MODEL = "forge"
"""The model name the harnesses ask for (the gateway serves its policy under any name)."""


@dataclass(frozen=True)
class Harness:
    """A harness's command line and environment, with `{prompt}` and `{base_url}` to fill."""

    name: str
    api: str
    """The API it speaks to the gateway: 'responses', 'messages' or 'chat'."""
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    """Files it reads, by name: written by the caller where the command names them."""

    def __post_init__(self) -> None:
        if self.api not in ("responses", "messages", "chat"):
            raise InvalidArgument(f"Harness.api: expected responses, messages or chat, got {self.api!r}")
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))  # read-only, as the rest
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))


def codex(model: str = MODEL, wire_api: str = "responses") -> Harness:
    """`codex exec` with a custom provider at the episode's URL (`wire_api`: Codex speaks the
    Responses API; "chat" was removed from recent releases). Web search and sub-agents are off:
    the one is a hosted tool the gateway does not serve, the other a tool namespace."""
    provider = (f'{{name="forge-bridge",base_url="{{base_url}}",env_key="OPENAI_API_KEY",'
                f'wire_api="{wire_api}",request_max_retries=0,stream_max_retries=0}}')
    return Harness("codex", "responses", (
        "codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--color", "never",
        "--model", model, "-c", "model_provider=forge", "-c", f"model_providers.forge={provider}",
        "-c", "web_search=disabled", "-c", "agents.enabled=false", "-c", "check_for_update_on_startup=false",
        "-c", "analytics.enabled=false", "{prompt}"))


def claude_code(model: str = MODEL) -> Harness:
    """`claude -p` on the Messages API at `ANTHROPIC_BASE_URL`, its permission prompts off (the
    sandbox is the boundary), no auto-update, telemetry or other non-essential traffic."""
    return Harness("claude-code", "messages", (
        "claude", "-p", "{prompt}", "--model", model, "--output-format", "text", "--dangerously-skip-permissions"),
        env={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
             "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1"})


def openclaw(config_path: str, model: str = MODEL) -> Harness:
    """`openclaw agent exec` (one embedded turn, no OpenClaw gateway) with the config at
    `config_path` (write `files["openclaw.json"]` there): one provider, chat completions at
    `${OPENAI_BASE_URL}`."""
    config = {"models": {"mode": "replace", "providers": {"forge": {
        "baseUrl": "${OPENAI_BASE_URL}", "apiKey": "${OPENAI_API_KEY}", "api": "openai-completions",
        "models": [{"id": model, "name": "forge-bridge policy", "reasoning": False, "input": ["text"],
                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                    "contextWindow": 32768, "maxTokens": 1024}]}}},
        "agents": {"defaults": {"model": {"primary": f"forge/{model}"}}},
        "update": {"checkOnStart": False}, "telemetry": {"enabled": False}}
    return Harness("openclaw", "chat", (
        "openclaw", "agent", "exec", "{prompt}", "--config", config_path, "--cwd", "/work", "--model",
        f"forge/{model}"), env={"OPENCLAW_NO_AUTO_UPDATE": "1"},
        files={"openclaw.json": json.dumps(config, indent=2)})


__all__ = ["MODEL", "Harness", "claude_code", "codex", "openclaw"]
