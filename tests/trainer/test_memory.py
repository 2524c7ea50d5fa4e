"""Bounded memory: the estimate by hand, microbatches cut by a budget, the same step whatever
the cut, and a budget below one sequence refused when the trainer starts."""

from functools import partial

import pytest
import torch

import forge_bridge as fb
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.policies import models
from forge_bridge.trainer.memory import GiB, MemoryEstimate, chunk_by_budget, resident_gb
from forge_bridge.trainer.learner import microbatches

from test_accumulation import samples

MiB = 2 ** 20


def test_the_estimate_by_hand():
    flat = MemoryEstimate(resident_gb=1.0, linear=MiB, quadratic=0.0)
    assert flat.peak_gb(4, 256) == pytest.approx(2.0)  # 1 GiB + 4 * 256 tokens * 1 MiB
    assert flat.rows_that_fit(3.0, 256) == 8 and flat.rows_that_fit(1.1, 256) == 0
    eager = MemoryEstimate(resident_gb=1.0, linear=MiB, quadratic=1024.0)
    assert eager.peak_gb(1, 1024) == pytest.approx(3.0)  # 1024 * (1 MiB + 1024 * 1 KiB) = 2 GiB
    assert eager.rows_that_fit(5.0, 1024) == 2
    config = type("C", (), {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 4})()
    from forge_bridge.trainer.memory import ATTENTION_BYTES, CHECKPOINT_BYTES, LINEAR_BYTES

    assert MemoryEstimate.for_model(config, 0.5, 512) == MemoryEstimate(0.5, LINEAR_BYTES * 16, ATTENTION_BYTES * 8, 512)
    assert MemoryEstimate.for_model(config, 0.5, 512, checkpointing=True) == MemoryEstimate(
        0.5, (CHECKPOINT_BYTES * 2 + LINEAR_BYTES) * 8, ATTENTION_BYTES * 4, 512)
    sdpa_past_512 = MemoryEstimate(1.0, MiB, 1024.0, eager_up_to=512)  # no quadratic term past 512 tokens
    assert sdpa_past_512.peak_gb(1, 1024) == pytest.approx(2.0) and sdpa_past_512.peak_gb(1, 512) == pytest.approx(1.75)


def test_a_budget_cuts_the_sorted_lengths_into_the_largest_chunks_that_fit():
    estimate = MemoryEstimate(resident_gb=0.0, linear=MiB, quadratic=0.0)  # 1 GiB: 10 rows of 100
    assert chunk_by_budget([100, 100, 200, 400], estimate, 1.0) == [[0, 1, 2], [3]]
    assert chunk_by_budget([100] * 12, estimate, 1.0) == [list(range(10)), [10, 11]]
    with pytest.raises(InvalidArgument, match=r"max_memory_gb=1 holds no microbatch of one sequence of "
                                              r"max_seq_len=2000 tokens.*raise max_memory_gb to 3"):
        chunk_by_budget([100, 2000], estimate, 1.0)


def test_microbatches_follow_the_budget_and_size_still_caps_them():
    batch = samples(50)  # lengths 9, 14, 7, 11, 12
    per_token = GiB / (2 * 12)  # two rows of 12 tokens fill the budget
    chunker = partial(chunk_by_budget, estimate=MemoryEstimate(0.0, per_token, 0.0), budget_gb=1.0)
    cut = microbatches(batch, None, "token", chunker)
    assert [[len(s.input_ids) for s in chunk] for chunk, _ in cut] == [[7, 9], [11, 12], [14]]
    assert sum(w for _, w in cut) == pytest.approx(1.0)
    capped = microbatches(batch, 1, "token", chunker)
    assert [len(chunk) for chunk, _ in capped] == [1] * 5


