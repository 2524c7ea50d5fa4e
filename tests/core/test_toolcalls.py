import json

from forge_bridge.policies.toolcalls import parse_hermes


def test_well_formed_call_becomes_an_openai_tool_call():
    action = parse_hermes('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
                          "stop")
    assert action.content == "Let me add." and action.finish_reason == "tool_calls"
    (call,) = action.tool_calls
    assert call.name == "add" and json.loads(call.arguments) == {"a": 1} and call.id.startswith("call_")


def test_missing_close_tag_at_the_end_is_tolerated_and_string_arguments_are_decoded():
    action = parse_hermes('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}', "length")
    assert [c.name for c in action.tool_calls] == ["f"] and json.loads(action.tool_calls[0].arguments) == {"x": 2}
    assert action.finish_reason == "length"  # a cut-off generation stays a truncation


def test_malformed_call_stays_text_with_a_parse_error():
    text = '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>'
    action = parse_hermes(text, "stop")
    assert action.tool_calls == [] and action.finish_reason == "stop"
    assert action.content == text
    (err,) = action.parse_errors
    assert "not valid JSON" in err["error"] and err["text"] == text


def test_several_calls_and_bad_shapes():
    action = parse_hermes('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
                          '<tool_call>{"arguments": {}}</tool_call>'
                          '<tool_call>[1, 2]</tool_call>'
                          '<tool_call>{"name": "b", "arguments": 3}</tool_call>', "stop")
    assert [c.name for c in action.tool_calls] == ["a"]
    assert [e["error"] for e in action.parse_errors] == [
        "tool call has no 'name' string",
        "tool call must be a JSON object with 'name' and 'arguments'",
        "tool call 'arguments' must be a JSON object"]


def test_plain_text_is_untouched():
    action = parse_hermes("  The answer is 5. ", "stop")
    assert action.content == "The answer is 5." and not action.tool_calls and not action.parse_errors
