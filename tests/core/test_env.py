import pytest

from forge_bridge.core.errors import SchemaError
from forge_bridge.core.types import Action, ToolCall
from forge_bridge.envs.base import Environment, StepResult


class CountdownEnv(Environment):
    """Reach zero by calling `dec`; more than `limit` steps truncates."""

    tools = [{"type": "function", "function": {"name": "dec", "parameters": {}}}]

    def __init__(self, limit: int = 5):
        self.limit = limit

    def reset(self, task):
        self.n, self.steps = int(task), 0
        return [{"role": "user", "content": f"count down from {self.n}"}]

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        self.n -= sum(tc.name == "dec" for tc in action.tool_calls)
        done = self.n <= 0
        return StepResult(observation=[{"role": "tool", "content": str(self.n)}],
                          reward=1.0 if done else 0.0, terminated=done,
                          truncated=not done and self.steps >= self.limit)


def test_environment_loop_keeps_termination_and_truncation_apart():
    env = CountdownEnv(limit=3)
    env.reset(2)
    dec = Action(tool_calls=[ToolCall(id="1", name="dec", arguments="{}")])
    r1, r2 = env.step(dec), env.step(dec)
    assert not r1.done and r2.terminated and not r2.truncated and r2.reward == 1.0
    env.reset(5)
    results = [env.step(Action(content="thinking")) for _ in range(3)]
    assert results[-1].truncated and not results[-1].terminated and results[-1].done


def test_step_result_validates():
    with pytest.raises(SchemaError, match="StepResult.reward"):
        StepResult(observation=None, reward=float("inf"))
    with pytest.raises(SchemaError, match="StepResult.terminated"):
        StepResult(observation=None, terminated="yes")


def test_environment_is_abstract():
    with pytest.raises(TypeError):
        Environment()
