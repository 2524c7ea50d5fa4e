"""The requests the harnesses send, as recorded from the real CLIs (tests/fixtures/harness_requests/:
Codex 0.171.0 on the Responses API, Claude Code 2.1.332 on the Messages API, OpenClaw 2026.9.6 on
chat completions; each a tool call's turn and its result's), replayed against the gateway without
the CLIs: each is served in its API's own stream, recorded as one step marked with that API, its
tools offered to the model as the harness declared them (Claude Code's deferred one left out), and
the tool's output filed into the conversation of the next step."""

import json
from pathlib import Path

import httpx
import pytest

import forge_bridge as fb
from forge_bridge.policies.models import tiny_tokenizer
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.serving.gateway import Gateway

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harness_requests"
TOKEN = "forge-token"
EXPECTED = {  # harness: (API, the shell tool, what its stream ends with, the tools the model is offered)
    "codex": ("responses", "exec_command", "response.completed",
              ["exec_command", "write_stdin", "request_user_input", "view_image", "get_goal", "create_goal",
               "update_goal"]),
    "claude-code": ("messages", "Bash", "message_stop",
                    ["Agent", "Bash", "Edit", "ListAgents", "Read", "ReportFindings", "ScheduleWakeup", "Skill",
                     "ToolSearch", "Workflow", "Write"]),
    "openclaw": ("chat", "exec", "[DONE]",
                 ["apply_patch", "edit", "exec", "ls", "process", "read", "sessions_yield", "tool_call",
                  "tool_describe", "tool_search", "write"]),
}


def shell(tool: str):
    def script(messages, tools):
        if any(m["role"] == "tool" for m in messages):
            return "total.txt holds the sum."
        return {"tool": tool, "args": {"cmd" if tool == "exec_command" else "command": "echo 12 > total.txt"}}
    return script


def last_event(text: str) -> str:
    data = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    return data[-1] if data[-1] == "[DONE]" else json.loads(data[-1])["type"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_harness_recorded_requests_are_served_and_recorded(name, tmp_path):
    api, tool, end, offered = EXPECTED[name]
    recorded = json.loads((FIXTURES / f"{name}.json").read_text())
    recorder = fb.Recorder(tmp_path / "t.db", run_id=name)
    with Gateway(ScriptedPolicy(shell(tool), tiny_tokenizer()), recorder, token=TOKEN) as gw:
        url = gw.episode_url("replay").removesuffix("/v1")
        for request in recorded["requests"]:
            auth = {"x-api-key": TOKEN} if api == "messages" else {"authorization": f"Bearer {TOKEN}"}
            reply = httpx.post(url + request["path"], json=request["body"], headers={**request["headers"], **auth},
                               timeout=30)
            assert reply.status_code == 200, reply.text[:500]
            assert request["body"]["stream"] is True and last_event(reply.text) == end
        gw.finish("replay", 1.0, None, None)
    (traj,) = recorder.store.trajectories(run_id=name)
    use, answer = traj.transitions
    assert use.info["api"] == answer.info["api"] == api and use.has_tokens and answer.has_tokens
    assert [t["function"]["name"] for t in use.observation.tools] == offered
    assert use.action.tool_calls[0].name == tool
    # the recorded second request carries the CLI's own run of the call: its output is in the prompt
    results = [m for m in answer.observation.messages if m["role"] == "tool"]
    assert len(results) == 1 and results[0]["content"]
    roles = [m["role"] for m in answer.observation.messages]
    assert roles[0] == "system" and "user" in roles and roles.index("assistant") < roles.index("tool")


def test_claude_codes_mid_conversation_system_turn_stays_where_it_was():
    from forge_bridge.serving import messages_api

    body = json.loads((FIXTURES / "claude-code.json").read_text())["requests"][0]["body"]
    call, stream = messages_api.parse(body)
    roles = [m["role"] for m in call.messages]
    assert stream and roles == ["system", "user", "system"]  # the system prompt, the task, the environment
    assert "Primary working directory: /work" in call.messages[2]["content"]
    assert "DeferredToolPlaceholder" not in [t["function"]["name"] for t in call.tools]
