"""Per-step advantages over the model calls of multi-turn trajectories (pure functions).

A trajectory of S model calls has step rewards r_0..r_{S-1} (environment rewards, step-reward
hooks, and the outcome reward added to the last step) and discounted returns
G_t = r_t + gamma * G_{t+1}. Two estimates of how good an action was:

- **episode level** (GRPO): the whole rollout's return R = sum_t r_t against the other rollouts
  of the task (or of the batch), given to every step of it;
- **step level** (anchor states, as GiGPO): steps taken from the *same* observation -- the same
  prompt token ids, or the same user-supplied state key -- form a step group wherever they occur
  in the rollouts, at whatever index. Within it, the value of the state is the mean return of its
  members and the value of an action the mean return of the members that took that same action
  (the same completion token ids): A_step = (Q(s, a) - V(s)) / std_s. Rollouts that reached the
  same state and acted differently are separated there; where every member acted alike, the
  step-level advantage is 0 -- the decision was not made at that step.

The combined advantage is A_episode + omega * A_step; a step with no sibling has only the episode
term. Returns are never compared across different states, so rollouts of unequal length are
never compared across different decisions. PPO uses GAE over steps with a value per step, and
bootstraps V(s_T) after a truncated episode (0 after a terminated one).

Below the step, a span reward (`Episode.span_reward`: a value on a range of one completion's
tokens, e.g. +1 on an argument the call got right, -1 on one it should not have written) is added
to those tokens' advantage times `span_weight`, so one call's right and wrong parts are pushed
apart instead of all its tokens the same way. Under GRPO they may be centred per key within the
group first (`centre_span_rewards`), as returns are.
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

import torch

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Trajectory, Transition


def step_rewards(rewards: Sequence[float], outcome: float | None) -> torch.Tensor:
    """[S] step rewards with the outcome reward added to the last step."""
    r = torch.tensor(list(rewards), dtype=torch.float32)  # [S]
    if outcome is not None and len(r) > 0:
        r[-1] += outcome
    return r


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1}, G_S = 0.  rewards: [S] -> returns: [S]."""
    returns = torch.zeros_like(rewards)
    running = torch.tensor(0.0)
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def standardise(values: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6,
                spread: torch.Tensor | None = None) -> torch.Tensor:
    """(values - mean) / (std + eps), the population std (no Bessel correction) of `spread`
    (default: the values themselves); without `scale_by_std` only centred. A spread of at most
    `eps` gives zeros: values that do not differ say nothing.  [N] -> [N].

    The one standardisation of the trainer: GRPO's episode and step advantages, PPO's whitening
    and the offline batch's."""
    centred = values - values.mean()
    if not scale_by_std:
        return centred
    std = (values if spread is None else spread).std(unbiased=False)
    return centred / (std + eps) if std > eps else torch.zeros_like(centred)


def episode_advantages(returns: Sequence[float], scale_by_std: bool = True, eps: float = 1e-6
                       ) -> torch.Tensor:
    """GRPO's episode-level advantage: each rollout's return against the pool's.
    A lone rollout, and a pool whose returns are all equal, get 0 (no signal, never NaN).

    returns: [N] episode returns -> [N] advantages."""
    r = torch.tensor(list(returns), dtype=torch.float32)
    if len(r) < 2:
        return torch.zeros_like(r)
    return standardise(r, scale_by_std, eps)


