"""The training loop GRPO and PPO share: rollouts -> advantages -> update -> publish.

Each iteration runs `group_size` rollouts of each chosen task concurrently through the user's
own rollout function (a wrapped agent, or anything that records into the current episode),
turns the recorded trajectories into samples, updates the LoRA, saves adapter vN (safetensors,
atomically), publishes it to the live policy, logs metrics and writes a checkpoint. A run
killed at any point resumes from its last checkpoint with `resume=True`; every trajectory
recorded before the kill stays in the store.
"""

from __future__ import annotations

import json
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from forge_bridge import runs
from forge_bridge.policy import Policy
from forge_bridge.session import Recorder
from forge_bridge.trainer import checkpoint
from forge_bridge.trainer.advantages import discounted_returns, step_rewards
from forge_bridge.trainer.batch import BatchStats, Sample, build_samples, collate
from forge_bridge.trainer.config import TrainerConfig
from forge_bridge.trainer.lora import attach_lora, save_adapter, token_logprobs
from forge_bridge.trainer.losses import aggregate, clipped_policy_loss, kl_k3
from forge_bridge.types import END_REASONS, Trajectory

Rollout = Callable[[Any], float]
"""Runs the agent on one task inside the episode the trainer opened; returns the reward."""


def task_id_of(task: Any, index: int) -> str:
    if isinstance(task, dict) and "id" in task:
        return str(task["id"])
    if hasattr(task, "id"):
        return str(task.id)
    return f"task-{index}"


class RolloutError(ValueError):
    """The rollout function is broken: it gave no finite reward, or every rollout raised."""


def check_reward(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"the rollout function must return a finite number (the reward), got {value!r}")
    return float(value)


