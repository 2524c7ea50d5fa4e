"""Samples come from the recorded token ids, with the loss on completions only."""

from random import Random

import pytest
import torch

from forge_bridge.core.errors import ForgeBridgeError
from forge_bridge.core.types import Action, Observation, Trajectory, Transition
from forge_bridge.trainer.advantages import all_token_advantages
from forge_bridge.trainer.batch import build_samples, collate, trained_tokens_per_step
from forge_bridge.trainer.learner import plan


def step(prompt, completion, logprobs=None):
    return Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]),
                      action=Action(content="a"), prompt_token_ids=prompt, completion_token_ids=completion,
                      completion_logprobs=logprobs if logprobs is not None else [-0.5] * len(completion))


def test_one_sample_per_call_with_completion_mask_logprobs_and_advantages():
    traj = Trajectory(transitions=[step([1, 2, 3], [4, 5], [-0.1, -0.2]), step([1, 2, 9], [6], [-0.3])])
    samples, stats = build_samples([traj], [torch.tensor([0.5, -1.0])], max_len=64)
    assert [s.input_ids for s in samples] == [[1, 2, 3, 4, 5], [1, 2, 9, 6]]
    assert samples[0].loss_mask == [0, 0, 0, 1, 1] and samples[1].loss_mask == [0, 0, 0, 1]
    assert samples[0].sampler_logprobs == [0, 0, 0, -0.1, -0.2]
    assert samples[0].advantages == [0, 0, 0, 0.5, 0.5] and samples[1].advantages == [0, 0, 0, -1.0]
    assert samples[0].value_positions == [2] and samples[0].steps == [(traj.id, 0)]
    assert stats.samples == 2 and stats.trained_tokens == 3 and stats.merged_steps == 0


def test_merge_when_the_next_prompt_extends_the_sequence_exactly():
    first = step([1, 2], [3, 4])
    second = step([1, 2, 3, 4, 7, 8], [9])  # 7, 8: the tool result, not trained on
    third = step([1, 2, 5], [6])  # re-serialised history: not an extension, a new sample
    traj = Trajectory(transitions=[first, second, third])
    samples, stats = build_samples([traj], [torch.tensor([1.0, 2.0, 3.0])], 64, merge=True)
    assert [s.input_ids for s in samples] == [[1, 2, 3, 4, 7, 8, 9], [1, 2, 5, 6]]
    assert samples[0].loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert samples[0].advantages == [0, 0, 1.0, 1.0, 0, 0, 2.0]
    assert samples[0].value_positions == [1, 5] and stats.merged_steps == 1


def test_too_long_sequences_are_truncated_or_counted_never_silently_dropped():
    traj = Trajectory(transitions=[step([1] * 6, [2, 3, 4]), step([1] * 10, [5])])
    samples, stats = build_samples([traj], [torch.tensor([1.0, 1.0])], max_len=8)
    (kept,) = samples
    assert kept.input_ids == [1] * 6 + [2, 3] and kept.cut and kept.loss_mask[-2:] == [1, 1]
    assert stats.cut == 1 and stats.too_long == 1


def test_steps_without_tokens_are_left_out_and_counted():
    traj = Trajectory(transitions=[step([], []), step([1], [2])])
    samples, stats = build_samples([traj], [torch.tensor([1.0, 1.0])], 64)
    assert len(samples) == 1 and stats.untrainable_steps == 1


def test_collate_right_pads():
    traj = Trajectory(transitions=[step([1, 2], [3]), step([4], [5, 6, 7])])
    samples, _ = build_samples([traj], [torch.tensor([1.0, 2.0])], 64)
    batch = collate(samples, pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0], [4, 5, 6, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]
    assert batch["value_positions"].tolist() == [[1], [0]] and batch["value_mask"].tolist() == [[1], [1]]


