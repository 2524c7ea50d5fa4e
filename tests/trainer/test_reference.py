"""The KL reference can be frozen at the warm start (and survives a resume); the learning rate
warms up over the first optimizer steps; groups without reward signal still carry the KL."""

import pytest
import torch

import forge_bridge as fb
from forge_bridge.core.recording import transition_of
from forge_bridge.policies import models
from forge_bridge.trainer.logprobs import token_logprobs
from forge_bridge.trainer.learner import warm_up


@pytest.fixture()
def tiny_policy(tmp_path):
    policy = fb.LocalPolicy(str(models.save(*models.tiny(), tmp_path / "tiny")))
    yield policy
    policy.close()


def batch_of(trainer, n: int = 2, length: int = 12) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, trainer.tokenizer.vocab_size, (n, length), generator=g)
    loss_mask = torch.zeros(n, length)
    loss_mask[:, length // 2:] = 1
    return {"input_ids": ids, "attention_mask": torch.ones(n, length, dtype=torch.long), "loss_mask": loss_mask}


def current_logprobs(trainer, batch) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(trainer.model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])[0]


def nudge_lora(trainer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.5)


def test_the_frozen_reference_is_the_warm_start_and_survives_a_resume(tiny_policy, tmp_path):
    config = fb.GRPOConfig(kl_beta=0.1, out_dir=str(tmp_path / "run"), progress=False)
    trainer = fb.GRPOTrainer(tiny_policy, config)
    batch = batch_of(trainer)
    mask = batch["loss_mask"].bool()
    nudge_lora(trainer, 1)  # "SFT": the LoRA now differs from the base model
    warm = current_logprobs(trainer, batch)
    base = trainer.reference_logprobs(batch)  # nothing frozen yet: the base model
    assert not torch.allclose(base[mask], warm[mask], atol=1e-3)

    path = trainer.freeze_reference()
    assert (path / "adapter_model.safetensors").is_file()
    torch.testing.assert_close(trainer.reference_logprobs(batch), warm, atol=2e-4, rtol=1e-4)
    nudge_lora(trainer, 2)  # "RL" moves the policy; the reference stays at the warm start
    moved = current_logprobs(trainer, batch)
    assert not torch.allclose(moved[mask], warm[mask], atol=1e-3)
    torch.testing.assert_close(trainer.reference_logprobs(batch), warm, atol=2e-4, rtol=1e-4)
    assert all(not p.requires_grad for p in trainer.reference.model.parameters())

    resumed = fb.GRPOTrainer(tiny_policy, config)
    resumed.resume()
    torch.testing.assert_close(resumed.reference_logprobs(batch), warm, atol=2e-4, rtol=1e-4)


def test_the_learning_rate_warms_up_over_the_first_steps_and_resumes_where_it_was(tiny_policy, tmp_path):
    config = fb.GRPOConfig(lr=1e-3, warmup_steps=4, out_dir=str(tmp_path / "run"), progress=False)
    trainer = fb.GRPOTrainer(tiny_policy, config)
    params = [p for g in trainer.learner.optimizer.param_groups for p in g["params"]]

    def step() -> float:
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        lr = warm_up(trainer.learner.optimizer, trainer.learner.base_lrs["default"], config.warmup_steps)
        trainer.learner.optimizer.step()
        return lr

    assert [step() for _ in range(3)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4])
    trainer.run.iteration = 1
    trainer.save_checkpoint()
    resumed = fb.GRPOTrainer(tiny_policy, config)
    resumed.resume()
    trainer = resumed
    params = [p for g in trainer.learner.optimizer.param_groups for p in g["params"]]
    assert [step() for _ in range(2)] == pytest.approx([1e-3, 1e-3])
    with pytest.raises(ValueError, match="warmup_steps"):
        fb.GRPOConfig(warmup_steps=-1)


@pytest.mark.parametrize("skip, kl_beta", [(True, 0.1), (False, 0.1), (None, 0.1), (None, 0.0)])
def test_groups_without_reward_signal_are_kept_for_the_kl_when_asked(tiny_policy, tmp_path, skip, kl_beta):
    trainer = fb.GRPOTrainer(tiny_policy, fb.GRPOConfig(
        group_size=2, kl_beta=kl_beta, skip_uniform_groups=skip, out_dir=str(tmp_path / "run"),
        progress=False, concurrency=1))

    def rollout(task) -> float:
        messages = [{"role": "user", "content": task["id"]}]
        fb.current_episode().record(transition_of(tiny_policy.chat(messages, max_tokens=4), messages))
        return 1.0  # every rollout the same: no reward signal

    (metrics,) = trainer.train(rollout, [{"id": "same"}], iterations=1)
    # counted honestly either way: no group had signal, though the KL trains on it when kept
    assert metrics["groups_trained"] == 0 and metrics["groups_uniform"] == 1 and metrics["zero_signal_share"] == 1.0
    if skip or (skip is None and kl_beta == 0):  # the default: kept only for a KL term to train on
        assert metrics["batch_samples"] == 0
    else:
        assert metrics["batch_samples"] == 2
        assert metrics["kl"] == pytest.approx(0.0, abs=1e-3)  # the reference is the start
