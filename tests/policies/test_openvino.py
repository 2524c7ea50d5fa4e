"""OpenVINOPolicy (policies/openvino.py) against LocalPolicy and the trainer's own log-probabilities:
the same prompt tokens, the same greedy tokens, the same log-probabilities up to float rounding,
adapters that change outputs as they do in LocalPolicy, and hot swaps under load in which every
call is served by exactly one complete version. Both run in float32 here (the IR's weights, the
CPU plugin's precision and the KV cache), so the two differ by rounding only."""

import asyncio
import subprocess
import sys
import threading
import uuid

import pytest

from forge_bridge.app import testing
from forge_bridge.core.errors import AdapterError, ContextLengthExceeded, InvalidArgument, PolicyError

pytest.importorskip("openvino_genai", reason="openvino-genai is not installed (make test installs it)")

from forge_bridge.policies import models  # noqa: E402
from forge_bridge.policies.local import LocalPolicy  # noqa: E402
from forge_bridge.policies.openvino import OpenVINOConfig, OpenVINOPolicy  # noqa: E402
from forge_bridge.policies.openvino_ir import ExportError, find_exporter_python  # noqa: E402

try:
    find_exporter_python()
except ExportError as exc:  # make test builds .venv-openvino
    pytest.skip(f"no OpenVINO exporter: {exc}", allow_module_level=True)

GREEDY = {"temperature": 0, "max_tokens": 48}
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The taught adapters' targets (testing.teach_adapter trains every linear layer)."""


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def ov_policy(taught_model_dir):
    with OpenVINOPolicy(str(taught_model_dir), OpenVINOConfig(lora_targets=ALL_LINEAR)) as policy:
        yield policy


@pytest.fixture(scope="module")
def local_fp32(taught_model_dir):
    with LocalPolicy(str(taught_model_dir), dtype="float32") as policy:
        yield policy


def test_calls_give_the_local_policys_prompt_tokens_greedy_tokens_and_logprobs(ov_policy, local_fp32):
    for messages in (testing.ASK, testing.AFTER_TOOL):
        ours = ov_policy.chat(messages, tools=[testing.ADD_TOOL], **GREEDY)
        theirs = local_fp32.chat(messages, tools=[testing.ADD_TOOL], **GREEDY)
        assert ours.prompt_token_ids == theirs.prompt_token_ids
        assert ours.completion_token_ids == theirs.completion_token_ids
        assert ours.text == theirs.text and ours.finish_reason == theirs.finish_reason
        assert max(abs(a - b) for a, b in zip(ours.completion_logprobs, theirs.completion_logprobs)) < 1e-3
    assert ours.text == "The answer is 5." and ours.completion_token_ids[-1] == ov_policy.eos_id
    first = ov_policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    assert first.finish_reason == "tool_calls" and first.tool_calls[0]["function"]["name"] == "add"


def test_sampled_logprobs_are_the_trainers_at_the_sampling_temperature(ov_policy, taught_model_dir):
    """What TIS compares: log softmax(logits / T) at the sampled ids, as the trainer scores them."""
    import torch

    from forge_bridge.trainer.logprobs import token_logprobs

    model = models.load(str(taught_model_dir))[0].float().eval()
    for temperature in (1.0, 0.5):
        out = ov_policy.chat([{"role": "user", "content": "Tell me a long story."}], temperature=temperature,
                             max_tokens=24, seed=3)
        ids = torch.tensor([out.prompt_token_ids + out.completion_token_ids])
        mask = torch.zeros_like(ids, dtype=torch.float32)
        mask[0, len(out.prompt_token_ids):] = 1
        with torch.no_grad():
            trainer = token_logprobs(model, ids, torch.ones_like(ids), mask,
                                     temperature=torch.tensor([temperature]))[0][0, len(out.prompt_token_ids):]
        gap = (torch.tensor(out.completion_logprobs) - trainer).abs().max().item()
        assert len(out.completion_logprobs) == len(out.completion_token_ids) > 0
        assert gap < 1e-3, (temperature, gap)


