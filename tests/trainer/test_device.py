"""The trainer and the embedded policy pick their device ('auto': CUDA, then MPS, then CPU) and
keep their tensors there. This machine has no GPU: the CUDA path runs in `bench/gpu_check.sh`;
here the choice itself is checked, and the CPU path end to end."""

from __future__ import annotations

import pytest
import torch

from forge_bridge.core.errors import InvalidArgument, Unsupported
from forge_bridge.policies import models
from forge_bridge.policies.device import check_device, resolve_device
from forge_bridge.policies.local import LocalPolicy
from forge_bridge.policies.scripted import ScriptedPolicy
from forge_bridge.trainer.batch import Sample
from forge_bridge.trainer.config import GRPOConfig
from forge_bridge.trainer.grpo import GRPOTrainer


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"


def test_a_missing_device_is_an_error_not_a_silent_cpu_run():
    assert not torch.cuda.is_available()  # this machine; the GPU path is bench/gpu_check.sh
    with pytest.raises(Unsupported, match="no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(Unsupported, match="no CUDA GPU"):
        LocalPolicy(*models.tiny(), device="cuda:1")
    for bad in ("gpu", "cuda:x", "", 0):
        with pytest.raises(InvalidArgument, match="device"):
            check_device(bad)
    with pytest.raises(InvalidArgument, match="device"):
        GRPOConfig(device="tpu")
    with pytest.raises(InvalidArgument, match="gradient_checkpointing"):
        GRPOConfig(gradient_checkpointing="yes")


def _samples(n: int = 4):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(5, 300, (24,), generator=g).tolist()
        mask = [0] * 12 + [1] * 12
        out.append(Sample(input_ids=ids, loss_mask=mask, sampler_logprobs=[-5.0 * m for m in mask],
                          advantages=[(1.0 if i % 2 else -1.0) * m for m in mask]))
    return out


def _trainer(tmp_path, name: str, **config):
    model, tokenizer = models.tiny(seed=2)
    path = models.save(model, tokenizer, tmp_path / "model")
    policy = ScriptedPolicy(lambda m, t: "", tokenizer)
    return GRPOTrainer(policy, GRPOConfig(out_dir=str(tmp_path / name), progress=False, bf16=False,
                                          lr=1e-2, **config), model=str(path))


def test_the_trainer_keeps_model_optimizer_and_batches_on_its_device(tmp_path):
    trainer = _trainer(tmp_path, "auto")  # device="auto" is the default
    assert trainer.learner.device == "cpu"
    trainer.update(_samples())
    assert {p.device.type for p in trainer.model.parameters()} == {"cpu"}
    state = [t for s in trainer.learner.optimizer.state.values() for t in s.values()
             if isinstance(t, torch.Tensor) and t.dim() > 0]
    assert state and {t.device.type for t in state} == {"cpu"}
    assert {t.device.type for t in trainer.learner.collate(_samples(2)).values()} == {"cpu"}
    # the default KL reference is the base with the adapter disabled: no second copy of the model
    assert trainer.reference.model is None


def test_gradient_checkpointing_gives_the_same_update(tmp_path):
    plain = _trainer(tmp_path, "plain")
    checkpointed = _trainer(tmp_path, "ckpt", gradient_checkpointing=True)
    assert checkpointed.model.get_base_model().model.gradient_checkpointing
    a, b = plain.update(_samples()), checkpointed.update(_samples())
    assert a["grad_norm"] > 0 and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    trained = {n: p for n, p in plain.model.named_parameters() if p.requires_grad}
    for name, p in checkpointed.model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p, trained[name], rtol=1e-4, atol=1e-6)


def test_the_embedded_policy_runs_on_its_device():
    policy = LocalPolicy(*models.tiny(), device="auto", dtype="float32")
    try:
        assert policy.device == "cpu" and next(policy.model.parameters()).device.type == "cpu"
        out = policy.chat([{"role": "user", "content": "hi"}], temperature=1.0, max_tokens=5, seed=1)
        assert len(out.completion_token_ids) == len(out.completion_logprobs) >= 1
    finally:
        policy.close()


def test_a_named_model_is_read_in_the_policys_dtype_not_through_a_float32_copy(tmp_path, monkeypatch):
    path = models.save(*models.tiny(), tmp_path / "model")
    asked = []
    load = models.load
    monkeypatch.setattr(models, "load", lambda name, dtype=None: asked.append(dtype) or load(name, dtype=dtype))
    with pytest.raises(InvalidArgument, match="dtype"):
        LocalPolicy(str(path), dtype="float16")
    assert asked == []  # refused before anything was read
    policy = LocalPolicy(str(path), dtype="bfloat16")
    try:
        assert asked == [torch.bfloat16]
        assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    finally:
        policy.close()