class Trainer:
    """Shared machinery; `GRPOTrainer` and `PPOTrainer` supply advantages and the loss."""

    extra_modules: dict[str, torch.nn.Module]

    def __init__(self, policy: Policy, config: TrainerConfig, *, model: str | None = None,
                 recorder: Recorder | None = None) -> None:
        from forge_bridge import models
        from forge_bridge.local_policy import bf16_supported

        if not isinstance(policy, Policy):
            raise TypeError(f"policy: expected a forge_bridge Policy, got {type(policy).__name__}")
        if not isinstance(config, TrainerConfig):
            raise TypeError(f"config: expected a GRPOConfig or PPOConfig, got {type(config).__name__}")
        source = model or getattr(policy, "model_path", None)
        if source is None:
            raise ValueError("the trainer needs the base model the policy serves: pass "
                             "model='<name or directory>' (a VLLMPolicy does not know it)")
        self.policy, self.config = policy, config
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed)
        self.rng = random.Random(config.seed)
        base, self.tokenizer = models.load(str(source))
        self.pad_id: int = self.tokenizer.pad_token_id or 0
        """What collated batches are padded with (masked out wherever it lands)."""
        self.model = attach_lora(base, config.lora_rank, config.lora_alpha, config.lora_targets)
        self.bf16 = bf16_supported() if config.bf16 is None else config.bf16
        self.extra_modules = self._extra_modules(base.config.hidden_size)
        self.optimizer = torch.optim.AdamW(self._param_groups())
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.reference: Any = None
        """The frozen KL reference model (None: the base model, adapter disabled)."""
        self.previous_run = runs.holds_run(self.out)
        """The folder held a run when this trainer was made: train() resumes it or refuses."""
        self.run_id = (runs.read_run_id(self.out, config.run_name) if self.previous_run
                       else runs.new_run(self.out, config.run_name))
        """Keys every trajectory, group id and metrics line of this run."""
        self.recorder = recorder or Recorder(self.out / "trajectories.db", run_id=self.run_id)
        self.iteration = 0
        self.history: list[dict] = []
        self._tb = None

    # ------------------------------------------------------------------ subclass hooks
    def _extra_modules(self, hidden_size: int) -> dict[str, torch.nn.Module]:
        return {}

    def _param_groups(self) -> list[dict]:
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": self.config.lr}]

    def prepare(self, groups: dict[tuple, list[Trajectory]]) -> tuple[list[Sample], BatchStats, dict]:
        raise NotImplementedError

    def loss(self, logp: torch.Tensor, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def policy_loss(self, logp: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        """The clipped surrogate GRPO and PPO share, plus the KL to the reference when `kl_beta`
        is set; without it the KL to the behaviour policy is only logged (a cheap drift gauge)."""
        mask = batch["loss_mask"]
        loss, stats = clipped_policy_loss(logp, batch["old_logprobs"], batch["advantages"], mask,
                                          self.config.clip_low, self.config.clip_high,
                                          self.config.tis_cap, self.config.loss_aggregation)
        if self.config.kl_beta > 0:
            kl = aggregate(kl_k3(logp, self.reference_logprobs(batch)), mask, self.config.loss_aggregation)
            loss = loss + self.config.kl_beta * kl
            stats["kl"] = float(kl.detach())
        else:
            with torch.no_grad():
                stats["kl"] = float(aggregate(kl_k3(logp, batch["old_logprobs"]), mask))
        return loss, stats

    # ------------------------------------------------------------------ the loop
    def train(self, rollout: Rollout, tasks: Sequence[Any] | Callable[[int], Sequence[Any]],
              iterations: int, *, resume: bool = False) -> list[dict]:
        """Run iterations until `iterations` in all have been done (counting resumed ones).

        `tasks`: the training tasks (`tasks_per_iteration` of them are drawn each iteration), or
        a schedule `iteration -> tasks` that picks each iteration's tasks itself (a curriculum,
        or one task of each kind so no kind is starved)."""
        from tqdm.auto import tqdm

        if not callable(rollout):
            raise TypeError(f"rollout: expected a function task -> reward, got {type(rollout).__name__}")
        if not callable(tasks):
            tasks = list(tasks)
            if not tasks:
                raise ValueError("tasks: expected at least one task")
        if resume:
            self.resume()
        elif self.previous_run and self.iteration == 0:
            raise runs.refuse(self.out, self.run_id)
        bar = tqdm(range(self.iteration, iterations), desc="training", unit="it",
                   disable=not self.config.progress, initial=self.iteration, total=iterations)
        for it in bar:
            t0 = time.perf_counter()
            groups, rollout_stats = self.collect(rollout, self._tasks_for(it, tasks), it)
            t1 = time.perf_counter()
            samples, batch_stats, adv_stats = self.prepare(groups)
            update_stats = self.update(samples) if samples else {}
            t2 = time.perf_counter()
            version = self.publish(it + 1)
            t3 = time.perf_counter()
            metrics = {"iteration": it + 1, "adapter": version, **rollout_stats, **adv_stats,
                       **{f"batch_{k}": v for k, v in vars(batch_stats).items()}, **update_stats,
                       "time_rollout_s": t1 - t0, "time_update_s": t2 - t1, "time_publish_s": t3 - t2,
                       "tokens_per_s": batch_stats.trained_tokens / max(t2 - t1, 1e-9)}
            self.iteration = it + 1
            self.log(metrics)
            self.save_checkpoint()
            bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}",
                            success=f"{metrics['success_rate']:.2f}")
        return self.history

    def _tasks_for(self, it: int, tasks: list | Callable[[int], Sequence[Any]]) -> list[tuple[str, Any]]:
        if callable(tasks):
            chosen = list(tasks(it))
            if not chosen:
                raise ValueError(f"the task schedule gave no tasks for iteration {it + 1}")
            return [(task_id_of(t, i), t) for i, t in enumerate(chosen)]
        indexed = [(task_id_of(t, i), t) for i, t in enumerate(tasks)]
        k = self.config.tasks_per_iteration
        if k is None or k >= len(indexed):
            return indexed
        return random.Random(self.config.seed * 100_003 + it).sample(indexed, k)

    def collect(self, rollout: Rollout, tasks: list[tuple[str, Any]], it: int
                ) -> tuple[dict[tuple, list[Trajectory]], dict]:
        """Run the rollouts of one iteration; returns its trainable trajectories by (group, role).

        Exactly the episodes opened here are read back (a resumed iteration's earlier attempt
        never mixes in); what is trained on is decided by each trajectory's typed end reason:
        terminated, truncated (a step or recursion limit: reward 0 unless scored) and the
        policy's own faults are; outages, crashes and unfinished episodes are not, and are
        counted."""
        from tqdm.auto import tqdm

        jobs = [(tid, task, f"{self.run_id}-it{it + 1}-{tid}")
                for tid, task in tasks for _ in range(self.config.group_size)]

        bad_rewards: list[str] = []  # the reward function's bugs: always reported
        crashes: list[str] = []  # the agent crashed on a task: skipped, unless every rollout did
        opened: list[str] = []  # trajectory ids, a crew's roles included

        def one(tid: str, task: Any, group: str) -> None:
            ep = self.recorder.episode(tid, group, run_id=self.run_id, metadata={"iteration": it + 1})
            try:
                with ep:
                    value = rollout(task)
                    try:
                        ep.reward(check_reward(value))
                    except ValueError as exc:
                        raise RolloutError(f"task {tid!r}: {exc}") from None
            except RolloutError as exc:  # recorded as crashed (above); reported after the iteration
                bad_rewards.append(str(exc))
            except Exception as exc:  # recorded with its end reason by the episode
                if ep.end_reason == "crashed":
                    crashes.append(f"task {tid!r}: the rollout raised {type(exc).__name__}: {exc}")
            finally:  # a crew's steps live in its roles' trajectories
                opened.extend([child.id for child in ep.children.values()] or [ep.id])

        with ThreadPoolExecutor(self.config.concurrency) as pool:
            futures = [pool.submit(one, *job) for job in jobs]
            for f in tqdm(as_completed(futures), total=len(futures), desc=f"rollouts {it + 1}",
                          leave=False, disable=not self.config.progress):
                f.result()
        if bad_rewards:
            raise RolloutError(f"iteration {it + 1}: {bad_rewards[0]} ({len(bad_rewards)} rollout(s) "
                              "affected; their trajectories are stored as crashed, nothing was trained)")
        if len(crashes) == len(jobs):
            raise RolloutError(f"iteration {it + 1}: every rollout raised, e.g. {crashes[0]} "
                              "(trajectories stored as crashed, nothing was trained)")
        groups: dict[tuple, list[Trajectory]] = {}
        ends = {reason: 0 for reason in END_REASONS} | {"incomplete": 0}
        reasons: list[str] = []
        rewards = []
        mine = set(opened)
        for traj in (t for group in sorted({g for _, _, g in jobs})  # in the order they were opened
                     for t in self.recorder.store.iter(run_id=self.run_id, group_id=group) if t.id in mine):
            ends[traj.end_reason or "incomplete"] += 1
            if not traj.trainable:
                reasons.append(f"{traj.end_reason or 'incomplete'}: {traj.end_detail}")
                continue
            if not traj.transitions:
                continue
            if traj.reward is None:  # cut by a limit or failed by the model, and never scored
                traj.reward = 0.0
            groups.setdefault((traj.group_id, traj.role), []).append(traj)
            rewards.append(traj.reward)
        skipped = len(reasons)
        if skipped:
            print(f"iteration {it + 1}: not training on {skipped} episode(s) (e.g. {reasons[0]})")
        r = torch.tensor(rewards) if rewards else torch.zeros(1)
        return groups, {"episodes": len(jobs), "episodes_outage": ends["outage"],
                        "episodes_crashed": ends["crashed"], "episodes_incomplete": ends["incomplete"],
                        "episodes_failed": ends["outage"] + ends["crashed"],
                        "episodes_truncated": ends["truncated"],
                        "episodes_policy_fault": ends["policy_fault"],
                        "reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False)),
                        "success_rate": float((r >= self.config.success_threshold).float().mean())}

    def _returns(self, group: list[Trajectory]) -> list[torch.Tensor]:
        return [discounted_returns(step_rewards([t.reward for t in traj.transitions], traj.reward),
                                   self.config.gamma) for traj in group]

    def _autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else nullcontext()

    def update(self, samples: list[Sample]) -> dict:
        """`epochs` passes of minibatch steps over the samples; returns averaged statistics."""
        self.model.train()
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(self.config.epochs):
            order = list(range(len(samples)))
            self.rng.shuffle(order)
            for start in range(0, len(order), self.config.minibatch_size):
                stats = self._step([samples[i] for i in order[start:start + self.config.minibatch_size]])
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
        self.model.eval()
        return {k: v / max(steps, 1) for k, v in totals.items()} | {"optimizer_steps": steps}

    def _step(self, minibatch: list[Sample]) -> dict[str, float]:
        """One optimizer step on the minibatch, its gradient accumulated over microbatches, each
        weighted by its share of what the loss averages over (trained tokens, or sequences), so
        the step is the same as one pass over the whole minibatch (PPO's value loss, averaged
        over steps rather than tokens, only approximately)."""
        size = self.config.microbatch_size or len(minibatch)
        by_length = sorted(minibatch, key=lambda s: len(s.input_ids))  # less padding, same step
        chunks = [by_length[k:k + size] for k in range(0, len(by_length), size)]
        if self.config.loss_aggregation == "token":
            shares = [sum(sum(s.loss_mask) for s in c) for c in chunks]
        else:
            shares = [sum(1 for s in c if any(s.loss_mask)) for c in chunks]
        total = max(sum(shares), 1)
        self.optimizer.zero_grad(set_to_none=True)
        stats: dict[str, float] = {}
        for chunk, share in zip(chunks, shares):
            weight = share / total
            batch = collate(chunk, self.pad_id)
            with self._autocast():
                logp, hidden, entropy = token_logprobs(self.model, batch["input_ids"], batch["attention_mask"],
                                                       batch["loss_mask"], with_entropy=True)
                loss, chunk_stats = self.loss(logp, hidden, batch)
            (loss * weight).backward()
            chunk_stats.update(loss=float(loss.detach()),
                               entropy=float(entropy.mean()) if entropy is not None and entropy.numel() else 0.0)
            for k, v in chunk_stats.items():
                stats[k] = stats.get(k, 0.0) + weight * v
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip))
        stats["lr"] = self._warm_up()
        self.optimizer.step()
        return stats

    def _warm_up(self) -> float:
        """Scale the learning rates for the coming step; returns the policy's. Adam's first
        steps move every weight by the full rate whatever its gradient's size (m/sqrt(v) is a
        sign at step 1), so on a noisy first batch a fresh optimizer takes its largest steps."""
        first = self.optimizer.param_groups[0]["params"][0]
        done = int(self.optimizer.state.get(first, {}).get("step", 0))
        scale = min(1.0, (done + 1) / self.config.warmup_steps) if self.config.warmup_steps else 1.0
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * scale
        return self.optimizer.param_groups[0]["lr"]

    def freeze_reference(self) -> Path:
        """Make the current weights the KL reference, e.g. the SFT warm start: the KL then holds
        RL near what SFT taught, where the base model (the default reference) cannot even call
        tools. Saved in the run folder, so a resumed run keeps the same reference."""
        path = save_adapter(self.model, self.out / "reference")
        self._load_reference(path)
        return path

    def _load_reference(self, path: Path) -> None:
        import copy

        from forge_bridge.trainer.lora import load_adapter_weights

        ref = copy.deepcopy(self.model)
        load_adapter_weights(ref, path)
        ref = ref.merge_and_unload().eval()  # a plain model: no LoRA cost in its forward
        for p in ref.parameters():
            p.requires_grad_(False)
        self.reference = ref

    def reference_logprobs(self, batch: dict) -> torch.Tensor:
        """Log-probabilities under the reference (default: the base model), without gradient."""
        args = (batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
        with torch.no_grad():
            if self.reference is not None:
                return token_logprobs(self.reference, *args)[0]
            with self.model.disable_adapter():
                return token_logprobs(self.model, *args)[0]

    # ------------------------------------------------------------------ publish, log, checkpoint
    def version_name(self, n: int) -> str:
        return f"{self.config.run_name}-v{n}"

    def publish(self, n: int) -> str:
        """Save adapter vN atomically and make the live policy serve it."""
        path = save_adapter(self.model, self.out / "adapters" / self.version_name(n))
        version = self.version_name(n)
        if version not in self.policy.versions:
            self.policy.load_adapter(path, version)
        return version

    def log(self, metrics: dict) -> None:
        metrics = {"run_id": self.run_id, **metrics}
        self.history.append(metrics)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.out / "tb"))
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and key != "iteration":
                self._tb.add_scalar(key, value, metrics["iteration"])
        self._tb.flush()

    def save_checkpoint(self) -> Path:
        return checkpoint.save(self.out / "checkpoints", self.iteration, self.model, self.optimizer,
                               self.extra_modules, {"config": self.config.to_dict(),
                                                    "trainer_rng": list(self.rng.getstate()[1])})

    def resume(self) -> int:
        """Continue the run in the folder from its last checkpoint (none: from the start). The
        rollouts of an iteration the kill interrupted stay stored, marked `excluded`: that
        iteration runs again with fresh rollouts."""
        if (self.out / "reference" / "adapter_model.safetensors").is_file():
            self._load_reference(self.out / "reference")
        path = checkpoint.latest(self.out / "checkpoints")
        state = None if path is None else checkpoint.load(path, self.model, self.optimizer,
                                                          self.extra_modules)
        done = 0 if state is None else state["iteration"]
        interrupted = [t.id for t in self.recorder.store.iter(run_id=self.run_id)
                       if t.excluded is None and t.metadata.get("iteration", 0) > done]
        self.recorder.store.exclude(interrupted, f"iteration {done + 1} was interrupted; "
                                    "it ran again on resume with fresh rollouts")
        if state is None:
            return self.iteration
        self.iteration = state["iteration"]
        self.rng.setstate((3, tuple(state["trainer_rng"]), None))
        log = self.out / "metrics.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        # An iteration logged but not checkpointed before the kill is run again: drop its line.
        self.history = [m for m in map(json.loads, filter(str.strip, lines))
                        if m["iteration"] <= self.iteration]
        log.write_text("".join(json.dumps(m) + "\n" for m in self.history))
        if self.iteration:
            self.publish(self.iteration)
        return self.iteration

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
