"""Samples come from the recorded token ids, with the loss on completions only."""

import pytest
import torch

from forge_bridge.core.errors import ForgeBridgeError
from forge_bridge.core.types import Action, Observation, Trajectory, Transition
from forge_bridge.trainer.advantages import all_token_advantages
from forge_bridge.trainer.batch import build_samples, collate, trained_tokens_per_step


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
