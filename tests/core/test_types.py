import json

import pytest

from forge_bridge.core.errors import SchemaError, WrongType
from forge_bridge.policies.base import PolicyOutput
from forge_bridge.core.types import (
    SCHEMA_VERSION,
    Action,
    Observation,
    ToolCall,
    Trajectory,
    TrajectoryGroup,
    TrajectoryRow,
    Transition,
    succeeded,
    success_rate,
)


def make_transition(**over) -> Transition:
    fields = dict(
        observation=Observation(
            messages=[{"role": "user", "content": "2+3?"}],
            tools=[{"type": "function", "function": {"name": "add", "parameters": {}}}]),
        action=Action(content="", finish_reason="tool_calls",
                      tool_calls=[ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')]),
        prompt_token_ids=[5, 6, 7], completion_token_ids=[8, 9], completion_logprobs=[-0.5, -1.25],
        version="run-v1", reward=0.5, info={"tool_results": {"c1": {"content": "5"}}})
    fields.update(over)
    return Transition(**fields)


def test_trajectory_round_trips_through_json():
    traj = Trajectory(transitions=[make_transition(), make_transition(terminated=True)],
                      task_id="t1", group_id="g1", run_id="r1", reward=1.0, end_reason="terminated",
                      metadata={"seed": 3})
    text = traj.to_json()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    back = Trajectory.from_json(text)
    assert back == traj
    assert back.transitions[0].action.tool_calls[0].name == "add"
    assert back.transitions[1].terminated and not back.transitions[1].truncated
    assert back.versions == {"run-v1"}


def test_openai_tool_call_dicts_are_accepted():
    a = Action(tool_calls=[{"id": "x", "type": "function",
                            "function": {"name": "f", "arguments": {"k": 1}}}])
    assert a.tool_calls[0] == ToolCall(id="x", name="f", arguments='{"k": 1}')


@pytest.mark.parametrize("over, field", [
    ({"prompt_token_ids": [1, -2]}, "Transition.prompt_token_ids[1]"),
    ({"completion_token_ids": "abc"}, "Transition.completion_token_ids"),
    ({"completion_logprobs": [0.5, -1.0]}, "Transition.completion_logprobs[0]"),
    ({"completion_logprobs": [-1.0]}, "Transition.completion_logprobs"),
    ({"reward": float("nan")}, "Transition.reward"),
    ({"terminated": 1}, "Transition.terminated"),
    ({"info": {"x": object()}}, "Transition.info"),
    ({"version": 3}, "Transition.version"),
])
def test_invalid_transition_names_the_field(over, field):
    with pytest.raises(SchemaError) as err:
        make_transition(**over)
    assert str(err.value).startswith(field)


def test_invalid_trajectory_data_names_the_field():
    good = Trajectory(transitions=[make_transition()]).to_dict()
    bad = json.loads(json.dumps(good))
    bad["transitions"][0]["prompt_token_ids"][1] = "x"
    with pytest.raises(SchemaError, match=r"^Trajectory.transitions\[0\]: Transition.prompt_token_ids\[1\]"):
        Trajectory.from_dict(bad)
    with pytest.raises(SchemaError, match="Trajectory.status"):
        Trajectory.from_dict({**good, "status": "done"})
    with pytest.raises(SchemaError, match="schema_version"):
        Trajectory.from_dict({**good, "schema_version": 99})
    with pytest.raises(SchemaError, match="unknown field"):
        Trajectory.from_dict({**good, "surprise": 1})
    with pytest.raises(SchemaError, match="not valid JSON"):
        Trajectory.from_json("{not json")
    with pytest.raises(SchemaError, match=r"Observation.messages\[0\].role"):
        Observation(messages=[{"content": "no role"}])


def test_group_checks_membership():
    a = Trajectory(group_id="g", reward=1.0)
    b = Trajectory(group_id="g", reward=0.0)
    group = TrajectoryGroup(group_id="g", task_id="t", trajectories=[a, b])
    assert group.rewards == [1.0, 0.0] and len(group) == 2
    with pytest.raises(SchemaError, match="group_id"):
        TrajectoryGroup(group_id="g", task_id="t", trajectories=[Trajectory(group_id="h")])


def test_has_tokens_marks_untrainable_steps():
    assert make_transition().has_tokens
    assert not make_transition(prompt_token_ids=[], completion_token_ids=[],
                               completion_logprobs=[]).has_tokens


def test_success_is_a_reward_at_the_threshold_and_a_missing_reward_fails():
    assert succeeded(1.0) and succeeded(0.5, 0.5) and not succeeded(0.49, 0.5)
    assert not succeeded(None) and succeeded(None, 0.0)
    assert success_rate([1.0, 0.0, None, 2.0]) == 0.5
    assert success_rate([0.3, 0.6, 0.9], threshold=0.5) == 2 / 3
    assert success_rate([]) == 0.0
    assert success_rate(iter([1.0, 1.0])) == 1.0  # any iterable, read once


def test_the_old_name_of_a_steps_version_still_works_for_a_release_and_warns():
    """`adapter` was the version that served a step until schema version 6 (one meaning per word:
    an adapter is the LoRA files): the keyword and the attribute work, each use warns here."""
    fields = {k: v for k, v in make_transition().__dict__.items() if k != "version"}
    with pytest.warns(DeprecationWarning, match="Transition.adapter is now Transition.version") as caught:
        step = Transition(**fields, adapter="run-v2")
    assert step.version == "run-v2" and caught[0].filename == __file__  # it points at the caller
    with pytest.warns(DeprecationWarning, match="Transition.adapter is now Transition.version") as caught:
        assert step.adapter == "run-v2"
    assert caught[0].filename == __file__
    with pytest.warns(DeprecationWarning):
        step.adapter = "run-v3"
    assert step.version == "run-v3" and "adapter" not in step.to_dict()
    with pytest.raises(WrongType, match="both adapter= and version="):
        Transition(**fields, adapter="a", version="b")
    traj = Trajectory(transitions=[step])
    with pytest.warns(DeprecationWarning, match="Trajectory.adapters is now Trajectory.versions"):
        assert traj.adapters == traj.versions == {"run-v3"}
    with pytest.warns(DeprecationWarning, match="PolicyOutput.adapter is now PolicyOutput.version"):
        out = PolicyOutput(Action(content="x"), [1], [2], [-0.5], adapter="run-v1")
    with pytest.warns(DeprecationWarning):
        assert out.version == out.adapter == "run-v1"
    assert PolicyOutput(Action(content="x"), [1], [2], [-0.5], "run-v1") == out  # positional: unchanged
    row = TrajectoryRow(traj, 1, "kind", 1, "run-v3")
    with pytest.warns(DeprecationWarning, match="TrajectoryRow.adapter is now TrajectoryRow.version"):
        assert row.adapter == row.version == "run-v3"


def test_a_step_dict_of_the_old_layout_reads_its_adapter_as_the_version():
    """A step dict has no schema version of its own: one written before version 6 reads as it meant."""
    step = make_transition()
    old = {k: v for k, v in step.to_dict().items() if k != "version"} | {"adapter": "run-v1"}
    assert Transition.from_dict(old) == step
    with pytest.raises(SchemaError, match=r"unknown field\(s\) \['adapter'\]"):
        Transition.from_dict(old | {"version": "run-v1"})
