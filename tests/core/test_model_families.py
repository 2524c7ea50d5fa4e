"""Each model family's own chat template renders the prompt, and its replies are parsed in its
own tool-call format: tiny models with a Llama 3.x-style and a Mistral-style tokenizer and
template (their special tokens included), and a Qwen3-style model that thinks first.

The templates here are written for these tests in each family's format (header tokens and a
bare JSON call for Llama 3.x; `[INST]`, `[AVAILABLE_TOOLS]` and `[TOOL_CALLS]` for Mistral).
"""

from __future__ import annotations

import json

import pytest

from forge_bridge.app import testing
from forge_bridge.policies import models
from forge_bridge.policies.local import LocalPolicy

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n\n"
    "{% if m.role == 'user' and loop.first and tools %}Given the following functions, respond with "
    'JSON {"name": function name, "parameters": dictionary of argument name and its value}.\n\n'
    "{% for t in tools %}{{ t | tojson }}\n\n{% endfor %}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}"
    '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments }}}{% endfor %}'
    '{% elif m.role == "tool" %}{"output": {{ m.content | tojson }}}{% else %}{{ m.content }}{% endif %}'
    "<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

MISTRAL = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}{% if tools and loop.first %}[AVAILABLE_TOOLS]{{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}'
    "{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}"
    "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{% endif %}{% endfor %}")

FAMILIES = {
    "llama3_json": (LLAMA3, ["<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>"], "<|eot_id|>",
                    '{"name": "add", "parameters": {"a": 2, "b": 3}}', "<|start_header_id|>user"),
    "mistral": (MISTRAL, ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                          "[TOOL_RESULTS]", "[/TOOL_RESULTS]"], "</s>",
                '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}]', "[AVAILABLE_TOOLS]"),
}


def family_model(tmp_path, family: str):
    template, special, eos, reply, _ = FAMILIES[family]
    tokenizer = models.tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": special, "eos_token": eos})
    tokenizer.chat_template = template
    model, tokenizer = models.tiny(tokenizer=tokenizer, seed=3)
    testing.teach(model, tokenizer, [(testing.ASK, [testing.ADD_TOOL], reply),
                                     (testing.AFTER_TOOL, [testing.ADD_TOOL], "The answer is 5.")], steps=200)
    return models.save(model, tokenizer, tmp_path / family)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_template_renders_and_its_calls_are_parsed(tmp_path, family):
    path = family_model(tmp_path, family)
    policy = LocalPolicy(str(path), dtype="float32")
    try:
        assert policy.tool_format == family  # detected from the model's own template
        prompt = policy.tokenizer.decode(policy.encode(testing.ASK, [testing.ADD_TOOL]))
        assert FAMILIES[family][4] in prompt and "<|im_start|>" not in prompt.replace(
            policy.tokenizer.bos_token, "")  # the family's template, not the Hermes fallback
        out = policy.chat(testing.ASK, [testing.ADD_TOOL], temperature=0, max_tokens=40)
        (call,) = out.action.tool_calls
        assert call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
        assert out.action.finish_reason == "tool_calls" and not out.action.parse_errors
        # the raw tokens stay exactly as sampled: Mistral's [TOOL_CALLS] token is among them
        raw = policy.tokenizer.decode(out.completion_token_ids)
        assert raw.startswith(FAMILIES[family][3][:12])
        # the call renders back into the next prompt in the family's format
        history = policy.tokenizer.decode(policy.encode(testing.ASK + [out.message], [testing.ADD_TOOL]))
        assert '"name": "add"' in history and "<tool_call>" not in history
        answer = policy.chat(testing.AFTER_TOOL, [testing.ADD_TOOL], temperature=0, max_tokens=40)
        assert answer.action.content == "The answer is 5." and not answer.action.tool_calls
    finally:
        policy.close()


def test_a_model_that_thinks_first_keeps_its_reasoning_out_of_the_call(tmp_path):
    model, tokenizer = models.tiny(seed=4)
    thought = "<think>\nThe user wants a sum, not a product.\n</think>\n"
    testing.teach(model, tokenizer, [(testing.ASK, [testing.ADD_TOOL], thought + testing.CALL)], steps=200)
    policy = LocalPolicy(models.save(model, tokenizer, tmp_path / "thinker"), dtype="float32")
    try:
        out = policy.chat(testing.ASK, [testing.ADD_TOOL], temperature=0, max_tokens=160)
        assert out.action.reasoning == "The user wants a sum, not a product."
        assert [c.name for c in out.action.tool_calls] == ["add"] and out.action.content == ""
        assert out.message["reasoning_content"] == out.action.reasoning
        assert "<think>" in policy.tokenizer.decode(out.completion_token_ids)  # trained on as sampled
    finally:
        policy.close()


def test_the_format_can_be_named_and_a_wrong_one_is_refused(tmp_path):
    from forge_bridge.core.errors import InvalidArgument

    model, tokenizer = models.tiny()
    with pytest.raises(InvalidArgument, match="tool_format"):
        LocalPolicy(model, tokenizer, tool_format="pythonic")
    policy = LocalPolicy(model, tokenizer, tool_format="llama3_json")
    try:
        assert policy.tool_format == "llama3_json"
    finally:
        policy.close()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_scripted_expert_writes_and_is_parsed_in_the_families_format(family):
    """Demonstrations for a Llama 3.x or Mistral model: the script writes the family's calls,
    the scripted policy parses them in that format (detected from the template), and the
    recorded tokens are the family's own (Mistral's [TOOL_CALLS] a single special token)."""
    from forge_bridge.core.errors import InvalidArgument
    from forge_bridge.policies.scripted import ScriptedPolicy

    template, special, eos, reply, _ = FAMILIES[family]
    tokenizer = models.tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": special, "eos_token": eos})
    tokenizer.chat_template = template
    expert = ScriptedPolicy(lambda messages, tools: reply, tokenizer)
    assert expert.tool_format == family
    out = expert.chat(testing.ASK, [testing.ADD_TOOL])
    (call,) = out.action.tool_calls
    assert call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    assert not out.action.parse_errors
    assert out.completion_token_ids[:-1] == tokenizer.encode(reply, add_special_tokens=False)
    if family == "mistral":
        assert out.completion_token_ids[0] == tokenizer.convert_tokens_to_ids("[TOOL_CALLS]")
    hermes = ScriptedPolicy(lambda messages, tools: reply, tokenizer, tool_format="hermes")
    assert not hermes.chat(testing.ASK, [testing.ADD_TOOL]).action.tool_calls  # not its format
    with pytest.raises(InvalidArgument, match="tool_format"):
        ScriptedPolicy(lambda messages, tools: reply, tokenizer, tool_format="pythonic")
