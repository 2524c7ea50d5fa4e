"""Model faults (malformed tool-call JSON, an unknown tool, arguments of the wrong type, an
endless tool loop, output past the context) and tool faults (raises, hangs, huge or non-UTF-8
output), through a real LangChain agent and through HarnessAgent: each is recorded in the
step's info, and the episode goes on or ends as configured."""

import json
import time

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import tool

import forge_bridge as fb
from forge_bridge.adapters.langchain import ForgeMiddleware
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.envs.tool import ToolEnvironment, ToolTask, function_schema
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def explode(x: int) -> int:
    """A tool that raises."""
    raise RuntimeError("calculator is on fire")


@tool
def hang(x: int) -> int:
    """A tool that never answers in time."""
    time.sleep(30)
    return x


@tool
def flood(x: int) -> str:
    """A tool that returns a megabyte."""
    return "x" * 1_000_000


@tool
def binary(x: int) -> bytes:
    """A tool that returns bytes that are not UTF-8."""
    return b"ok \xff\xfe end"


TOOLS = [add, explode, hang, flood, binary]


def calls_then_answers(call_text: str):
    """A scripted model: one tool call, then a final answer quoting the tool's result."""
    def script(messages, tools):
        if not any(m["role"] == "tool" for m in messages):
            return call_text
        return "Final: " + str(messages[-1]["content"])[:40]
    return script


def call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def tokenizer():
    return models.tiny_tokenizer()


@pytest.fixture
def recorder(tmp_path):
    return fb.Recorder(tmp_path / "faults.db")


def run_agent(script, tokenizer, recorder, **middleware):
    agent = create_agent(FakeListChatModel(responses=["unused"]), TOOLS,
                         middleware=[ForgeMiddleware(ScriptedPolicy(script, tokenizer), **middleware)])
    with fb.episode("t", recorder=recorder) as ep:
        result = agent.invoke({"messages": [{"role": "user", "content": "go"}]})
    return recorder.store.get(ep.id), result


def only_tool_result(traj) -> dict:
    (outcome,) = traj.transitions[0].info["tool_results"].values()
    return outcome


# ----------------------------------------------------------------------------- model faults
def test_malformed_tool_call_json_fails_the_episode_as_a_policy_fault_and_keeps_the_step(tokenizer, recorder):
    traj, _ = run_agent(lambda m, t: '<tool_call>\n{"name": "add", "arguments": {"a": 2,, "b": 3}}\n</tool_call>',
                        tokenizer, recorder)
    assert traj.status == "failed" and traj.end_reason == "policy_fault"
    assert "malformed tool call" in traj.end_detail
    assert traj.transitions[0].action.parse_errors and traj.transitions[0].completion_token_ids


@pytest.mark.parametrize("text, expected", [
    (call("subtract", a=1, b=2), "subtract is not a valid tool"),
    (call("add", a="two", b=[3]), "Input should be a valid integer"),
])
def test_an_unknown_tool_or_wrong_argument_types_are_error_results_and_the_episode_goes_on(
        text, expected, tokenizer, recorder):
    traj, result = run_agent(calls_then_answers(text), tokenizer, recorder)
    outcome = only_tool_result(traj)
    assert outcome["status"] == "error" and expected in outcome["error"]
    assert traj.status == "complete" and len(traj.transitions) == 2  # the model saw the error, answered


def test_an_endless_tool_loop_is_cut_at_the_step_limit_and_recorded_as_truncated(tokenizer, recorder):
    traj, result = run_agent(lambda m, t: call("add", a=1, b=1), tokenizer, recorder, max_model_calls=3)
    assert traj.status == "truncated" and len(traj.transitions) == 3
    assert traj.end_detail == "more than 3 model calls"


def test_output_past_the_context_is_cut_and_a_prompt_past_it_truncates_the_episode(
        taught_model_dir, recorder):
    from forge_bridge.core.recording import Limits, call_policy

    policy = fb.LocalPolicy(str(taught_model_dir))
    ctx = policy.max_context

    def prompt_of(n: int) -> list[dict]:
        return [{"role": "user", "content": " ".join(["hi"] * n)}]

    per_word = (len(policy.tokenizer.apply_chat_template(prompt_of(200), add_generation_prompt=True)["input_ids"])
                - len(policy.tokenizer.apply_chat_template(prompt_of(100), add_generation_prompt=True)["input_ids"])) / 100
    with fb.episode("long", recorder=recorder) as ep:
        out = call_policy(policy, ep, prompt_of(int((ctx - 60) / per_word)), None, source="test",
                          limits=Limits(), sampling={"max_tokens": ctx, "temperature": 1.0, "seed": 0})
        assert len(out.prompt_token_ids) + len(out.completion_token_ids) == ctx  # it ran into the context
        assert out.action.finish_reason == "length" and ep.end_reason is None  # a finish reason only
        # the next prompt no longer fits: the episode is cut there, trained on, not an outage
        assert call_policy(policy, ep, prompt_of(ctx), None, source="test", limits=Limits()) is None
    traj = recorder.store.get(ep.id)
    assert traj.end_reason == "truncated" and "does not fit the model's context" in traj.end_detail
    assert len(traj) == 1 and traj.transitions[-1].truncated
    with pytest.raises(fb.PolicyError, match="does not fit the model's context"):
        policy.chat(prompt_of(ctx))  # outside an episode, the error itself
    policy.close()


