"""Advantage math against values worked out by hand."""

import pytest
import torch

from forge_bridge.core.errors import ForgeBridgeError
from forge_bridge.core.types import Action, Observation, Trajectory, TrajectoryGroup, Transition
from forge_bridge.trainer.advantages import (
    anchor_step_advantages,
    centre_span_rewards,
    combine,
    discounted_returns,
    episode_advantages,
    gae,
    standardise,
    step_rewards,
    token_advantages,
)
from forge_bridge.trainer.config import GRPOConfig
from forge_bridge.trainer.grpo import grpo_advantages


def close(a, b):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=1e-5)


def test_outcome_reward_lands_on_the_last_step_and_is_discounted_backwards():
    r = step_rewards([0.0, 0.5, 0.0], outcome=1.0)
    assert close(r, [0.0, 0.5, 1.0])
    # G2 = 1; G1 = 0.5 + 0.9 * 1 = 1.4; G0 = 0 + 0.9 * 1.4 = 1.26
    assert close(discounted_returns(r, 0.9), [1.26, 1.4, 1.0])
    assert close(discounted_returns(r, 0.0), r)
    assert close(discounted_returns(r, 1.0), [1.5, 1.5, 1.0])


def test_episode_advantages_and_no_signal_without_spread():
    # returns 1, 1, 0, 0: mean 0.5, std 0.5 -> +-1; without the std: +-0.5
    assert close(episode_advantages([1, 1, 0, 0]), [1, 1, -1, -1])
    assert close(episode_advantages([1, 1, 0, 0], scale_by_std=False), [0.5, 0.5, -0.5, -0.5])
    assert close(episode_advantages([1.0, 1.0, 1.0]), [0, 0, 0])  # all equal: 0, never NaN
    assert close(episode_advantages([3.0]), [0])  # alone: nothing to compare with


def returns_of(outcomes, lengths, gamma=0.9):
    return [discounted_returns(step_rewards([0.0] * n, o), gamma) for o, n in zip(outcomes, lengths)]


def test_the_same_state_acted_on_differently_separates_the_good_action_from_the_bad():
    """Four rollouts: all look the value up first (same state S0, same action), reach the same
    state S1 and there two multiply (success) and two answer at once (failure)."""
    returns = returns_of([1, 1, 0, 0], [2, 2, 2, 2])  # [0.9, 1] twice, [0, 0] twice
    states = [["S0", "S1"]] * 4
    actions = [["lookup", "multiply"], ["lookup", "multiply"], ["lookup", "answer"], ["lookup", "answer"]]
    adv, sibling = anchor_step_advantages(returns, states, actions)
    # S0: every rollout took the same action: Q(S0, lookup) = V(S0): step-level advantage 0.
    assert close([a[0] for a in adv], [0, 0, 0, 0])
    # S1: returns 1, 1, 0, 0; Q(multiply) = 1, Q(answer) = 0, V = 0.5, std 0.5 -> +1 / -1.
    assert close([a[1] for a in adv], [1, 1, -1, -1])
    assert all(bool(s.all()) for s in sibling)
    adv, _ = anchor_step_advantages(returns, states, actions, scale_by_std=False)
    assert close([a[1] for a in adv], [0.5, 0.5, -0.5, -0.5])
    # combined with the episode-level +-1 (omega 1): the signal sits on the second step
    episode = episode_advantages([1, 1, 0, 0])
    combined = [combine(episode[i], adv_i, s, 1.0) for i, (adv_i, s) in
                enumerate(zip(*anchor_step_advantages(returns, states, actions)))]
    assert close(combined[0], [1, 2]) and close(combined[2], [-1, -2])


