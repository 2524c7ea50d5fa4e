"""Tool calls as real models write them (`toolcalls.parse`, reading every format): each format,
only declared tools, the format recorded, and hostile replies that must stay text."""

import json

import pytest

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Action
from forge_bridge.policies.toolcalls import FORMATS, parse, render_calls

TOOLS = [{"type": "function", "function": {"name": "math_factorial", "parameters": {
    "type": "object", "properties": {"number": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_rate", "parameters": {
        "type": "object", "properties": {"base": {"type": "string"}, "target": {"type": "string"}}}}}]


def calls(action: Action) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in action.tool_calls]


@pytest.mark.parametrize("reply, fmt", [
    ('<tool_call>\n{"name": "math_factorial", "arguments": {"number": 5}}\n</tool_call>', "hermes"),
    ('```json\n{"name": "math_factorial", "arguments": {"number": 5}}\n```', "fenced_json"),
    ('```tool_call\n{"name": "math_factorial", "arguments": {"number": 5}}\n```', "fenced_json"),
    ('```\n{"name": "math_factorial", "arguments": {"number": 5}}\n```', "fenced_json"),
    ('```json\n[{"name": "math_factorial", "arguments": {"number": 5}}]\n```', "fenced_json"),
    ('{"name": "math_factorial", "arguments": {"number": 5}}', "json"),
    ('  {"name": "math_factorial", "parameters": {"number": 5}}\n', "json"),
    ('{"name": "math_factorial", "arguments": "{\\"number\\": 5}"}', "json"),
    ('{"type": "function", "function": {"name": "math_factorial", "arguments": {"number": 5}}}', "json"),
    ('<|python_tag|>{"name": "math_factorial", "parameters": {"number": 5}}', "llama3_json"),
    ('[TOOL_CALLS][{"name": "math_factorial", "arguments": {"number": 5}}]', "mistral"),
    ('```tool_code\nmath_factorial(number=5)\n```', "tool_code"),
    ('```tool_code\nprint(math_factorial(number=5))\n```', "tool_code"),
    ('```tool_code\nmath_factorial(5)\n```', "tool_code"),  # positional, in the schema's order
])
def test_each_format_is_read_as_the_call_and_recorded(reply, fmt):
    action = parse(reply, "stop", tools=TOOLS)
    assert calls(action) == [("math_factorial", {"number": 5})]
    assert action.call_format == fmt and action.finish_reason == "tool_calls"
    assert action.content == "" and not action.parse_errors
    strict = parse(reply, "stop", fmt, TOOLS)  # the strict mode reads its own format
    assert calls(strict) == [("math_factorial", {"number": 5})]


def test_several_calls_in_one_reply_and_prose_before_a_fence():
    two = parse('```json\n[{"name": "math_factorial", "arguments": {"number": 5}}, '
                '{"name": "get_rate", "arguments": {"base": "EUR"}}]\n```', "stop", tools=TOOLS)
    assert calls(two) == [("math_factorial", {"number": 5}), ("get_rate", {"base": "EUR"})]
    fences = parse('First the rate.\n```json\n{"name": "get_rate", "arguments": {"base": "EUR"}}\n```\n'
                   '```json\n{"name": "math_factorial", "arguments": {"number": 3}}\n```', "stop", tools=TOOLS)
    assert calls(fences) == [("get_rate", {"base": "EUR"}), ("math_factorial", {"number": 3})]
    assert fences.content == "First the rate."
    semis = parse('{"name": "get_rate", "arguments": {"base": "EUR"}}; {"name": "math_factorial", '
                  '"arguments": {"number": 1}}', "stop", tools=TOOLS)
    assert [n for n, _ in calls(semis)] == ["get_rate", "math_factorial"]
    code = parse('```tool_code\n[get_rate(base="EUR", target="USD"), math_factorial(number=2)]\n```', "stop",
                 tools=TOOLS)
    assert calls(code) == [("get_rate", {"base": "EUR", "target": "USD"}), ("math_factorial", {"number": 2})]


@pytest.mark.parametrize("reply", [
    '```json\n{"name": "delete_everything", "arguments": {}}\n```',           # an undeclared tool
    '{"name": "delete_everything", "arguments": {}}',
    '{"city": "Paris", "population": 2102650}',                                # an answer that is JSON
    '```json\n{"number": 5}\n```',                                             # arguments, no name
    'You can compute it like this:\n```python\nimport math\nprint(math.factorial(5))\n```\nThe result is 120.',
    'Call it as `math_factorial(number=5)` when you need it.',                 # a call in prose
    'Here is the format:\n````markdown\n```json\n{"name": "math_factorial", "arguments": {"number": 5}}\n```\n````',
    'The answer is 120.',
])
def test_hostile_replies_stay_text(reply):
    action = parse(reply, "stop", tools=TOOLS)
    assert action.tool_calls == [] and action.parse_errors == [] and action.call_format == ""
    assert action.content == reply.strip() and action.finish_reason == "stop"


