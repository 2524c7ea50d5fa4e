"""One recording protocol: the LangChain middleware, the CrewAI LLM, the framework-free harness
and the gateway record the same reply the same way, mark the end of an episode the same way
(Gymnasium's terminated / truncated), and apply the same default limits."""

import json

import httpx
import pytest

import forge_bridge as fb
from forge_bridge.app import testing
from forge_bridge.core.exchange import export_parquet
from forge_bridge.core.recording import DEFAULT_MAX_MODEL_CALLS, DEFAULT_TOOL_TIMEOUT_S, Limits
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.policies import models
from forge_bridge.policies.scripted import ScriptedPolicy

import crew_demos

QUESTION = "What is 2 plus 3?"
CALL = testing.CALL
MALFORMED = '<tool_call>\n{"name": "add", "arguments": {"a": 2,\n</tool_call>'


def answers(messages, tools) -> str:
    """Calls add once, then answers: a task that ends (terminated)."""
    return "The answer is 5." if any(m["role"] == "tool" for m in messages) else CALL


def loops(messages, tools) -> str:
    """Calls add for ever: only a limit ends it (truncated)."""
    return CALL


def malformed(messages, tools) -> str:
    """A tool call that does not parse: the model's own fault."""
    return MALFORMED


# --------------------------------------------------------------------------- the four front ends
def run_langchain(policy, recorder, limit, rewards=None):
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.tools import tool

    from forge_bridge.adapters.langchain import ForgeMiddleware

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = create_agent(FakeListChatModel(responses=["unused"]), [add],
                         middleware=[ForgeMiddleware(policy, max_model_calls=limit, step_rewards=rewards)])
    with fb.episode("t", recorder=recorder) as ep:
        agent.invoke({"messages": [{"role": "user", "content": QUESTION}]})
        ep.reward(0.0)
    return recorder.store.get(ep.id)


def run_crewai(policy, recorder, limit, rewards=None):
    from forge_bridge.adapters.crewai import ForgeLLM

    with fb.episode("t", recorder=recorder) as ep:
        crew_demos.calculator_crew(ForgeLLM(policy, max_model_calls=limit, step_rewards=rewards),
                                  max_iter=limit + 5).kickoff()
        ep.reward(0.0)
    (role,) = ep.children.values()
    return recorder.store.get(role.id)


def run_harness(policy, recorder, limit, rewards=None):
    from forge_bridge.envs.harness import HarnessAgent
    from forge_bridge.envs.tool import ToolEnvironment, ToolTask

    class AddEnv(ToolEnvironment):
        def tool_functions(self):
            return {"add": (testing.ADD_TOOL, lambda a, b: a + b)}

    task = ToolTask("t", QUESTION, check=lambda answer, env: 0.0)
    return HarnessAgent(policy, AddEnv, max_model_calls=limit, step_rewards=rewards).run(task, recorder=recorder)


def run_gateway(policy, recorder, limit, rewards=None):
    from forge_bridge.serving.gateway import Gateway

    with Gateway(policy, recorder, max_model_calls=limit, step_rewards=rewards) as gw, httpx.Client(timeout=60) as client:
        url = gw.episode_url("ep-1")
        messages = [{"role": "user", "content": QUESTION}]
        for _ in range(limit + 2):  # a plain OpenAI-style tool loop, as an agent process runs it
            reply = client.post(f"{url}/chat/completions", json={
                "model": "forge", "messages": messages, "tools": [testing.ADD_TOOL]}).json()
            message = reply["choices"][0]["message"]
            if not message.get("tool_calls"):
                break
            messages.append(message)
            for tc in message["tool_calls"]:
                args = json.loads(tc["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": str(args["a"] + args["b"])})
        assert client.post(url.removesuffix("/v1") + "/finish", json={"reward": 0.0}).status_code == 200
    return recorder.store.get("ep-1")


FRONT_ENDS = {"langchain": run_langchain, "crewai": run_crewai, "harness": run_harness,
              "gateway": run_gateway}


@pytest.fixture(scope="module")
def tokenizer():
    return models.tiny()[1]


@pytest.fixture
def recorder(tmp_path):
    return fb.Recorder(TrajectoryStore(tmp_path / "t.db"), run_id="protocol")


def protocol_fields(traj):
    """What the recording protocol decides (not what a framework puts in its prompt)."""
    return {"end": (traj.status, traj.end_reason, traj.end_detail, traj.reward),
            "steps": [{"action": t.action.to_dict(), "completion_token_ids": t.completion_token_ids,
                       "completion_logprobs": t.completion_logprobs, "version": t.version,
                       "reward": t.reward, "terminated": t.terminated, "truncated": t.truncated,
                       "temperature": t.temperature, "source": t.info["source"] in FRONT_ENDS}
                      for t in traj]}