def test_the_first_call_that_decided_success_gets_more_credit_than_the_routine_ones():
    """Four rollouts of a 2-step task: the first call picks the right tool (A) or the wrong one
    (B); the answer after it is the same routine in every rollout. Per step index, the deciding
    step used to get *less* (gamma * 0.5 = 0.45) than the routine one (0.5)."""
    returns = returns_of([1, 1, 0, 0], [2, 2, 2, 2])
    states = [["S0", "after-A"], ["S0", "after-A"], ["S0", "after-B"], ["S0", "after-B"]]
    actions = [["A", "answer"], ["A", "answer"], ["B", "answer"], ["B", "answer"]]
    adv, _ = anchor_step_advantages(returns, states, actions)
    # S0: G0 = 0.9, 0.9, 0, 0; Q(A) = 0.9, Q(B) = 0, V = 0.45, std 0.45 -> +1 / -1.
    # after-A: both answered alike -> 0; after-B: the same.
    assert close(adv[0], [1, 0]) and close(adv[2], [-1, 0])
    episode = episode_advantages([1, 1, 0, 0])
    total = combine(episode[0], adv[0], torch.ones(2, dtype=torch.bool), 1.0)
    assert float(total[0]) > float(total[1])  # 2 > 1: the decision, not the routine


def test_rollouts_of_unequal_length_are_never_compared_across_different_decisions():
    # r0 reaches S1 then S2; r1 takes a detour through S3 and only then reaches S1.
    returns = returns_of([1, 0], [3, 3])  # r0: [0.81, 0.9, 1]; r1: [0, 0, 0]
    states = [["S0", "S1", "S2"], ["S0", "S3", "S1"]]
    actions = [["a", "x", "done"], ["b", "c", "y"]]
    adv, sibling = anchor_step_advantages(returns, states, actions)
    # index 1 holds S1 and S3: different states, no comparison; S2 and S3 have no sibling.
    assert sibling[0].tolist() == [True, True, False] and sibling[1].tolist() == [True, False, True]
    assert float(adv[0][2]) == 0 and float(adv[1][1]) == 0
    # S1 is compared where each rollout reached it (index 1 vs index 2): returns 0.9 and 0 -> +-1
    assert float(adv[0][1]) == pytest.approx(1.0, abs=1e-4) and float(adv[1][2]) == pytest.approx(-1.0, abs=1e-4)
    # S0: 0.81 vs 0 with different actions -> +-1
    assert float(adv[0][0]) == pytest.approx(1.0, abs=1e-4) and float(adv[1][0]) == pytest.approx(-1.0, abs=1e-4)
    # a step with no sibling keeps only the episode-level advantage
    assert close(combine(torch.tensor(0.7), adv[0], sibling[0], 1.0), [1.7, 1.7, 0.7])


def test_mismatched_keys_are_a_clear_error():
    with pytest.raises(ValueError, match="2 returns, 1 states"):
        anchor_step_advantages([torch.zeros(2)], [["S0"]], [["a", "b"]])


def step(prompt, completion, **info):
    return Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]),
                      action=Action(content="a"), prompt_token_ids=prompt, completion_token_ids=completion,
                      completion_logprobs=[-0.5] * len(completion), info=info)


def test_grpo_advantages_group_steps_by_prompt_tokens_or_by_the_users_state_key():
    # Same first prompt and first action; at the second step the same prompt, different actions.
    good = Trajectory(transitions=[step([1, 2], [7]), step([1, 2, 7, 3], [8])], reward=1.0, group_id="g")
    bad = Trajectory(transitions=[step([1, 2], [7]), step([1, 2, 7, 3], [9])], reward=0.0, group_id="g")
    groups = [TrajectoryGroup("g", None, [good, bad])]
    (adv,) = grpo_advantages(groups, GRPOConfig(gamma=0.9, step_weight=0.5))
    # episode +-1; step 0: same action -> 0; step 1: returns 1 vs 0, different actions -> +-1 * 0.5
    assert close(adv[0], [1.0, 1.5]) and close(adv[1], [-1.0, -1.5])
    (adv,) = grpo_advantages(groups, GRPOConfig(gamma=0.9, credit="trajectory"))
    assert close(adv[0], [1.0, 1.0]) and close(adv[1], [-1.0, -1.0])
    # Different prompts (a timestamp in the system prompt, say) with the same user state key: grouped.
    good = Trajectory(transitions=[step([5], [7], state_key="start")], reward=1.0, group_id="g")
    bad = Trajectory(transitions=[step([6], [9], state_key="start")], reward=0.0, group_id="g")
    (adv,) = grpo_advantages([TrajectoryGroup("g", None, [good, bad])], GRPOConfig())
    assert close(adv[0], [2.0]) and close(adv[1], [-2.0])
    good.transitions[0].info.clear()
    bad.transitions[0].info.clear()
    (adv,) = grpo_advantages([TrajectoryGroup("g", None, [good, bad])], GRPOConfig())
    assert close(adv[0], [1.0]) and close(adv[1], [-1.0])  # no sibling: the episode term alone