def anchor_step_advantages(returns: Sequence[torch.Tensor], states: Sequence[Sequence[Hashable]],
                           actions: Sequence[Sequence[Hashable]], scale_by_std: bool = True,
                           eps: float = 1e-6) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Step-level advantages within anchor-state groups: A = (Q(s, a) - V(s)) / std_s, where V(s)
    is the mean return of every step taken from state s and Q(s, a) the mean over those that took
    action a. Steps are grouped by state key wherever they occur (any rollout, any index).

    returns, states, actions: per rollout i, [S_i] returns and S_i state and action keys ->
    (advantages, one [S_i] tensor per rollout; has_sibling, one [S_i] bool tensor per rollout:
    whether another step was taken from the same state; where not, the advantage is 0)."""
    members: dict[Hashable, list[tuple[int, int]]] = {}
    for i, keys in enumerate(states):
        if len(keys) != len(returns[i]) or len(actions[i]) != len(returns[i]):
            raise InvalidArgument(f"rollout {i}: {len(returns[i])} returns, {len(keys)} states, "
                             f"{len(actions[i])} actions")
        for t, key in enumerate(keys):
            members.setdefault(key, []).append((i, t))
    adv = [torch.zeros_like(g) for g in returns]
    sibling = [torch.zeros(len(g), dtype=torch.bool) for g in returns]
    for group in members.values():
        if len(group) < 2:
            continue
        g = torch.stack([returns[i][t] for i, t in group])  # [M]
        by_action: dict[Hashable, list[int]] = {}
        for k, (i, t) in enumerate(group):
            by_action.setdefault(actions[i][t], []).append(k)
        q = torch.zeros_like(g)  # [M]: the mean return of the members that took the same action
        for ks in by_action.values():
            q[ks] = g[ks].mean()
        centred = standardise(q, scale_by_std, eps, spread=g)  # mean(q) = mean(g) = V(s)
        for k, (i, t) in enumerate(group):
            adv[i][t] = centred[k]
            sibling[i][t] = True
    return adv, sibling


def combine(episode: torch.Tensor, step: torch.Tensor, has_sibling: torch.Tensor, omega: float
            ) -> torch.Tensor:
    """A_t = A_episode + omega * A_step,t where step t has a sibling, else A_episode.
    episode: scalar, step and has_sibling: [S] -> [S]."""
    return episode + omega * step * has_sibling.to(step.dtype)


def token_advantages(step_advantage: float, n_tokens: int, spans: Sequence[Sequence] = (),
                     span_weight: float = 0.0, distillation: Sequence[float] | None = None) -> torch.Tensor:
    """The advantage of each completion token of one step: the step's, plus `span_weight` times
    the reward of every span ([start, end, value] or [start, end, value, key], `Episode.span_reward`)
    the token lies in, plus the token's own distillation reward (`distillation_rewards`; None: none).
    -> [n_tokens]."""
    adv = torch.full((n_tokens,), float(step_advantage))
    if span_weight != 0:
        for span in spans:
            start, end, value = check_span(span, n_tokens)
            adv[start:end] += span_weight * value
    if distillation is not None:
        if len(distillation) != n_tokens:
            raise InvalidArgument(f"distillation rewards: {len(distillation)} for a step of {n_tokens} tokens")
        adv += torch.as_tensor(distillation, dtype=adv.dtype)
    return adv


def span_rewards(step: Transition) -> list[list]:
    """The span rewards recorded on a step (`Episode.span_reward`): [start, end, value(, key)]."""
    return step.info.get("span_rewards", [])


def all_token_advantages(trajectories: Sequence[Trajectory], step_advantages: Sequence[torch.Tensor],
                         span_weight: float = 0.0, spans: Sequence[Sequence[Sequence]] | None = None,
                         distillation: Sequence[Sequence[Sequence[float] | None]] | None = None
                         ) -> list[list[torch.Tensor]]:
    """The token-signal stage: every term a token's advantage is made of, in one place. Per
    trajectory i and step t, `token_advantages` of its completion tokens from the step advantage
    `step_advantages[i][t]`, the span rewards (`spans[i][t]` where given, e.g. centred by GRPO's
    group baseline, else those recorded on the step) and the distillation rewards
    (`distillation[i][t]`, None where unscored).  -> one [n_tokens] tensor per step, nested as given."""
    out = []
    for i, traj in enumerate(trajectories):
        rows = []
        for t, step in enumerate(traj.transitions):
            rows.append(token_advantages(float(step_advantages[i][t]), len(step.completion_token_ids),
                                         spans[i][t] if spans is not None else span_rewards(step), span_weight,
                                         distillation[i][t] if distillation is not None else None))
        out.append(rows)
    return out


def check_span(span: Sequence, n_tokens: int | None = None) -> tuple[int, int, float]:
    """(start, end, value) of a span reward [start, end, value] or [start, end, value, key], checked:
    integer bounds with 0 <= start < end (<= n_tokens where given), a finite value, a string key."""
    def integer(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    ok = isinstance(span, (list, tuple)) and len(span) in (3, 4)
    ok = ok and integer(span[0]) and integer(span[1]) and 0 <= span[0] < span[1]
    ok = ok and (n_tokens is None or span[1] <= n_tokens) and not isinstance(span[2], bool)
    ok = ok and isinstance(span[2], (int, float)) and math.isfinite(span[2])
    if not ok or (len(span) == 4 and not isinstance(span[3], str)):
        limit = f" <= {n_tokens} (the step's completion tokens)" if n_tokens is not None else ""
        raise InvalidArgument(f"span reward {span!r}: expected [start, end, value] or [start, end, value, key] "
                              f"with integers 0 <= start < end{limit}, a finite value and a string key")
    return span[0], span[1], float(span[2])


def centre_span_rewards(spans: Sequence[Sequence[Sequence[Sequence]]]) -> list[list[list[list]]]:
    """The group baseline of span rewards: each keyed span [start, end, value, key] minus the mean,
    over all the N rollouts given, of each rollout's total for that key (0 for a rollout with no
    span of it: it did not do what the span rewards). An unkeyed span [start, end, value] keeps
    its value. A key every rollout has with the same value becomes 0; an argument only some
    rollouts wrote, wrongly, stays negative for them.

    spans[i][t]: the spans of rollout i's step t -> the same nesting, centred."""
    total: dict[str, float] = {}
    for rollout in spans:
        for step in rollout:
            for span in step:
                check_span(span)
                if len(span) > 3:
                    total[span[3]] = total.get(span[3], 0.0) + float(span[2])
    mean = {key: value / max(len(spans), 1) for key, value in total.items()}
    return [[[[s[0], s[1], float(s[2]) - mean[s[3]], s[3]] if len(s) > 3 else list(s) for s in step]
             for step in rollout] for rollout in spans]


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float,
        bootstrap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over steps.

    rewards: [S], values: [S] (V(s_t) per step), bootstrap: V(s_S) after the last step (0 when
    the episode terminated; the value estimate when it was truncated).
    Returns (advantages [S], returns [S] = advantages + values, the value targets).
    """
    S = len(rewards)
    adv = torch.zeros(S, dtype=torch.float32)
    running = torch.tensor(0.0)
    for t in range(S - 1, -1, -1):
        next_value = values[t + 1] if t + 1 < S else torch.tensor(float(bootstrap))
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv, adv + values


def distillation_rewards(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """On-policy distillation's per-token reward: beta * (log pi_teacher - log pi_student) of each
    token the student sampled, a one-sample estimate of minus the reverse KL(student || teacher)
    at that position. Undiscounted (gamma = 0 for this term: each token is judged where it was
    written), added to the token's outcome advantage.  [N], [N] -> [N]."""
    if student_logp.shape != teacher_logp.shape:
        raise InvalidArgument(f"distillation_rewards: {tuple(student_logp.shape)} student and "
                              f"{tuple(teacher_logp.shape)} teacher log-probabilities (must match)")
    return beta * (teacher_logp - student_logp)
