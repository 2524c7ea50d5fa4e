"""The first real instruct model a user picks, Qwen2.5-Coder-0.5B-Instruct (`make test` fetches it
once: `forge-bridge fetch qwen2.5-coder-0.5b-instruct`), greedy, through every front end: it writes
its tool calls as fenced JSON, not in the `<tool_call>` tags its template asks for, and each front
end gets them as calls (the LangChain middleware on public BFCL requests, CrewAI's ForgeLLM, the
gateway under the OpenAI SDK, and the HarnessAgent)."""

import json

import pytest

import forge_bridge as fb
from forge_bridge.app.tasks import bfcl
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.envs.tool import ToolEnvironment, ToolTask
from forge_bridge.serving.gateway import Gateway

MODEL = "qwen2.5-coder-0.5b-instruct"
GREEDY = {"temperature": 0, "max_tokens": 128}
REQUESTS = ["simple_python_0", "simple_python_16", "simple_python_20"]
"""BFCL requests whose greedy replies hold a right call (bench/real_models.py: docs/real-models.md)."""
FACTORIAL = {"type": "function", "function": {
    "name": "math_factorial", "description": "Calculate the factorial of a given number.",
    "parameters": {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}}}


@pytest.fixture(scope="module")
def policy():
    policy = fb.LocalPolicy(MODEL)
    yield policy
    policy.close()


@pytest.fixture
def recorder(tmp_path):
    return fb.Recorder(tmp_path / "t.db", run_id="real")


def read(step) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in step.action.tool_calls]


def langchain_agent(policy, tool: dict):
    """An ordinary LangChain agent whose one tool is `tool` (LangChain's return_direct: one model call)."""
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI

    from forge_bridge.adapters.langchain import ForgeMiddleware

    fn = tool["function"]
    lc_tool = StructuredTool.from_function(func=lambda **kwargs: "done", name=fn["name"], description=fn["description"],
                                           args_schema=fn["parameters"], return_direct=True)
    model = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1")
    return create_agent(model, [lc_tool], middleware=[ForgeMiddleware(policy, **GREEDY)])


def test_langchain_agent_on_public_requests_gets_its_calls(policy, recorder):
    tasks = {t.id: t for t in bfcl.load("simple")}
    for task_id in REQUESTS:
        task = tasks[task_id]
        with fb.episode(task_id, recorder=recorder) as ep:
            langchain_agent(policy, task.tool).invoke({"messages": [{"role": "user", "content": task.request}]})
        step = ep.trajectory.transitions[0]
        assert step.action.call_format == "fenced_json", step.action.content
        assert bfcl.check_call(task, step.action.tool_calls), read(step)
        assert step.info["tool_results"]  # the agent ran the tool: LangChain got a call


def test_gateway_under_the_openai_sdk_returns_the_call(policy, recorder):
    from openai import OpenAI

    with Gateway(policy, recorder, token="s3cret") as gateway:
        client = OpenAI(base_url=gateway.episode_url("gw-1"), api_key="s3cret")
        reply = client.chat.completions.create(
            model="forge", messages=[{"role": "user", "content": "Calculate the factorial of 5."}],
            tools=[FACTORIAL], temperature=0, max_tokens=128)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "math_factorial" and json.loads(call.function.arguments) == {"number": 5}
    assert reply.choices[0].finish_reason == "tool_calls"


class Factorials(ToolEnvironment):
    def tool_functions(self):
        import math

        return {"math_factorial": (FACTORIAL, lambda number: math.factorial(int(number)))}


def test_harness_agent_runs_the_tool_it_called(policy, recorder):
    harness = HarnessAgent(policy, Factorials, max_model_calls=2, **GREEDY)
    task = ToolTask("fact-5", "Calculate the factorial of 5.", check=lambda answer, env: "120" in answer)
    traj = harness.run(task, recorder=recorder)
    first = traj.transitions[0]
    assert read(first) == [("math_factorial", {"number": 5})] and first.action.call_format == "fenced_json"
    (result,) = first.info["tool_results"].values()
    assert result["status"] == "success" and result["content"] == "120"


def test_crewai_forge_llm_gets_the_call(policy, recorder):
    from crewai import Agent, Crew, Process, Task
    from crewai.tools import tool

    from forge_bridge.adapters.crewai import ForgeLLM

    @tool("math_factorial")
    def math_factorial(number: int) -> int:
        """Calculate the factorial of a given number."""
        import math

        return math.factorial(number)

    agent = Agent(role="mathematician", goal="compute factorials", backstory="You use your tool.",
                  llm=ForgeLLM(policy, **GREEDY), tools=[math_factorial], max_iter=2, verbose=False)
    task = Task(description="Calculate the factorial of 5.", expected_output="the number", agent=agent)
    with fb.episode("crew-5", recorder=recorder) as ep:
        Crew(agents=[agent], tasks=[task], process=Process.sequential, verbose=False).kickoff()
    (child,) = ep.children.values()
    first = recorder.store.get(child.id).transitions[0]
    assert [name for name, _ in read(first)] == ["math_factorial"] and first.action.call_format
    assert "120" in json.dumps(first.info["tool_results"])