def test_step_rewards_reach_the_step_they_were_given_to():
    # Both succeed, but one called a tool that raised (step reward -0.5 on its first step).
    clean = Trajectory(transitions=[step([1], [7]), step([1, 7, 2], [8])], reward=1.0, group_id="g")
    noisy = Trajectory(transitions=[step([1], [6]), step([1, 6, 3], [8])], reward=1.0, group_id="g")
    noisy.transitions[0].reward = -0.5
    (adv,) = grpo_advantages([TrajectoryGroup("g", None, [clean, noisy])],
                             GRPOConfig(gamma=1.0, scale_by_std=False))
    # episode returns 1 and 0.5 -> +-0.25; step 0 (same state, different actions): G0 = 1 vs 0.5 -> +-0.25
    assert close(adv[0], [0.5, 0.25]) and close(adv[1], [-0.5, -0.25])


def test_gae_matches_a_plain_loop_reference():
    torch.manual_seed(0)
    rewards, values = torch.randn(6), torch.randn(6)
    gamma, lam, bootstrap = 0.9, 0.8, 0.3
    expected = []
    for t in range(6):  # A_t = sum_k (gamma*lam)^k delta_{t+k}
        total = 0.0
        for k in range(t, 6):
            nxt = values[k + 1] if k + 1 < 6 else bootstrap
            delta = rewards[k] + gamma * nxt - values[k]
            total += (gamma * lam) ** (k - t) * float(delta)
        expected.append(total)
    adv, ret = gae(rewards, values, gamma, lam, bootstrap=bootstrap)
    assert close(adv, expected) and close(ret, torch.tensor(expected) + values)


def test_gae_with_lambda_one_is_the_discounted_return_minus_the_value():
    rewards, values = torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.2, 0.4, 0.6])
    adv, _ = gae(rewards, values, 0.9, 1.0)
    assert close(adv, discounted_returns(rewards, 0.9) - values)


def test_gae_bootstraps_by_hand():
    # rewards [0, 0], values [0.5, 0.6], gamma 0.9, lambda 1, V(s_T) = 0.8 after a truncation:
    # delta_1 = 0 + 0.9 * 0.8 - 0.6 = 0.12;  delta_0 = 0 + 0.9 * 0.6 - 0.5 = 0.04
    # A_1 = 0.12;  A_0 = 0.04 + 0.9 * 0.12 = 0.148
    adv, ret = gae(torch.tensor([0.0, 0.0]), torch.tensor([0.5, 0.6]), 0.9, 1.0, bootstrap=0.8)
    assert close(adv, [0.148, 0.12]) and close(ret, [0.648, 0.72])
    adv, _ = gae(torch.tensor([0.0, 0.0]), torch.tensor([0.5, 0.6]), 0.9, 1.0)  # terminated: V = 0
    assert close(adv, [0.04 - 0.9 * 0.6, -0.6])