def test_a_seeded_call_samples_the_same_tokens_alone_or_batched(ov_policy):
    messages = [{"role": "user", "content": "Tell me a long story."}]
    alone = [ov_policy.chat(messages, temperature=1.0, max_tokens=16, seed=s) for s in range(4)]
    batched: list = [None] * 8

    def call(i: int) -> None:
        batched[i] = ov_policy.chat(messages, temperature=1.0, max_tokens=16, seed=i % 4)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [o.completion_token_ids for o in batched] == [o.completion_token_ids for o in alone] * 2
    assert len({tuple(o.completion_token_ids) for o in alone}) > 1


def test_an_adapter_changes_outputs_as_it_does_in_the_local_policy(ov_policy, local_fp32, adapter_dirs):
    base = ov_policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    for name in ("v1", "v2"):
        version = unique(name)
        ov_policy.load_adapter(adapter_dirs[name], version)
        local_fp32.load_adapter(adapter_dirs[name], version)
        ours = ov_policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
        theirs = local_fp32.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
        assert ours.version == version and ours.completion_token_ids != base.completion_token_ids
        assert ours.completion_token_ids == theirs.completion_token_ids and ours.text == theirs.text
        assert max(abs(a - b) for a, b in zip(ours.completion_logprobs, theirs.completion_logprobs)) < 1e-3
    assert "Version two" in ours.text
    ov_policy.rollback()
    ov_policy.rollback()
    again = ov_policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
    assert again.version is None and again.completion_token_ids == base.completion_token_ids


def test_hot_swaps_under_load_serve_each_call_with_one_complete_version(ov_policy, adapter_dirs):
    """Calls flow from 8 threads while versions are published one after another: every output
    is exactly the reply of the version it names, never a mix (a half-applied adapter, or a swap
    between a call's prefill and its decoding)."""
    names = [unique(f"s{i}") for i in range(6)]
    sources = [adapter_dirs["v1" if i % 2 == 0 else "v2"] for i in range(6)]
    reference, kind = {}, {name: "v1" if i % 2 == 0 else "v2" for i, name in enumerate(names)}
    for version_of in ("v1", "v2"):
        probe = unique(f"ref-{version_of}")
        kind[probe] = version_of
        ov_policy.load_adapter(adapter_dirs[version_of], probe)
        reference[version_of] = ov_policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY).completion_token_ids
    assert reference["v1"] != reference["v2"]
    outputs, errors = [], []
    stop = threading.Event()

    def agent() -> None:
        while not stop.is_set():
            try:
                outputs.append(ov_policy.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY))
            except Exception as exc:  # collected: an exception in a thread would vanish
                errors.append(exc)

    threads = [threading.Thread(target=agent) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        for name, source in zip(names, sources):
            ov_policy.load_adapter(source, name)
            served = len(outputs)
            while len(outputs) < served + 8 and not errors:
                stop.wait(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert errors == []
    mine = [o for o in outputs if o.version in kind]
    assert len({o.version for o in mine}) >= 4
    assert all(o.completion_token_ids == reference[kind[o.version]] for o in mine)


def test_async_calls_batch_and_name_their_version(ov_policy):
    async def run():
        return await asyncio.gather(*(ov_policy.achat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL], **GREEDY)
                                      for _ in range(4)))

    outs = asyncio.run(run())
    assert len({tuple(o.completion_token_ids) for o in outs}) == 1
    assert all(o.version == ov_policy.current() for o in outs)


