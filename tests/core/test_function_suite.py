"""The generated function-calling suite: varied schemas, splits by function, an exact checker."""

import json

from forge_bridge.app.tasks.functions import (
    CALL_ERRORS,
    FunctionTask,
    argument_choices,
    argument_verdicts,
    call_error,
    check_call,
    expert_call,
    generate_suite,
    score_call,
    split_by_function,
)
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


def test_partial_credit_counts_each_argument_once_and_is_full_only_when_exact():
    tool = {"type": "function", "function": {"name": "book_flight", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "seats": {"type": "integer"}, "window": {"type": "boolean"},
        "note": {"type": "string"}}, "required": ["city"]}}}
    task = FunctionTask("book_flight-0", tool, "Book 2 seats to Oslo by the window.",
                        {"city": "Oslo", "seats": 2, "window": True})

    def call(args, name="book_flight"):
        return [ToolCall("c1", name, json.dumps(args))]

    assert score_call(task, call(task.expected)) == 1.0 and check_call(task, call(task.expected))
    assert score_call(task, call({"city": "Oslo", "seats": 2})) == 2 / 3  # one missing
    assert score_call(task, call({**task.expected, "note": "x"})) == 3 / 4  # one extra: 4 names in all
    assert score_call(task, call({"city": "Oslo", "seats": 2.0, "window": 1})) == 1 / 3  # types must match
    assert score_call(task, call({"city": "Lima", "note": "x"})) == 0.0  # 4 names, none right
    assert score_call(task, call(task.expected, name="book_hotel")) == 0.0
    assert score_call(task, call(task.expected) * 2) == 0.0
    assert score_call(task, [ToolCall("c1", "book_flight", "[1, 2]")]) == 0.0  # not an object
    assert score_call(task, [ToolCall("c1", "book_flight", "{not json")]) == 0.0
    bare = FunctionTask("ping-0", {"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}}}}, "Ping.", {})
    assert score_call(bare, [ToolCall("c1", "ping", "{}")]) == 1.0 and check_call(bare, [ToolCall("c1", "ping", "{}")])
    for near in ({"city": "Oslo", "seats": 2}, {**task.expected, "note": "x"}):
        assert 0 < score_call(task, call(near)) < 1 and not check_call(task, call(near))


def test_each_failed_call_is_named_by_what_it_got_wrong():
    tool = {"type": "function", "function": {"name": "book_flight", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "seats": {"type": "integer"}, "note": {"type": "string"}}}}}
    task = FunctionTask("book_flight-0", tool, "Book 2 seats to Oslo.", {"city": "Oslo", "seats": 2})

    def call(args, name="book_flight"):
        return [ToolCall("c1", name, json.dumps(args))]

    named = {
        "pass": call({"city": "Oslo", "seats": 2}),
        "extra argument": call({"city": "Oslo", "seats": 2, "note": "x"}),
        "missing argument": call({"city": "Oslo"}),
        "other key set": call({"city": "Oslo", "note": "x"}),
        "wrong value": call({"city": "Oslo", "seats": 2.0}),  # the type counts
        "malformed": call({"city": "Oslo", "seats": 2}) * 2,
    }
    assert tuple(named) == CALL_ERRORS
    for error, calls in named.items():
        assert call_error(task, calls) == error, error
        assert (error == "pass") == check_call(task, calls)
    assert call_error(task, call(task.expected, name="book_hotel")) == "malformed"
    assert call_error(task, [ToolCall("c1", "book_flight", "{not json")]) == "malformed"
    assert call_error(task, []) == "malformed"


def test_the_expert_call_parses_and_passes():
    for task in generate_suite(40, seed=5):
        action = parse_hermes(expert_call(task), "stop")
        assert not action.malformed and check_call(task, action.tool_calls), task.id


def test_argument_verdicts_say_which_arguments_were_right_and_whether_one_is_missing():
    tool = {"type": "function", "function": {"name": "book_flight", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "seats": {"type": "integer"}, "note": {"type": "string"}}, "required": ["city"]}}}
    task = FunctionTask("book_flight-0", tool, "Book 2 seats to Oslo.", {"city": "Oslo", "seats": 2})

    def call(args, name="book_flight"):
        return [ToolCall("c1", name, json.dumps(args))]

    assert argument_verdicts(task, call(task.expected)) == ({"city": True, "seats": True}, False)
    assert argument_verdicts(task, call({"city": "Oslo", "seats": 2.0, "note": "x"})) == (
        {"city": True, "seats": False, "note": False}, False)
    assert argument_verdicts(task, call({"city": "Oslo"})) == ({"city": True}, True)
    assert argument_verdicts(task, call(task.expected, name="book_hotel")) is None
    assert argument_verdicts(task, [ToolCall("c1", "book_flight", "{not json")]) is None


def test_argument_choices_count_the_parameters_written_when_asked_and_when_not():
    tool = {"type": "function", "function": {"name": "book_flight", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "seats": {"type": "integer"}, "note": {"type": "string"},
        "class": {"type": "string"}}, "required": ["city"]}}}
    task = FunctionTask("book_flight-0", tool, "Book 2 seats to Oslo.", {"city": "Oslo", "seats": 2})
    call = [ToolCall("c1", "book_flight", json.dumps({"city": "Bergen", "note": "x"}))]
    # asked: city (written, wrong value) and seats (not written); not asked: note (written) and class
    assert argument_choices(task, call) == (1, 2, 1, 2)
    assert argument_choices(task, [ToolCall("c1", "book_flight", json.dumps(task.expected))]) == (2, 2, 0, 2)
    assert argument_choices(task, [ToolCall("c1", "book_hotel", "{}")]) is None
    assert argument_choices(task, call * 2) is None