def test_the_same_step_under_a_budget_and_an_impossible_budget_refused(tmp_path):
    policy = fb.LocalPolicy(str(models.save(*models.tiny(), tmp_path / "tiny")))
    grads = []
    for budget in (None, 1000.0):
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(
            lr=1e-2, minibatch_size=8, grad_clip=1e9, max_memory_gb=budget, out_dir=str(tmp_path / f"run-{budget}"),
            progress=False, seed=0, bf16=False))
        if budget is not None:  # a budget that holds two rows of the longest sample: three microbatches
            estimate = MemoryEstimate(0.0, GiB / (2 * 14), 0.0)
            trainer.learner.chunker = partial(chunk_by_budget, estimate=estimate, budget_gb=1.0)
        trainer.update(samples(trainer.tokenizer.vocab_size))
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad})
    for name, value in grads[0].items():
        torch.testing.assert_close(grads[1][name], value, atol=1e-5, rtol=1e-3)
    with pytest.raises(InvalidArgument, match=r"max_memory_gb=0.01 holds no microbatch .* the process holds"):
        fb.GRPOTrainer(policy, fb.GRPOConfig(max_memory_gb=0.01, out_dir=str(tmp_path / "small"), progress=False))
    assert resident_gb() > 0.01
    with pytest.raises(ValueError, match="max_memory_gb"):
        fb.GRPOConfig(max_memory_gb=0)
    policy.close()


def test_the_warm_start_takes_the_same_steps_within_the_budget(tmp_path):
    # SFT's steps are RL's optimizer step: under a budget that holds two rows of the longest
    # demonstration, no forward pass sees more rows, and the LoRA comes out as without a budget.
    from forge_bridge.core.types import Observation, Trajectory, Transition

    policy = fb.LocalPolicy(str(models.save(*models.tiny(), tmp_path / "tiny")))
    demos = [Trajectory(transitions=[Transition(
        observation=Observation(messages=[{"role": "user", "content": "q"}]), action=fb.Action(content="a"),
        prompt_token_ids=s.input_ids[:-3], completion_token_ids=s.input_ids[-3:],
        completion_logprobs=[0.0] * 3)]) for s in samples(50)]  # 5 demonstrations of 7 to 14 tokens
    weights, rows = [], []
    for budget in (None, 1000.0):
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(max_memory_gb=budget, out_dir=str(tmp_path / f"sft-{budget}"),
                                                       progress=False, seed=0, bf16=False))
        if budget is not None:
            trainer.learner.chunker = partial(chunk_by_budget, estimate=MemoryEstimate(0.0, GiB / (2 * 14), 0.0),
                                              budget_gb=1.0)
            logprobs = trainer.learner.logprobs
            trainer.learner.logprobs = lambda batch, *a, **k: rows.append(len(batch["input_ids"])) or logprobs(
                batch, *a, **k)
        fb.sft(trainer, demos, fb.SFTConfig(epochs=2, batch_size=8, publish=False))
        weights.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n})
    assert rows and max(rows) == 2 and len(rows) == 2 * 3  # 3 microbatches in each of the 2 steps
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, atol=1e-5, rtol=1e-3)  # Adam at lr 1e-3: steps of ~1e-3
    policy.close()


def test_long_batches_run_sdpa_and_score_as_eager_attention_does(tmp_path):
    policy = fb.LocalPolicy(str(models.save(*models.tiny(), tmp_path / "tiny")))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(out_dir=str(tmp_path / "run"), progress=False, bf16=False))
    batch = trainer.learner.collate(samples(trainer.tokenizer.vocab_size))  # 14 tokens
    base = trainer.model.get_base_model()
    scores = {}
    for eager_up_to in (1 << 30, 8):  # the second: 14 tokens count as long
        trainer.learner.eager_up_to = eager_up_to
        trainer.model.zero_grad()
        logp, _, _ = trainer.learner.logprobs(batch)
        (logp * batch["loss_mask"]).sum().backward()
        scores[base.config._attn_implementation] = (logp.detach(), [p.grad.clone() for p in trainer.model.parameters()
                                                                    if p.requires_grad])
    assert set(scores) == {"eager", "sdpa"}
    torch.testing.assert_close(scores["sdpa"][0], scores["eager"][0], atol=1e-5, rtol=1e-4)
    for a, b in zip(scores["sdpa"][1], scores["eager"][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)
    policy.close()
