"""Multi-turn PPO: GAE over steps, with a value head trained beside the LoRA.

    values    V(s_t) read by a linear head at the last prompt token of step t (the same network
              that acts: a second critic model would not fit a small CPU budget); the head
              reads the hidden state detached, so its loss trains the head only
    advantage A_t = GAE(gamma, lambda) over the steps of each trajectory, bootstrapping V(s_T)
              after a truncated episode and 0 after a terminated one. The state after a cut is
              never prompted, so V(s_T) is estimated by V(s_{T-1}), the value of the last state
              the agent acted from (a state the head is trained on)
    loss      clipped surrogate on each completion token + value_coef * 0.5 (V - (A + V))^2,
              the LoRA's and the head's gradients clipped each on their own
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from forge_bridge.core.errors import InvalidState
from forge_bridge.core.types import Trajectory
from forge_bridge.trainer.advantages import all_token_advantages, gae, standardise, step_rewards
from forge_bridge.trainer.batch import build_samples, trained_tokens_per_step
from forge_bridge.trainer.config import PPOConfig
from forge_bridge.trainer.learner import microbatches
from forge_bridge.trainer.loop import Trainer
from forge_bridge.trainer.losses import policy_objective, value_loss

VALUE_INPUT = "hidden state, detached, at unit L1 norm"
"""What the value head reads; recorded in checkpoints, whose heads only fit this input."""


def read_values(head: torch.nn.Module, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """hidden [B, T, H], positions [B, S] -> values [B, S].

    The head reads each state's hidden vector detached and scaled to unit L1 norm. Detached: the
    value loss trains the head, not the LoRA (through the shared trunk, a young head's loss
    outweighed the policy's gradient 52 to 8 and the policy collapsed). Unit L1 norm: Adam's
    first step moves every weight by its learning rate (later ones by at most about that), so a
    step moves a value by about 2 x `value_lr` at most (weights and bias) whatever the model's width; on the raw hidden states of
    SmolLM2-135M (L1 norm ~700) one step at 5e-3 took the values from 0 to 3.4 for rewards in [0, 1]."""
    picked = hidden.detach().gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1])).float()  # [B, S, H]
    picked = picked / picked.abs().sum(-1, keepdim=True).clamp_min(1e-6)
    return head(picked).squeeze(-1)


def was_truncated(traj: Trajectory) -> bool:
    """Cut off by a limit (Gymnasium's truncated): the return does not end at the last step. Read
    from the episode's end reason, the one record of how it ended (its last step's `truncated`
    flag is set from it)."""
    return traj.end_reason == "truncated"


def ppo_advantages(trajectories: Sequence[Trajectory], values: Sequence[torch.Tensor], config: PPOConfig,
                   end_values: Sequence[float] | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE per trajectory from its step rewards (the outcome on the last step) and values [S_i];
    `end_values[i]` is V(s_T) after trajectory i's last step, bootstrapped only where it was
    truncated (a terminated episode has nothing after its end: 0). Returns (advantages, value
    targets), one [S_i] tensor each; whitened over the batch when `normalize_advantages`."""
    advantages, targets = [], []
    for n, (t, v) in enumerate(zip(trajectories, values)):
        bootstrap = float(end_values[n]) if end_values is not None and was_truncated(t) else 0.0
        a, target = gae(step_rewards([s.reward for s in t.transitions], t.reward), v, config.gamma, config.lam,
                        bootstrap=bootstrap)
        advantages.append(a)
        targets.append(target)
    if config.normalize_advantages and advantages:
        flat = standardise(torch.cat(advantages))
        advantages = list(flat.split([len(a) for a in advantages]))
    return advantages, targets


def value_head(hidden_size: int) -> dict[str, tuple[torch.nn.Module, float]]:
    """PPO's value head, zeroed (every value 0 at first), by name; its rate is set per trainer."""
    head = torch.nn.Linear(hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return {"value_head": (head, 0.0)}


class PPOTrainer(Trainer):
    """PPO: GAE over the steps of each trajectory, with a value head beside the LoRA."""

    config: PPOConfig
    per_role_loras = False

    def heads(self, hidden_size: int) -> dict[str, tuple[torch.nn.Module, float]]:
        return {name: (module, self.config.value_lr) for name, (module, _) in value_head(hidden_size).items()}

    def run_iteration(self, rollout, tasks, it: int) -> dict:
        """Iteration `it` (0-based): the recipe, top to bottom."""
        t0 = time.perf_counter()
        groups, metrics = self.collect(rollout, self.tasks_for(tasks, it), it)  # the agent's rollouts
        t1 = time.perf_counter()
        self.by_slot(groups)  # every step served from the slot this LoRA is published to
        trajectories = [t for group in groups for t in group.trajectories]
        values, value_mean = self.values(trajectories)  # V(s_t) of every step, from the value head
        advantages, returns = ppo_advantages(trajectories, values, self.config,
                                             [float(v[-1]) if len(v) else 0.0 for v in values])  # V(s_T) ~ V(s_{T-1})
        self.remember_advantages(trajectories, advantages)
        tokens = all_token_advantages(trajectories, advantages, self.config.span_weight)  # + recorded span rewards
        samples, batch = build_samples(trajectories, tokens, self.config.max_seq_len, self.config.merge_steps,
                                       step_returns=returns)
        self.record_credit(groups, trained_tokens_per_step(samples), it + 1)
        stats = self.update(samples) if samples else {}  # epochs x minibatches: forward, objective, step
        t2 = time.perf_counter()
        version = self.publish(it + 1)  # the live policy serves v(it + 1) from its next call
        metrics = self.timed({"iteration": it + 1, "version": version, **metrics, "value_mean": value_mean,
                              **batch.metrics(), **stats},
                             t0, t1, t2, batch.trained_tokens)
        self.end_iteration(metrics)  # metrics.jsonl, TensorBoard, a checkpoint
        return metrics

    def values(self, trajectories: list[Trajectory]) -> tuple[list[torch.Tensor], float]:
        """V(s_t) of every step, [S_i] per trajectory (0 for a step with no sample), and their mean."""
        zeros = [torch.zeros(len(t.transitions)) for t in trajectories]
        samples, _ = build_samples(trajectories, zeros, self.config.max_seq_len, merge=False)
        learner, head = self.learner, self.learner.heads["value_head"]
        values: dict[tuple[str, int], float] = {}
        with torch.no_grad():
            size = self.config.optimizer.microbatch_size or self.config.optimizer.minibatch_size
            for chunk, _ in microbatches(samples, size, "token", learner.chunker):
                batch = learner.collate(chunk)
                _, hidden, _ = learner.logprobs(batch)
                v = read_values(head, hidden, batch["value_positions"])
                for b, sample in enumerate(chunk):
                    for k, step in enumerate(sample.steps):
                        values[step] = float(v[b, k])
        return ([torch.tensor([values.get((t.id, i), 0.0) for i in range(len(t.transitions))]) for t in trajectories],
                sum(values.values()) / max(len(values), 1))

    def objective(self, logp, hidden, batch):
        """PPO's loss on one microbatch: the policy objective plus the value loss."""
        loss, stats = policy_objective(logp, self.old_logprobs(logp, batch), batch["sampler_logprobs"],
                                       batch["advantages"], batch["loss_mask"], self.reference_logprobs(batch),
                                       self.config.loss)
        values = read_values(self.learner.heads["value_head"], hidden, batch["value_positions"])
        vloss = value_loss(values, batch["returns"], batch["value_mask"])
        stats["value_loss"] = float(vloss.detach())
        return loss + self.config.value_coef * vloss, stats

    def resumable_state(self) -> dict:
        return {"value_head_input": VALUE_INPUT}

    def check_resumable(self, state: dict, path) -> None:
        if state.get("value_head_input") != VALUE_INPUT:
            raise InvalidState(f"checkpoint {path} holds a value head trained on another input "
                               f"({state.get('value_head_input') or 'the raw hidden state'}; this version reads the "
                               f"{VALUE_INPUT}): its values would be wrong. Start a new run (another out_dir).")


__all__ = ["PPOTrainer", "ppo_advantages", "read_values", "was_truncated"]