def test_a_marked_call_to_an_undeclared_tool_is_a_call_for_the_framework_to_refuse():
    """As vLLM's parsers read it: the agent's framework answers with an error result and goes on."""
    reply = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    action = parse(reply, "stop", tools=TOOLS)
    assert calls(action) == [("rm_rf", {})] and action.call_format == "hermes" and not action.parse_errors
    code = parse("```tool_code\nrm_rf(path='/')\n```", "stop", tools=TOOLS)  # Python: declared tools only
    assert code.tool_calls == [] and code.malformed and "does not declare" in code.parse_errors[0]["error"]


def test_a_half_written_call_at_the_length_limit_is_a_parse_error_trained_as_the_action():
    for reply in ('```json\n{"name": "math_factorial", "arguments": {"num', '{"name": "math_factorial", "argu',
                  '```tool_code\nmath_factorial(number='):
        action = parse(reply, "length", tools=TOOLS)
        assert action.tool_calls == [] and action.finish_reason == "length"
        assert action.malformed and action.content == reply
        assert action.parse_errors[0]["text"].startswith(reply[:10])


def test_no_tools_declared_means_no_unmarked_call_and_none_means_any_name():
    reply = '```json\n{"name": "anything", "arguments": {}}\n```'
    assert parse(reply, "stop", tools=[]).tool_calls == []
    assert [c.name for c in parse(reply, "stop").tool_calls] == ["anything"]