def test_one_standardisation_population_std_and_zeros_without_spread():
    # [1, 2, 3]: mean 2, population std sqrt(2/3) = 0.8165 -> -1/0.8165, 0, 1/0.8165
    assert close(standardise(torch.tensor([1.0, 2.0, 3.0])), [-1.224744, 0.0, 1.224744])
    assert close(standardise(torch.tensor([1.0, 2.0, 3.0]), scale_by_std=False), [-1.0, 0.0, 1.0])
    assert close(standardise(torch.tensor([0.7, 0.7])), [0.0, 0.0])  # no spread, no signal (never NaN)
    # centred on the values, scaled by another spread (anchor states: Q centred, V's members' std)
    assert close(standardise(torch.tensor([1.0, 1.0, 0.0, 0.0]), spread=torch.tensor([2.0, 0.0, 0.0, 0.0])),
                 [0.5 / (0.866025 + 1e-6)] * 2 + [-0.5 / (0.866025 + 1e-6)] * 2)


def test_distillation_rewards_add_to_each_token_in_the_same_stage():
    adv = token_advantages(0.5, 3, [[0, 2, 1.0]], span_weight=0.5, distillation=[0.1, -0.2, 0.0])
    assert close(adv, [1.1, 0.8, 0.5])
    with pytest.raises(ForgeBridgeError, match="2 for a step of 3 tokens"):
        token_advantages(0.5, 3, distillation=[0.1, 0.2])


def test_span_rewards_add_to_their_tokens_advantage_only():
    adv = token_advantages(0.5, 6, [[1, 3, 1.0], [3, 5, -1.0], [4, 6, -2.0]], span_weight=0.25)
    # token 0: 0.5; 1-2: 0.5 + 0.25; 3: 0.5 - 0.25; 4: 0.5 - 0.25 - 0.5; 5: 0.5 - 0.5
    assert close(adv, [0.5, 0.75, 0.75, 0.25, -0.25, 0.0])
    assert close(token_advantages(-1.0, 3, [[0, 3, 1.0]], span_weight=0.0), [-1.0, -1.0, -1.0])
    # bounds out of range or not integers, a value not finite, a key not a string, a short entry
    for bad in ([-1, 2, 1.0], [2, 2, 1.0], [0, 4, 1.0], [0.5, 2.7, 1.0], ["0", 2, 1.0], [0, 2, float("nan")],
                [0, 2, float("inf")], [0, 2, True], [0, 2, 1.0, 7], [0, 2], [0, 2, 1.0, "k", "more"], "0 2 1"):
        with pytest.raises(ForgeBridgeError, match=r"span reward .*0 <= start < end <= 3 \(the step's"):
            token_advantages(0.0, 3, [bad], span_weight=1.0)
        if bad != [0, 4, 1.0]:  # centring knows no token count
            with pytest.raises(ForgeBridgeError, match="span reward"):
                centre_span_rewards([[[bad]]])