# ----------------------------------------------------------------------------- tool faults
def test_a_raising_tool_is_recorded_and_the_episode_goes_on_or_ends_as_configured(tokenizer, recorder):
    traj, _ = run_agent(calls_then_answers(call("explode", x=1)), tokenizer, recorder)
    outcome = only_tool_result(traj)
    assert outcome["status"] == "error" and "calculator is on fire" in outcome["error"]
    assert traj.status == "complete"
    with pytest.raises(RuntimeError, match="on fire"):
        run_agent(calls_then_answers(call("explode", x=1)), tokenizer, recorder, handle_tool_errors=False)
    (failed,) = [t for t in recorder.store.trajectories() if t.status == "failed"]
    assert "on fire" in failed.end_detail


def test_a_hanging_tool_times_out_into_an_error_result(tokenizer, recorder):
    t0 = time.perf_counter()
    traj, _ = run_agent(calls_then_answers(call("hang", x=1)), tokenizer, recorder, tool_timeout_s=0.5)
    assert time.perf_counter() - t0 < 10
    outcome = only_tool_result(traj)
    assert outcome["status"] == "error" and "no answer within 0.5 s" in outcome["error"]
    assert traj.status == "complete"


def test_a_huge_result_is_cut_before_the_model_sees_it_and_its_size_recorded(tokenizer, recorder):
    traj, result = run_agent(calls_then_answers(call("flood", x=1)), tokenizer, recorder, max_tool_output_chars=1000)
    outcome = only_tool_result(traj)
    assert outcome["content_chars"] == 1_000_000 and len(outcome["content"]) < 1100
    tool_message = [m for m in result["messages"] if m.type == "tool"][0]
    assert len(tool_message.content) < 1100 and "more characters cut" in tool_message.content


def test_a_non_utf8_result_reaches_the_model_and_the_record_as_valid_text(tokenizer, recorder):
    traj, _ = run_agent(calls_then_answers(call("binary", x=1)), tokenizer, recorder)
    outcome = only_tool_result(traj)
    # LangChain turns bytes into their escaped literal; nothing is lost and the record is valid JSON
    assert outcome["status"] == "success" and outcome["content"] == repr(b"ok \xff\xfe end")
    assert json.loads(json.dumps(traj.to_dict()))["transitions"][1]["observation"]["messages"][-1]["content"] \
        == outcome["content"]


def test_the_same_tool_faults_through_harness_agent_are_observed_and_recorded(tokenizer, tmp_path):
    class PythonTools(ToolEnvironment):
        def tool_functions(self):
            schema = lambda name: function_schema(name, name, {"x": {"type": "integer"}}, ("x",))  # noqa: E731
            return {"explode": (schema("explode"), lambda x: explode.func(x)),
                    "hang": (schema("hang"), lambda x: hang.func(x)),
                    "flood": (schema("flood"), lambda x: flood.func(x)),
                    "binary": (schema("binary"), lambda x: binary.func(x))}

    recorder = fb.Recorder(tmp_path / "h.db")
    found = {}
    for name in ("explode", "hang", "flood", "binary"):
        harness = HarnessAgent(ScriptedPolicy(calls_then_answers(call(name, x=1)), tokenizer),
                               lambda: PythonTools(max_observation_chars=1000, tool_timeout_s=0.5))
        traj = harness.run(ToolTask(name, "go", check=lambda a, e: True), recorder=recorder)
        assert traj.status == "complete" and traj.reward == 1.0
        found[name] = only_tool_result(traj)
    assert found["explode"]["status"] == "error" and "on fire" in found["explode"]["error"]
    assert found["hang"]["status"] == "error" and found["hang"]["timed_out"]
    assert len(found["flood"]["content"]) < 1100 and "more characters cut" in found["flood"]["content"]
    assert "ok \ufffd\ufffd end" == found["binary"]["content"]


def test_through_the_gateway_a_malformed_call_or_a_crashed_agent_ends_the_episode_with_the_reason(tokenizer, tmp_path):
    import httpx

    bad = '<tool_call>\n{"name": "add", "arguments": {oops}\n</tool_call>'
    recorder = fb.Recorder(tmp_path / "g.db")
    with fb.Gateway(ScriptedPolicy(lambda m, t: bad, tokenizer), recorder) as gateway:
        body = {"model": "forge", "messages": [{"role": "user", "content": "go"}], "max_tokens": 64}
        assert httpx.post(gateway.episode_url("m1") + "/chat/completions", json=body).status_code == 200
        end = httpx.post(gateway.episode_url("m1").removesuffix("/v1") + "/finish", json={"reward": 0})
        assert end.status_code == 200 and end.json()["status"] == "failed"
        malformed = recorder.store.get("m1")
        assert malformed.status == "failed" and malformed.end_reason == "policy_fault"
        assert len(malformed.transitions) == 1 and malformed.trainable  # kept, to be trained on
        gateway.policy.script = lambda m, t: "fine"
        assert httpx.post(gateway.episode_url("c1") + "/chat/completions", json=body).status_code == 200
        crashed = httpx.post(gateway.episode_url("c1").removesuffix("/v1") + "/finish",
                             json={"error": "the agent raised KeyError: 'x'"})
        assert crashed.json()["status"] == "failed"
    traj = recorder.store.get("c1")
    assert traj.status == "failed" and traj.end_detail == "the agent raised KeyError: 'x'"