def test_trained_tokens_per_step_follow_merging_and_the_length_cut():
    first, second = step([1, 2], [3, 4]), step([1, 2, 3, 4, 7, 8], [9, 10, 11])  # 7, 8: a tool result
    traj = Trajectory(transitions=[first, second, step([5], [6])])
    merged, _ = build_samples([traj], [torch.tensor([1.0, 2.0, 3.0])], 64, merge=True)
    assert trained_tokens_per_step(merged) == {(traj.id, 0): 2, (traj.id, 1): 3, (traj.id, 2): 1}
    cut, _ = build_samples([traj], [torch.tensor([1.0, 2.0, 3.0])], 7, merge=True)  # [1 2 3 4 7 8 9 | 10 11]
    assert trained_tokens_per_step(cut) == {(traj.id, 0): 2, (traj.id, 1): 1, (traj.id, 2): 1}
    gone, _ = build_samples([traj], [torch.tensor([1.0, 2.0, 3.0])], 5, merge=True)  # step 1's completion cut away
    assert trained_tokens_per_step(gone) == {(traj.id, 0): 2, (traj.id, 1): 0, (traj.id, 2): 1}


def test_trained_tokens_stay_with_their_step_when_merged_steps_touch():
    # the next prompt is exactly the previous prompt + completion: no gap between the two completions
    traj = Trajectory(transitions=[step([1, 2], [3, 4]), step([1, 2, 3, 4], [5, 6]), step([1, 2, 3, 4, 5, 6, 7], [8])])
    samples, _ = build_samples([traj], [torch.tensor([1.0, 2.0, 3.0])], 64, merge=True)
    assert len(samples) == 1 and samples[0].loss_mask == [0, 0, 1, 1, 1, 1, 0, 1]
    assert trained_tokens_per_step(samples) == {(traj.id, 0): 2, (traj.id, 1): 2, (traj.id, 2): 1}


def test_span_rewards_reach_their_tokens_through_merging_and_the_length_cut():
    first = step([1, 2], [3, 4])
    second = step([1, 2, 3, 4, 7], [8, 9, 10])
    second.info["span_rewards"] = [[1, 3, -1.0], [0, 1, 2.0]]
    traj = Trajectory(transitions=[first, second])
    tokens = all_token_advantages([traj], [torch.tensor([1.0, 0.5])], span_weight=0.5)  # the recorded spans
    (sample,), _ = build_samples([traj], tokens, 64, merge=True)
    # prompt 1 2 | 3 4 (step 0: 1.0) | 7 (tool result) | 8 (0.5 + 1.0) 9 10 (0.5 - 0.5)
    assert sample.advantages == [0, 0, 1.0, 1.0, 0, 1.5, 0.0, 0.0]
    (cut,), stats = build_samples([traj], tokens, 7, merge=True)
    assert cut.advantages == [0, 0, 1.0, 1.0, 0, 1.5, 0.0] and stats.cut == 1
    (plain,), _ = build_samples([traj], [torch.tensor([1.0, 0.5])], 64, merge=True)  # a value per step
    assert plain.advantages == [0, 0, 1.0, 1.0, 0, 0.5, 0.5, 0.5]
    # distillation's per-token rewards enter in the same stage, where given (None: a step unscored)
    distilled = all_token_advantages([traj], [torch.tensor([1.0, 0.5])], 0.5, distillation=[[None, [0.1, 0.2, 0.3]]])
    (both,), _ = build_samples([traj], distilled, 64, merge=True)
    assert both.advantages == pytest.approx([0, 0, 1.0, 1.0, 0, 1.6, 0.2, 0.3])
    with pytest.raises(ForgeBridgeError, match="2 for a step of 3 completion tokens"):
        build_samples([traj], [[1.0, [0.1, 0.2]]], 64)