def test_the_same_malformed_reply_is_recorded_identically_by_all_four_front_ends(tokenizer, tmp_path):
    recorded = {}
    for name, run in FRONT_ENDS.items():
        recorder = fb.Recorder(TrajectoryStore(tmp_path / f"{name}.db"), run_id="protocol")
        traj = run(ScriptedPolicy(malformed, tokenizer), recorder, 5)
        assert len(traj) == 1, name  # the agent stops at the bad call
        assert traj.transitions[0].info["source"] == name
        recorded[name] = protocol_fields(traj)
    expected = recorded["harness"]
    assert expected["end"][:2] == ("failed", "policy_fault") and expected["end"][2].startswith("malformed tool call")
    assert expected["steps"][0]["terminated"] and not expected["steps"][0]["truncated"]
    assert expected["steps"][0]["action"]["parse_errors"] and not expected["steps"][0]["action"]["tool_calls"]
    for name, fields in recorded.items():
        assert fields == expected, name


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_a_finished_task_ends_terminated_on_its_last_step(front_end, tokenizer, recorder):
    traj = FRONT_ENDS[front_end](ScriptedPolicy(answers, tokenizer), recorder, 5)
    assert (traj.status, traj.end_reason) == ("complete", "terminated") and traj.trainable
    assert [(t.terminated, t.truncated) for t in traj] == [(False, False), (True, False)]
    (call,) = traj.transitions[0].action.tool_calls
    assert traj.transitions[0].info["tool_results"][call.id]["content"] == "5"


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_a_tool_loop_is_cut_at_the_step_limit_and_ends_truncated(front_end, tokenizer, recorder, tmp_path):
    traj = FRONT_ENDS[front_end](ScriptedPolicy(loops, tokenizer), recorder, 3)
    assert len(traj) == 3  # the fourth call is never made
    assert (traj.status, traj.end_reason, traj.end_detail) == ("truncated", "truncated", "more than 3 model calls")
    assert traj.trainable and traj.reward == 0.0
    assert [(t.terminated, t.truncated) for t in traj] == [(False, False)] * 2 + [(False, True)]
    # the exported Parquet carries both flags and the end reason
    import pyarrow.parquet as pq

    export_parquet(recorder.store, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    rows = [r for r in table if r["trajectory_id"] == traj.id]
    assert [(r["terminated"], r["truncated"]) for r in rows] == [(False, False)] * 2 + [(False, True)]
    assert {r["end_reason"] for r in rows} == {"truncated"}


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_step_rewards_land_on_the_step_that_repeated_a_call_in_every_front_end(front_end, tokenizer, tmp_path):
    def recorder():  # one store per run: the gateway's episode id is fixed
        return fb.Recorder(TrajectoryStore(tmp_path / f"{len(list(tmp_path.iterdir()))}.db"), run_id="r")

    rewards = fb.StepRewards(repeated_call=-0.1, malformed_call=-1.0)
    traj = FRONT_ENDS[front_end](ScriptedPolicy(loops, tokenizer), recorder(), 3, rewards)
    assert [t.reward for t in traj] == pytest.approx([0.0, -0.1, -0.1])  # add(2, 3) again and again
    assert [t.info.get("step_rewards") for t in traj] == [None, {"repeated_call": -0.1}, {"repeated_call": -0.1}]
    off = FRONT_ENDS[front_end](ScriptedPolicy(loops, tokenizer), recorder(), 3)
    assert [t.reward for t in off] == [0.0] * 3  # off by default
    bad = FRONT_ENDS[front_end](ScriptedPolicy(malformed, tokenizer), recorder(), 3, rewards)
    assert [t.reward for t in bad] == [-1.0] and bad.end_reason == "policy_fault"


def test_a_tool_that_raised_costs_its_step_the_tool_error_reward(tokenizer, recorder):
    from forge_bridge.adapters.crewai import ForgeLLM

    def bad_args(messages, tools):  # calls add with a string, which the tool rejects, then answers
        if any(m["role"] == "tool" for m in messages):
            return "I could not add them."
        return '<tool_call>\n{"name": "add", "arguments": {"a": "two", "b": 3}}\n</tool_call>'

    rewards = fb.StepRewards(tool_error=-0.5)
    traj = run_langchain(ScriptedPolicy(bad_args, tokenizer), recorder, 5, rewards)
    (call,) = traj.transitions[0].action.tool_calls
    assert traj.transitions[0].info["tool_results"][call.id]["status"] == "error"
    assert [t.reward for t in traj] == [-0.5, 0.0]
    assert traj.transitions[0].info["step_rewards"] == {"tool_error": -0.5}
    # CrewAI: where ForgeLLM runs the tool itself (`available_functions`)
    llm = ForgeLLM(ScriptedPolicy(bad_args, tokenizer), step_rewards=rewards)
    with fb.episode("t", recorder=recorder) as ep:
        llm.call([{"role": "user", "content": QUESTION}], tools=[testing.ADD_TOOL],
                 available_functions={"add": lambda a, b: a + b})
    (step,) = recorder.store.get(ep.id).transitions
    assert step.reward == -0.5 and step.info["step_rewards"] == {"tool_error": -0.5}


def test_step_rewards_are_validated():
    with pytest.raises(ValueError, match="StepRewards.tool_error: expected a finite number"):
        fb.StepRewards(tool_error=float("nan"))


def test_limits_are_on_by_default_in_every_front_end_and_may_be_turned_off(tokenizer):
    from forge_bridge.adapters.crewai import ForgeLLM
    from forge_bridge.adapters.langchain import ForgeMiddleware
    from forge_bridge.envs.harness import HarnessAgent
    from forge_bridge.serving.gateway import Gateway

    policy = ScriptedPolicy(answers, tokenizer)
    defaults = Limits()
    assert (defaults.max_model_calls, defaults.tool_timeout_s) == (DEFAULT_MAX_MODEL_CALLS, DEFAULT_TOOL_TIMEOUT_S) == (25, 60.0)
    assert ForgeMiddleware(policy).limits == defaults
    assert ForgeLLM(policy).limits == defaults
    assert HarnessAgent(policy, lambda: None).limits.max_model_calls == 25
    assert Gateway(policy, fb.Recorder(":memory:")).limits.max_model_calls == 25
    off = ForgeMiddleware(policy, max_model_calls=None, tool_timeout_s=None)
    assert off.limits.max_model_calls is None and off.limits.tool_timeout_s is None
    with pytest.raises(ValueError, match="max_model_calls"):
        ForgeMiddleware(policy, max_model_calls=0)
    with pytest.raises(ValueError, match="tool_timeout_s"):
        ForgeLLM(policy, tool_timeout_s=-1)


def test_forge_llm_runs_every_tool_call_of_a_reply_each_under_the_timeout(tokenizer, recorder):
    import time

    from forge_bridge.adapters.crewai import ForgeLLM

    two_calls = CALL + '\n<tool_call>\n{"name": "slow", "arguments": {}}\n</tool_call>'
    llm = ForgeLLM(ScriptedPolicy(lambda m, t: two_calls, tokenizer), tool_timeout_s=0.5)
    t0 = time.perf_counter()
    with fb.episode("t", recorder=recorder) as ep:
        answer = llm.call([{"role": "user", "content": QUESTION}], tools=[testing.ADD_TOOL],
                          available_functions={"add": lambda a, b: a + b, "slow": lambda: time.sleep(5)})
    assert time.perf_counter() - t0 < 3
    assert answer == "add: 5\nslow: Error: TimeoutError: no answer within 0.5 s"
    (step,) = recorder.store.get(ep.id).transitions
    add_call, slow_call = step.action.tool_calls
    results = step.info["tool_results"]
    assert results[add_call.id]["content"] == "5" and results[add_call.id]["status"] == "success"
    assert results[slow_call.id]["status"] == "error" and "TimeoutError" in results[slow_call.id]["error"]


def test_a_scripted_reply_cut_at_max_tokens_is_marked_cut(tokenizer):
    policy = ScriptedPolicy(lambda m, t: "one two three four five six seven eight", tokenizer)
    messages = [{"role": "user", "content": QUESTION}]
    whole = policy.chat(messages, max_tokens=200)
    n = len(whole.completion_token_ids)  # the reply and its end-of-turn token
    assert whole.finish_reason == "stop" and whole.completion_token_ids[-1] == tokenizer.eos_token_id
    cut = policy.chat(messages, max_tokens=n - 2)
    assert cut.finish_reason == "length" and len(cut.completion_token_ids) == n - 2
    assert tokenizer.eos_token_id not in cut.completion_token_ids
    assert policy.chat(messages, max_tokens=n).finish_reason == "stop"  # just fits, end included
