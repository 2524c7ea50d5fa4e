"""Messages as a chat template renders them: a call's arguments reach the template as an object."""

import json

from forge_bridge.policies.messages import template_messages


def call(arguments):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": arguments}}]}


def test_string_arguments_become_an_object_and_the_input_is_left_alone():
    messages = [{"role": "user", "content": "2 times 3?"}, call('{"a": 2, "b": 3}')]
    out = template_messages(messages)
    assert out[1]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 2, "b": 3}}
    assert out[1]["content"] == ""
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'


def test_arguments_that_are_not_a_json_object_stay_as_written():
    for arguments in ('{"a": 2,', "[1, 2]", '"text"', {"a": 2}):
        out = template_messages([call(arguments)])
        assert out[0]["tool_calls"][0]["function"]["arguments"] == arguments


def test_the_qwen_template_shows_the_call_as_the_model_was_asked_to_write_it():
    from transformers import AutoTokenizer

    from forge_bridge.policies.models import model_path

    tokenizer = AutoTokenizer.from_pretrained(model_path("qwen2.5-coder-0.5b-instruct"))
    text = tokenizer.apply_chat_template(template_messages([call('{"a": 2, "b": 3}')]), tokenize=False)
    shown = text.split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    assert json.loads(shown) == {"name": "multiply", "arguments": {"a": 2, "b": 3}}