def test_merged_steps_give_the_per_step_loss_and_gradients_for_fewer_tokens():
    """Ten model calls of one episode, each prompt the last prompt + its completion + a tool
    result: merged into one sequence, the objective and every LoRA gradient are those of ten
    per-step sequences (causal attention: a token sees the same tokens either way), for far fewer
    tokens through the model. Each step keeps its own advantage on its own tokens; tool results
    are not trained on. A step the front end re-serialised is its own sample and is counted."""
    from peft import LoraConfig, get_peft_model

    from forge_bridge.policies import models
    from forge_bridge.trainer.logprobs import token_logprobs
    from forge_bridge.trainer.losses import policy_objective
    from forge_bridge.trainer.settings import LossConfig

    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(5, 200, (n,), generator=g).tolist()  # noqa: E731
    prompt, steps = ids(40), []
    for k in range(10):
        completion = ids(6 + k % 3)
        steps.append(step(prompt, completion, (-torch.rand(len(completion), generator=g)).tolist()))
        steps[-1].info["source"] = "langchain"
        prompt = prompt + completion + ids(5)  # the tool's result
    traj = Trajectory(transitions=steps)
    advantages = [torch.linspace(-1.0, 1.0, 10)]
    per_step, _ = build_samples([traj], advantages, 4096, merge=False)
    merged, stats = build_samples([traj], advantages, 4096, merge=True)
    assert len(per_step) == 10 and len(merged) == 1 and stats.merged_steps == 9
    assert stats.metrics()["merge_share/langchain"] == 1.0
    fed = [sum(len(s.input_ids) for s in samples) for samples in (per_step, merged)]
    assert fed[0] >= 5 * fed[1], fed  # 10 calls: the history once rather than again at every step

    torch.manual_seed(0)
    model = get_peft_model(models.tiny(seed=3)[0].float(), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                                      target_modules=["q_proj", "v_proj"]))

    def loss_and_grads(samples):
        model.zero_grad()
        batch = collate(samples, pad_id=0)
        logp, _, _ = token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
        loss, _ = policy_objective(logp, logp.detach() + 0.01, batch["sampler_logprobs"], batch["advantages"],
                                   batch["loss_mask"], None, LossConfig(kl_beta=0.0))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (loss_a, grads_a), (loss_b, grads_b) = loss_and_grads(per_step), loss_and_grads(merged)
    assert abs(float(loss_a - loss_b)) < 1e-5 and grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=1e-5, rtol=0), name

    history = list(steps[4].prompt_token_ids)
    history[10] = 4 if history[10] == 3 else 3  # the front end re-serialised the history before call 4
    steps[4] = step(history, steps[4].completion_token_ids)
    steps[4].info["source"] = "langchain"
    again, stats = build_samples([Trajectory(transitions=steps)], advantages, 4096, merge=True)
    # step 4 starts a sample of its own, and step 5 (which extends the original, not step 4) one more
    assert len(again) == 3 and stats.metrics()["merge_share/langchain"] == 7 / 9


class InOrder(Random):
    """A shuffle that keeps the order, so that a plan can be computed by hand."""

    def shuffle(self, x, *args) -> None:
        pass


def test_minibatches_count_model_calls_so_merging_keeps_the_optimizer_steps():
    # calls per sample 3, 1, 2, 1, 1, 4 and 4 calls a step: [3 + 1], [2 + 1 + 1], [4]
    assert plan(InOrder(), [3, 1, 2, 1, 1, 4], 2, 4) == [[[0, 1], [2, 3, 4], [5]]] * 2
    # one call per sample: minibatches of minibatch_size samples, in the shuffle's order
    order = list(range(10))
    Random(7).shuffle(order)
    assert plan(Random(7), [1] * 10, 1, 4) == [[order[:4], order[4:8], order[8:]]]
    # four episodes of three calls, 6 calls a step: two steps, merged or not
    episodes = []
    for e in range(4):
        prompt, steps = [1, 2, e], []
        for k in range(3):
            steps.append(step(prompt, [10 + k]))
            prompt = prompt + [10 + k, 5]  # the completion and a tool result
        episodes.append(Trajectory(transitions=steps))
    ones = [torch.ones(3)] * 4
    per_step, _ = build_samples(episodes, ones, 4096)
    merged, _ = build_samples(episodes, ones, 4096, merge=True)
    assert [s.calls for s in per_step] == [1] * 12 and [s.calls for s in merged] == [3] * 4
    for samples in (per_step, merged):
        (steps,) = plan(Random(0), [s.calls for s in samples], 1, 6)
        assert [sum(samples[i].calls for i in step) for step in steps] == [6, 6]
