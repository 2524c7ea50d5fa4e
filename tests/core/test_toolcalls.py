import json

from forge_bridge.policies.toolcalls import parse_hermes


def test_well_formed_call_becomes_an_openai_tool_call():
    action = parse_hermes('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
                          "stop")
    assert action.content == "Let me add." and action.finish_reason == "tool_calls"
    (call,) = action.tool_calls
    assert call.name == "add" and json.loads(call.arguments) == {"a": 1} and call.id.startswith("call") and call.id.isalnum()


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


# ---------------------------------------------------------------------- other model families
import pytest  # noqa: E402

from forge_bridge.core.errors import InvalidArgument  # noqa: E402
from forge_bridge.policies.toolcalls import (  # noqa: E402
    detect_format,
    parse,
    parse_llama3_json,
    parse_mistral,
    split_reasoning,
)


def test_llama3_json_call_with_and_without_python_tag():
    for text in ('{"name": "add", "parameters": {"a": 1, "b": 2}}',
                 '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}'):
        action = parse_llama3_json(text, "stop")
        (call,) = action.tool_calls
        assert call.name == "add" and json.loads(call.arguments) == {"a": 1, "b": 2}
        assert action.content == "" and action.finish_reason == "tool_calls" and not action.parse_errors


def test_llama3_json_several_calls_plain_text_and_errors():
    action = parse_llama3_json('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', "stop")
    assert [c.name for c in action.tool_calls] == ["a", "b"]
    plain = parse_llama3_json("The answer is {probably} 5.", "stop")
    assert plain.content == "The answer is {probably} 5." and not plain.tool_calls and not plain.parse_errors
    bad = parse_llama3_json('{"name": "add", "parameters": {"a": 1,}', "length")
    assert not bad.tool_calls and bad.finish_reason == "length"
    assert bad.parse_errors[0]["error"] == "tool call is not valid JSON" and bad.content.startswith('{"name"')
    nameless = parse_llama3_json('<|python_tag|>{"parameters": {}}', "stop")
    assert nameless.parse_errors[0]["error"] == "tool call has no 'name' string"
    # an answer that is JSON is an answer, not a failed call
    for answer in ('{"city": "Paris", "population": 2102650}', '[1, 2, 3]', '{"total": 5'):
        plain = parse_llama3_json(answer, "stop")
        assert plain.content == answer and not plain.tool_calls and not plain.parse_errors


def test_mistral_list_format_and_content_before_it():
    action = parse_mistral('Adding now. [TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, '
                           '{"name": "mul", "arguments": {"b": 2}}]', "stop")
    assert action.content == "Adding now." and [c.name for c in action.tool_calls] == ["add", "mul"]
    assert json.loads(action.tool_calls[1].arguments) == {"b": 2} and action.finish_reason == "tool_calls"


def test_mistral_name_args_format_and_errors():
    action = parse_mistral('[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]neg[ARGS]{"x": 3}', "stop")
    assert [(c.name, json.loads(c.arguments)) for c in action.tool_calls] == [("add", {"a": 1, "b": 2}),
                                                                          ("neg", {"x": 3})]
    bad = parse_mistral('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}', "length")
    assert not bad.tool_calls and "not valid JSON" in bad.parse_errors[0]["error"]
    assert bad.content.startswith("[TOOL_CALLS]")  # the malformed call stays visible
    bad_args = parse_mistral("[TOOL_CALLS]add[ARGS]{a: 1}", "stop")
    assert bad_args.parse_errors[0]["error"] == "tool call 'arguments' is a string that is not JSON"
    mixed = parse_mistral('Hi [TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]neg[ARGS]{x}', "stop")
    assert [c.name for c in mixed.tool_calls] == ["add"]
    assert mixed.content == "Hi [TOOL_CALLS]neg[ARGS]{x}"  # only what could not be read stays as text
    assert parse_mistral("just text", "stop").content == "just text"


def test_reasoning_is_split_off_and_never_parsed_for_calls():
    text = ('<think>\nMaybe <tool_call>{"name": "multiply", "arguments": {}}</tool_call>? No, add.\n</think>\n'
            '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>')
    action = parse(text, "stop", "hermes")
    assert [c.name for c in action.tool_calls] == ["add"] and not action.parse_errors
    assert action.reasoning.startswith("Maybe <tool_call>") and action.reasoning.endswith("No, add.")
    assert action.to_dict()["reasoning"] == action.reasoning
    # the template opened the block in the prompt: the reply starts inside it
    assert split_reasoning("thinking...</think>The answer is 5.") == ("thinking...", "The answer is 5.")
    # cut by max_tokens while thinking: all of it is reasoning, no content, no calls
    cut = parse('<think>first <tool_call>{"name": "add"', "length", "hermes")
    assert cut.reasoning == 'first <tool_call>{"name": "add"' and cut.content == "" and not cut.tool_calls
    assert split_reasoning("no thinking here") == ("", "no thinking here")


def test_detect_format_from_templates_and_unknown_format():
    assert detect_format("{{ '[TOOL_CALLS]' + x }}") == "mistral"
    assert detect_format("<|start_header_id|>{{ role }}<|end_header_id|>") == "llama3_json"
    assert detect_format("<tool_call>\n{{ call | tojson }}\n</tool_call>") == "hermes"
    assert detect_format(None) == "hermes"
    with pytest.raises(InvalidArgument, match="tool_format"):
        parse("x", "stop", "pythonic")