def test_strict_mode_reads_one_format_only():
    fenced = '```json\n{"name": "math_factorial", "arguments": {"number": 5}}\n```'
    assert parse(fenced, "stop", "hermes", TOOLS).tool_calls == []
    assert parse(fenced, "stop", "json", TOOLS).tool_calls == []
    hermes = '<tool_call>\n{"name": "math_factorial", "arguments": {"number": 5}}\n</tool_call>'
    assert parse(hermes, "stop", "fenced_json", TOOLS).tool_calls == []
    with pytest.raises(InvalidArgument, match="tool_format: expected one of"):
        parse(fenced, "stop", "pythonic", TOOLS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_what_it_reads(fmt):
    text = render_calls("", [("get_rate", {"base": "EUR", "target": "USD"})], fmt)
    action = parse(text, "stop", fmt, TOOLS)
    assert calls(action) == [("get_rate", {"base": "EUR", "target": "USD"})] and action.call_format == fmt


def test_the_format_is_recorded_on_the_step_and_round_trips():
    action = parse('```json\n{"name": "math_factorial", "arguments": {"number": 5}}\n```', "stop", tools=TOOLS)
    again = Action.from_dict(json.loads(json.dumps(action.to_dict())))
    assert again.call_format == "fenced_json" and calls(again) == calls(action)
    assert "call_format" not in parse("hi", "stop", tools=TOOLS).to_dict()  # older readers see nothing new


def test_the_iteration_counts_the_share_of_each_format():
    from forge_bridge.core.types import Observation, Trajectory, Transition
    from forge_bridge.trainer.rollouts import call_formats

    def step(reply: str) -> Transition:
        return Transition(observation=Observation(messages=[{"role": "user", "content": "q"}], tools=TOOLS),
                          action=parse(reply, "stop", tools=TOOLS), prompt_token_ids=[1], completion_token_ids=[2],
                          completion_logprobs=[-0.1])

    fenced = '```json\n{"name": "math_factorial", "arguments": {"number": 5}}\n```'
    hermes = '<tool_call>\n{"name": "get_rate", "arguments": {"base": "EUR"}}\n</tool_call>'
    trajectories = [Trajectory(transitions=[step(fenced), step("120")]),
                    Trajectory(transitions=[step(fenced), step(hermes), step('<tool_call>{"name": "x"')])]
    assert call_formats(trajectories) == {"fenced_json": 0.5, "hermes": 0.25, "malformed": 0.25}


def test_the_vllm_client_reads_the_raw_text_itself():
    """The server's own tool parser stays out (`tool_choice: "none"`, markers kept in the text), and
    the reply is read like every other policy's: a fenced call becomes a call."""
    import httpx

    from forge_bridge.policies.vllm import VLLMPolicy

    sent = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        reply = '```json\n{"name": "get_rate", "arguments": {"base": "EUR"}}\n```'
        return httpx.Response(200, json={"prompt_token_ids": [1, 2], "choices": [{
            "message": {"role": "assistant", "content": reply}, "finish_reason": "stop",
            "token_ids": [3, 4, 5], "logprobs": {"content": [{"logprob": -0.1}] * 3}}]})

    policy = VLLMPolicy("http://127.0.0.1:1/v1")
    policy._client = httpx.Client(transport=httpx.MockTransport(server))
    out = policy.chat([{"role": "user", "content": "EUR rate?"}], TOOLS)
    assert calls(out.action) == [("get_rate", {"base": "EUR"})] and out.action.call_format == "fenced_json"
    assert sent[0]["tool_choice"] == "none" and sent[0]["skip_special_tokens"] is False and sent[0]["tools"] == TOOLS
    plain = policy.chat([{"role": "user", "content": "hi"}])
    assert plain.action.tool_calls == [] and "tool_choice" not in sent[1]


@pytest.mark.parametrize("reply", [
    '[{"name": "get_rate", "description": "Exchange rates"}, {"name": "math_factorial", "description": "n!"}]',
    '{"name": "get_rate", "type": "function", "description": "rates", "parameters": {"type": "object"}}',
    '{"name": "get_rate"}',                                     # no arguments: not a call object
    '{"name": "Alice", "age": 3}',
])
def test_json_that_lists_or_echoes_tools_is_not_a_call(reply):
    action = parse(reply, "stop", tools=TOOLS)
    assert action.tool_calls == [] and action.content == reply


def test_several_formats_in_one_reply_are_all_read_and_markers_in_prose_do_not_hide_calls():
    hermes = '<tool_call>{"name": "get_rate", "arguments": {"base": "EUR"}}</tool_call>'
    noted = parse(hermes + "\nNote: Llama uses <|python_tag|>.", "stop", tools=TOOLS)
    assert calls(noted) == [("get_rate", {"base": "EUR"})] and not noted.parse_errors
    assert noted.content == "Note: Llama uses <|python_tag|>."
    both = parse('```json\n{"name": "math_factorial", "arguments": {"number": 4}}\n```\n' + hermes, "stop", tools=TOOLS)
    assert sorted(calls(both)) == [("get_rate", {"base": "EUR"}), ("math_factorial", {"number": 4})]
    assert both.content == "" and both.call_format == "hermes"


def test_crlf_fences_a_bare_call_before_prose_and_cut_calls():
    crlf = parse('```json\r\n{"name": "get_rate", "arguments": {}}\r\n```\r\nDone.', "stop", tools=TOOLS)
    assert calls(crlf) == [("get_rate", {})] and crlf.content == "Done." and not crlf.parse_errors
    prose = parse('{"name": "get_rate", "arguments": {"base": "EUR"}}\nI have called the tool.', "stop", tools=TOOLS)
    assert calls(prose) == [("get_rate", {"base": "EUR"})] and prose.content == "I have called the tool."
    for cut in ('```json\n{"name": "get_r', '```json\n{"arguments": {"base": "EUR"}, "name": "get_rate"',
                '{"name": "get_ra'):
        action = parse(cut, "length", tools=TOOLS)
        assert action.tool_calls == [] and action.malformed, cut


@pytest.mark.parametrize("reply", [
    "```tool_code\nget_rate(base={1, 2})\n```", "```tool_code\nget_rate(base=b'x')\n```",
    "```tool_code\nmath_factorial(number=1e999)\n```", "```tool_code\nmath_factorial(5, number=6)\n```",
    "```tool_code\nget_rate(*a)\n```", "```tool_code\nprint()\n```", "```tool_code\nx = 1\n```",
    "```tool_code\nget_rate(base=" + "1+" * 20000 + "1)\n```",
    "[" * 5000, "```json\n" + "[" * 5000 + "\n```", '<tool_call>' + "[" * 5000 + '</tool_call>',
])
def test_odd_replies_are_malformed_calls_or_text_never_an_exception(reply):
    action = parse(reply, "stop", tools=TOOLS)
    assert action.tool_calls == [] and action.content == reply


@pytest.mark.timeout(60)
def test_a_long_line_after_a_fence_marker_does_not_backtrack():
    reply = "```" + "x" * 200_000 + "`"  # quadratic: 64 s at 100 KB, so hours here; linear: milliseconds
    assert parse(reply, "stop", tools=TOOLS).tool_calls == []


def test_odd_schemas_and_unwritable_tool_code_are_clear():
    from forge_bridge.policies.toolcalls import declared

    assert declared([{"function": {"name": "f", "parameters": "x"}}, "junk"]) == {"f": []}
    with pytest.raises(InvalidArgument, match="Python call syntax cannot"):
        render_calls("", [("convert", {"from": "EUR"})], "tool_code")
