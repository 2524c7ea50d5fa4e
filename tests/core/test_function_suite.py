"""The generated function-calling suite: varied schemas, splits by function, an exact checker."""

import json

from forge_bridge.app.tasks.functions import check_call, expert_call, generate_suite, split_by_function
from forge_bridge.core.types import ToolCall
from forge_bridge.policies.toolcalls import parse_hermes


def test_the_suite_is_fixed_by_its_seed_and_varied():
    suite = generate_suite(300, seed=0)
    assert suite == generate_suite(300, seed=0) and suite != generate_suite(300, seed=1)
    assert len({t.function for t in suite}) == 300 and len(suite) == 600
    kinds = {(p["type"], "enum" in p) for t in suite for p in t.tool["function"]["parameters"]["properties"].values()}
    assert kinds == {("string", False), ("string", True), ("integer", False), ("number", False),
                     ("boolean", False), ("array", False), ("object", False)}
    optional_left_out = [t for t in suite if set(t.tool["function"]["parameters"]["properties"]) - set(t.expected)]
    assert len(optional_left_out) > 100  # many requests leave an optional argument out
    for t in suite:
        required = t.tool["function"]["parameters"]["required"]
        assert set(required) <= set(t.expected) and t.request.startswith("Please ")


def test_held_out_functions_never_appear_in_training():
    train, val, held = split_by_function(generate_suite(300, seed=0), seed=0)
    names = [{t.function for t in split} for split in (train, val, held)]
    assert not (names[0] & names[1]) and not (names[0] & names[2]) and not (names[1] & names[2])
    assert (len(names[0]), len(names[1]), len(names[2])) == (180, 45, 75)


def test_the_checker_is_exact():
    task = next(t for t in generate_suite(50, seed=3)
                if any(isinstance(v, bool) for v in t.expected.values())
                and set(t.tool["function"]["parameters"]["properties"]) - set(t.expected))
    right = ToolCall("c1", task.function, json.dumps(task.expected))
    assert check_call(task, [right])
    assert check_call(task, [{"type": "function", "function": {"name": task.function, "arguments": task.expected}}])
    assert not check_call(task, [right, right])  # one call, not two
    assert not check_call(task, [])
    assert not check_call(task, [ToolCall("c1", task.function + "_x", json.dumps(task.expected))])
    key = next(k for k, v in task.expected.items() if isinstance(v, bool))
    flipped = dict(task.expected, **{key: not task.expected[key]})
    assert not check_call(task, [ToolCall("c1", task.function, json.dumps(flipped))])
    as_int = dict(task.expected, **{key: int(task.expected[key])})  # True is not 1
    assert not check_call(task, [ToolCall("c1", task.function, json.dumps(as_int))])
    extra = next(k for k in task.tool["function"]["parameters"]["properties"] if k not in task.expected)
    assert not check_call(task, [ToolCall("c1", task.function, json.dumps({**task.expected, extra: "x"}))])
    missing = dict(task.expected)
    missing.pop(next(iter(missing)))
    assert not check_call(task, [ToolCall("c1", task.function, json.dumps(missing))])
    assert not check_call(task, [ToolCall("c1", task.function, "{not json")])


def test_the_expert_call_parses_and_passes():
    for task in generate_suite(40, seed=5):
        action = parse_hermes(expert_call(task), "stop")
        assert not action.malformed and check_call(task, action.tool_calls), task.id