def test_a_group_with_equal_rewards_is_still_trained_when_its_span_rewards_differ():
    from forge_bridge.trainer.grpo import GRPOTrainer

    right = Trajectory(transitions=[step([1, 2], [7, 8, 9], span_rewards=[[0, 2, 1.0]])], reward=0.5, group_id="g")
    wrong = Trajectory(transitions=[step([1, 2], [7, 5, 9], span_rewards=[[0, 2, -1.0]])], reward=0.5, group_id="g")
    groups = [TrajectoryGroup("g", None, [right, wrong])]
    trainer = GRPOTrainer.__new__(GRPOTrainer)  # prepare() reads only the config and remembers advantages
    trainer.config = GRPOConfig(span_weight=0.5)
    samples, _, info = trainer.prepare(groups)
    assert info["groups_trained"] == 1
    assert [s.advantages[2:] for s in samples] == [[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]]
    trainer.config = GRPOConfig(span_weight=0.0, kl_beta=0.0)  # no KL term to keep a silent group for
    samples, _, info = trainer.prepare(groups)
    assert info["groups_trained"] == 0 and samples == []
    # centred per key within the group: +-1 around a mean of 0, the same here
    right.transitions[0].info["span_rewards"] = [[0, 2, 1.0, "x"], [2, 3, 1.0, "close"]]
    wrong.transitions[0].info["span_rewards"] = [[0, 2, -1.0, "x"], [2, 3, 1.0, "close"]]
    trainer.config = GRPOConfig(span_weight=0.5, span_baseline="group")
    samples, _, info = trainer.prepare(groups)
    assert [s.advantages[2:] for s in samples] == [[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]]
    # span rewards alike (every rollout right): nothing to tell apart, the group is left out
    wrong.transitions[0].info["span_rewards"] = [[0, 2, 1.0, "x"], [2, 3, 1.0, "close"]]
    for baseline in ("none", "group"):
        trainer.config = GRPOConfig(span_weight=0.5, span_baseline=baseline, kl_beta=0.0)
        samples, _, info = trainer.prepare(groups)
        assert info["groups_trained"] == 0 and samples == []
    with pytest.raises(ValueError, match="span_baseline: expected 'none' or 'group'"):
        GRPOConfig(span_baseline="batch")
    for weight in (-1.0, float("inf"), True):
        with pytest.raises(ValueError, match="span_weight: expected a finite number >= 0"):
            GRPOConfig(span_weight=weight)


def test_rollouts_right_on_different_arguments_differ_in_their_span_rewards():
    from forge_bridge.trainer.grpo import GRPOTrainer

    # one wrote "a" right and left "b" out, the other the reverse: the same values, other keys
    first = Trajectory(transitions=[step([1, 2], [7, 8, 9], span_rewards=[[0, 2, 1.0, "a"], [2, 3, -1.0, "close"]])],
                       reward=0.5, group_id="g")
    second = Trajectory(transitions=[step([1, 2], [7, 5, 9], span_rewards=[[0, 2, 1.0, "b"], [2, 3, -1.0, "close"]])],
                        reward=0.5, group_id="g")
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    for baseline, pushed in (("none", 1.0), ("group", 0.5)):  # centred: "a" has mean 1/2 over the two
        trainer.config = GRPOConfig(span_weight=1.0, span_baseline=baseline)
        samples, _, info = trainer.prepare([TrajectoryGroup("g", None, [first, second])])
        assert info["groups_trained"] == 1
        closing = -1.0 if baseline == "none" else 0.0
        assert [s.advantages[2:] for s in samples] == [[pushed, pushed, closing]] * 2


def test_centred_span_rewards_leave_what_every_rollout_got_alike_without_a_push():
    # three rollouts, one step each: "a" right in all; "b" right in two, wrong in one; "c" (an
    # argument not asked for) written only by the third; an unkeyed span keeps its value
    spans = [[[[0, 2, 1.0, "a"], [2, 4, 1.0, "b"]]],
             [[[0, 2, 1.0, "a"], [2, 4, 1.0, "b"], [4, 5, 0.5]]],
             [[[0, 2, 1.0, "a"], [2, 4, -1.0, "b"], [4, 6, -1.0, "c"]]]]
    centred = centre_span_rewards(spans)
    b_mean, c_mean = (1 + 1 - 1) / 3, (0 + 0 - 1) / 3  # a rollout without "c" counts 0
    assert centred[0] == [[[0, 2, 0.0, "a"], [2, 4, 1 - b_mean, "b"]]]
    assert centred[1] == [[[0, 2, 0.0, "a"], [2, 4, 1 - b_mean, "b"], [4, 5, 0.5]]]
    assert centred[2] == [[[0, 2, 0.0, "a"], [2, 4, -1 - b_mean, "b"], [4, 6, -1 - c_mean, "c"]]]
    # every rollout wrote "c" wrongly: nothing to compare, no push
    assert centre_span_rewards([[[[0, 1, -1.0, "c"]]]] * 2) == [[[[0, 1, 0.0, "c"]]]] * 2