def test_adapters_it_cannot_serve_exactly_are_refused_and_the_live_version_keeps_serving(
        taught_model_dir, adapter_dirs, tmp_path):
    import json
    import shutil

    with OpenVINOPolicy(str(taught_model_dir)) as narrow:  # declares q, k, v, o only
        with pytest.raises(AdapterError, match="lora_targets"):
            narrow.load_adapter(adapter_dirs["v1"], unique("n"))
        assert narrow.current() is None
        base = narrow.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
        dora = shutil.copytree(adapter_dirs["v1"], tmp_path / "dora")
        config = json.loads((dora / "adapter_config.json").read_text())
        (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
        with pytest.raises(AdapterError, match="use_dora"):
            narrow.load_adapter(dora, unique("d"))
        other_model, other_tok = models.tiny(hidden_size=128, heads=4, kv_heads=2)
        wrong = testing.teach_adapter(other_model, other_tok, [(testing.ASK, None, "x")], tmp_path / "wrong", steps=1)
        with pytest.raises(AdapterError):
            narrow.load_adapter(wrong, unique("w"))
        after = narrow.chat(testing.ASK, tools=[testing.ADD_TOOL], **GREEDY)
        assert after.version is None and after.completion_token_ids == base.completion_token_ids


def test_bad_settings_and_calls_are_clear_errors(ov_policy, taught_model_dir):
    with pytest.raises(InvalidArgument, match="precision"):
        OpenVINOConfig(precision="f64")
    with pytest.raises(InvalidArgument, match="max_batch"):
        OpenVINOConfig(max_batch=0)
    with pytest.raises(InvalidArgument, match="lora_targets"):
        OpenVINOPolicy(str(taught_model_dir), OpenVINOConfig(lora_targets=("no_such_proj",)))
    with pytest.raises(ContextLengthExceeded):
        ov_policy.chat([{"role": "user", "content": " ".join(["hi"] * 20000)}], max_tokens=4)
    with pytest.raises(InvalidArgument, match="explore"):
        ov_policy.chat(testing.AFTER_TOOL, temperature=1.0, explore=0.5)
    while ov_policy.current() is not None:  # the base model, whatever an earlier test published
        ov_policy.rollback()
    out = ov_policy.chat(testing.AFTER_TOOL, tools=[testing.ADD_TOOL], temperature=0, max_tokens=2)
    assert out.finish_reason == "length" and len(out.completion_token_ids) == 2


def test_a_closed_policy_refuses_calls(taught_model_dir):
    policy = OpenVINOPolicy(str(taught_model_dir))
    policy.close()
    with pytest.raises(PolicyError, match="closed"):
        policy.chat(testing.ASK, **GREEDY)


def test_smollm2_greedy_tokens_and_logprobs_match_the_local_policy_in_float32(tmp_path):
    """The embedded 135M (its IR exported once into the test cache): the same tokens and
    log-probabilities within float rounding, on the base and with an adapter of nonzero weights
    on the trainer's default targets."""
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    with models.peft_wrapping():
        lora = get_peft_model(models.load("smollm2-135m-instruct")[0].float(), LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    for name, weight in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(weight, std=0.05)
    lora.save_pretrained(str(tmp_path / "adapter"))
    del lora
    messages = [{"role": "user", "content": "What is 2 plus 3? Answer in one sentence."}]
    with OpenVINOPolicy("smollm2-135m-instruct") as ov_policy, \
            LocalPolicy("smollm2-135m-instruct", dtype="float32") as local:
        outputs = []
        for version in (None, "tuned"):
            if version:
                ov_policy.load_adapter(tmp_path / "adapter", version)
                local.load_adapter(tmp_path / "adapter", version)
            ours, theirs = ov_policy.chat(messages, **GREEDY), local.chat(messages, **GREEDY)
            assert ours.prompt_token_ids == theirs.prompt_token_ids
            assert ours.completion_token_ids == theirs.completion_token_ids
            assert np.max(np.abs(np.subtract(ours.completion_logprobs, theirs.completion_logprobs))) < 1e-3
            outputs.append(ours)
        assert outputs[0].completion_logprobs != outputs[1].completion_logprobs


def test_import_forge_bridge_loads_no_openvino():
    code = "import sys, forge_bridge; assert not any(m.startswith('openvino') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
