"""The runner GRPO and PPO share: rollouts -> advantages -> update -> publish -> log.

Each iteration collects `group_size` rollouts of each chosen task through the user's own
rollout function (`rollouts.collect`; on threads, or on Ray workers with `RayRollouts`), has the algorithm turn them into samples (`prepare`:
its advantage function, then `batch.build_samples`), takes the optimizer steps (`update`),
saves adapter vN atomically and publishes it to the live policy, logs metrics and writes a
checkpoint. A run killed at any point resumes from its last checkpoint with `resume=True`;
every trajectory recorded before the kill stays in the store.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

import torch

from forge_bridge.core import runs
from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument, Unsupported, WrongType
from forge_bridge.core.types import Trajectory, TrajectoryGroup
from forge_bridge.policies.base import DEFAULT_SLOT, Policy
from forge_bridge.policies.device import autocast, bf16_supported, resolve_device
from forge_bridge.trainer import checkpoint, rollouts
from forge_bridge.trainer.batch import BatchStats, Sample, collate, trained_tokens_per_step
from forge_bridge.trainer.config import TrainerConfig
from forge_bridge.trainer.logprobs import token_logprobs
from forge_bridge.trainer.lora import adapter_parameters, attach_lora, save_adapter
from forge_bridge.trainer.losses import aggregate, clipped_policy_loss, kl_k3, tis_weights
from forge_bridge.trainer.rollouts import Rollout, TaskSchedule


class Trainer:
    """Shared machinery; `GRPOTrainer` and `PPOTrainer` supply advantages and the loss."""

    extra_modules: dict[str, torch.nn.Module]

    def __init__(self, policy: Policy, config: TrainerConfig, *, model: str | None = None,
                 recorder: Recorder | None = None) -> None:
        from forge_bridge.policies import models

        if not isinstance(policy, Policy):
            raise WrongType(f"policy: expected a forge_bridge Policy, got {type(policy).__name__}")
        if not isinstance(config, TrainerConfig):
            raise WrongType(f"config: expected a GRPOConfig or PPOConfig, got {type(config).__name__}")
        source = model or getattr(policy, "model_path", None)
        if source is None:
            raise InvalidArgument("the trainer needs the base model the policy serves: pass "
                             "model='<name or directory>' (a VLLMPolicy does not know it)")
        self.policy, self.config = policy, config
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed)
        self.rng = random.Random(config.seed)
        self.device = resolve_device(config.device)
        """Where the model, the batches and the optimizer state live."""
        base, self.tokenizer = models.load(str(source))
        self.pad_id: int = self.tokenizer.pad_token_id or 0
        """What collated batches are padded with (masked out wherever it lands)."""
        base.to(self.device)
        if str(self.device) == "cpu" and hasattr(base, "set_attn_implementation"):
            # On a CPU, sdpa's backward is the slowest op of short-sequence updates; plain
            # matmul attention is faster there (a third of the update with prefix sharing).
            base.set_attn_implementation("eager")
        if config.gradient_checkpointing:
            base.activation_checkpointing_enable({"use_reentrant": False})
        self.share_prefix = not config.gradient_checkpointing
        """Whether a microbatch's shared token prefix runs once (not under activation checkpointing)."""
        self.slots = [DEFAULT_SLOT] + sorted(set((config.role_slots or {}).values()) - {DEFAULT_SLOT})
        """The LoRAs this run trains, by policy slot: the shared one and one per role slot."""
        self.model = attach_lora(base, config.lora_rank, config.lora_alpha, config.lora_targets,
                                 extra_adapters=self.slots[1:])
        self.bf16 = bf16_supported(self.device) if config.bf16 is None else config.bf16
        self.extra_modules = {name: module.to(self.device) for name, module in
                              self._extra_modules(base.config.hidden_size).items()}
        groups = {slot: self._param_groups(slot) for slot in self.slots}
        self.group_names = {slot: [g.pop("name", str(n)) for n, g in enumerate(gs)] for slot, gs in groups.items()}
        """Each optimizer's parameter groups by name ('0': the LoRA), for their gradient norms."""
        self.optimizers = {slot: torch.optim.AdamW(groups[slot]) for slot in self.slots}
        """One optimizer per LoRA: a role's updates never move another role's adapter or state."""
        self.base_lrs = {slot: [g["lr"] for g in opt.param_groups] for slot, opt in self.optimizers.items()}
        self._slot = DEFAULT_SLOT
        self.reference: Any = None
        """The frozen KL reference model (None: the base model, adapter disabled)."""
        self.previous_run = runs.holds_run(self.out)
        """The folder held a run when this trainer was made: train() resumes it or refuses."""
        self.run_id = (runs.read_run_id(self.out, config.run_name) if self.previous_run
                       else runs.new_run(self.out, config.run_name))
        """Keys every trajectory, group id and metrics line of this run."""
        self.recorder = recorder or Recorder(self.out / "trajectories.db", run_id=self.run_id)
        if not (self.out / "tokenizer").is_dir():  # the run folder reads on its own (forge-bridge inspect)
            self.tokenizer.save_pretrained(self.out / "tokenizer")
        (self.out / "trainer.json").write_text(json.dumps(
            {"trainer": type(self).__name__, "model": str(source), "config": dataclasses.asdict(config)},
            indent=1, default=str))  # out_dir may be a Path
        self.step_advantages: dict[tuple[str, int], float] = {}
        """(trajectory id, step) -> the advantage `prepare` computed for the current iteration."""
        self.iteration = 0
        self.history: list[dict] = []
        self._tb = None

    # ------------------------------------------------------------------ subclass hooks
    def _extra_modules(self, hidden_size: int) -> dict[str, torch.nn.Module]:
        return {}

    def _param_groups(self, slot: str) -> list[dict]:
        return [{"params": adapter_parameters(self.model, slot), "lr": self.config.lr}]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer of the LoRA being trained now (the shared one outside an update)."""
        return self.optimizers[self._slot]

    def slot_of(self, group: TrajectoryGroup) -> str:
        """The policy slot (and LoRA) a group's trajectories train: its role's, else the default."""
        return self.slot_of_role(group.role)

    def slot_of_role(self, role: str | None) -> str:
        """The slot (and LoRA) a role's trajectories train (no role, or none of its own: the default)."""
        return (self.config.role_slots or {}).get(role, DEFAULT_SLOT) if role else DEFAULT_SLOT

    @contextmanager
    def training(self, slot: str):
        """Forward passes, updates and `optimizer` use the LoRA of `slot` inside this block."""
        self.model.set_adapter(slot)
        self._slot = slot
        try:
            yield
        finally:
            self.model.set_adapter(DEFAULT_SLOT)
            self._slot = DEFAULT_SLOT

    def prepare(self, groups: list[TrajectoryGroup]) -> tuple[list[Sample], BatchStats, dict]:
        """The algorithm: advantages of the groups' steps, as training samples."""
        raise NotImplementedError

    def remember_advantages(self, trajectories: Sequence[Trajectory], advantages: Sequence[torch.Tensor]) -> None:
        """Keep what `prepare` gave each step ([S_i] per trajectory), for `record_credit`."""
        self.step_advantages = {(t.id, k): float(a[k]) for t, a in zip(trajectories, advantages) for k in range(len(a))}

    def record_credit(self, groups: list[TrajectoryGroup], samples: list[Sample], iteration: int) -> None:
        """Store what this iteration made of each step -- the advantage `prepare` gave it and the
        completion tokens the loss trains on (0: its group was uniform, or it was cut or
        untrainable) -- so `forge-bridge inspect` shows exactly what the update saw."""
        trained = trained_tokens_per_step(samples)
        self.recorder.store.record_credit(iteration, [
            (t.id, k, self.step_advantages.get((t.id, k)), trained.get((t.id, k), 0))
            for group in groups for t in group.trajectories for k in range(len(t.transitions))])

    def loss(self, logp: torch.Tensor, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def policy_loss(self, logp: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        """The clipped surrogate GRPO and PPO share. The ratio is against pi_old, the trainer's
        own logprobs before this update (`trainer_logprobs`, or when the update is one optimizer
        step, the current ones without gradient: the same numbers, no extra pass); with `tis_cap`
        each token is weighted by min(pi_old / pi_sampler, cap) for the sampler's mismatch. Plus
        the KL to the reference when `kl_beta` is set; without it the KL to the sampler is only
        logged (a cheap drift gauge)."""
        mask = batch["loss_mask"]
        sampler = batch["sampler_logprobs"]
        old = batch["trainer_logprobs"] if "trainer_logprobs" in batch else logp.detach()
        weights = None if self.config.tis_cap is None else tis_weights(old, sampler, self.config.tis_cap)
        loss, stats = clipped_policy_loss(logp, old, batch["advantages"], mask, self.config.clip_low,
                                          self.config.clip_high, weights, self.config.loss_aggregation)
        m = mask.bool()
        with torch.no_grad():
            stats["sampler_logp_gap"] = float((old - sampler)[m].abs().mean()) if m.any() else 0.0
            if weights is not None:
                stats["tis_weight_mean"] = float(weights[m].mean()) if m.any() else 1.0
        if self.config.kl_beta > 0:
            kl = aggregate(kl_k3(logp, self.reference_logprobs(batch)), mask, self.config.loss_aggregation)
            loss = loss + self.config.kl_beta * kl
            stats["kl"] = float(kl.detach())
        else:
            with torch.no_grad():
                stats["kl"] = float(aggregate(kl_k3(logp, sampler), mask))
        return loss, stats

    # ------------------------------------------------------------------ the loop
    def train(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: Sequence[Any] | TaskSchedule,
              iterations: int, *, resume: bool = False) -> list[dict]:
        """Run iterations until `iterations` in all have been done (counting resumed ones).

        `tasks`: the training tasks (`tasks_per_iteration` of them are drawn each iteration), or
        a schedule `iteration -> tasks` that picks each iteration's tasks itself (a curriculum,
        or one task of each kind so no kind is starved)."""
        from tqdm.auto import tqdm

        if not callable(rollout) and not isinstance(rollout, rollouts.EpisodeRunner):
            raise WrongType(f"rollout: expected a function task -> reward (or an EpisodeRunner such as "
                            f"RayRollouts), got {type(rollout).__name__}")
        if not callable(tasks):
            tasks = list(tasks)
            if not tasks:
                raise InvalidArgument("tasks: expected at least one task")
        if resume:
            self.resume()
        elif self.previous_run and self.iteration == 0:
            raise runs.refuse(self.out, self.run_id)
        bar = tqdm(range(self.iteration, iterations), desc="training", unit="it",
                   disable=not self.config.progress, initial=self.iteration, total=iterations)
        for it in bar:
            t0 = time.perf_counter()
            groups, rollout_stats = self.collect(rollout, rollouts.tasks_for(
                it, tasks, self.config.tasks_per_iteration, self.config.seed), it)
            t1 = time.perf_counter()
            learned, trained_tokens = {}, 0
            for slot in self.slots:  # each LoRA learns from its own roles' groups only
                mine = [g for g in groups if self.slot_of(g) == slot]
                if not mine and slot != DEFAULT_SLOT:
                    continue
                with self.training(slot):
                    samples, batch_stats, adv_stats = self.prepare(mine)
                    self.record_credit(mine, samples, it + 1)
                    update_stats = self.update(samples) if samples else {}
                trained_tokens += batch_stats.trained_tokens
                stats = {**adv_stats, **{f"batch_{k}": v for k, v in vars(batch_stats).items()}, **update_stats}
                learned.update(stats if len(self.slots) == 1 else {f"{slot}/{k}": v for k, v in stats.items()})
            t2 = time.perf_counter()
            versions = self.publish_all(it + 1)
            t3 = time.perf_counter()
            metrics = {"iteration": it + 1, "adapter": versions[DEFAULT_SLOT],
                       **{f"adapter_{slot}": v for slot, v in versions.items() if slot != DEFAULT_SLOT},
                       **rollout_stats, **learned,
                       "time_rollout_s": t1 - t0, "time_update_s": t2 - t1, "time_publish_s": t3 - t2,
                       "tokens_per_s": trained_tokens / max(t2 - t1, 1e-9)}
            self.iteration = it + 1
            self.log(metrics)
            self.save_checkpoint()
            bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}",
                            success=f"{metrics['success_rate']:.2f}")
        return self.history

    def collect(self, rollout: Rollout | rollouts.EpisodeRunner, tasks: list[tuple[str, Any]], it: int
                ) -> tuple[list[TrajectoryGroup], dict]:
        """Iteration `it`'s rollouts of these (task id, task) pairs, as trainable groups: on
        threads here, or on the runner's workers (which reach the policy this trainer publishes to)."""
        return rollouts.collect(rollout, tasks, it, recorder=self.recorder, run_id=self.run_id,
                                group_size=self.config.group_size, concurrency=self.config.concurrency,
                                success_threshold=self.config.success_threshold,
                                progress=self.config.progress, policy=self.policy, seed=self.config.seed)

    def autocast(self):
        """The precision context of forward passes (bf16 autocast where the device has it)."""
        return autocast(self.device, self.bf16)

    def collate(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        """The samples as padded tensors on the trainer's device."""
        return collate(samples, self.pad_id, self.device)

    def update(self, samples: list[Sample]) -> dict:
        """`epochs` passes of minibatch steps over the samples; returns averaged statistics."""
        if self.config.epochs > 1 or len(samples) > self.config.minibatch_size:
            self._score_old(samples)  # later steps would otherwise see an already-moved policy
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

    def _score_old(self, samples: list[Sample]) -> None:
        """pi_old: the logprobs of every sample under the weights before this update."""
        size = self.config.microbatch_size or self.config.minibatch_size
        with torch.no_grad():
            for start in range(0, len(samples), size):
                chunk = samples[start:start + size]
                logp = self.score(self.collate(chunk))[0]
                for b, sample in enumerate(chunk):
                    sample.trainer_logprobs = logp[b, :len(sample.input_ids)].tolist()

    def score(self, batch: dict, with_entropy: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logp [B, T], hidden [B, T, H], entropy) of the batch under the model being trained, at
        each sample's sampling temperature."""
        with self.autocast():
            return token_logprobs(self.model, batch["input_ids"], batch["attention_mask"],
                                  batch["loss_mask"], with_entropy, batch["temperature"],
                                  share_prefix=self.share_prefix)

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
            batch = self.collate(chunk)
            logp, hidden, entropy = self.score(batch, with_entropy=True)
            with self.autocast():
                loss, chunk_stats = self.loss(logp, hidden, batch)
            (loss * weight).backward()
            chunk_stats.update(loss=float(loss.detach()),
                               entropy=float(entropy.mean()) if entropy is not None and entropy.numel() else 0.0)
            for k, v in chunk_stats.items():
                stats[k] = stats.get(k, 0.0) + weight * v
        # each parameter group clipped on its own: a young value head's large gradient must not
        # shrink the LoRA's step (the first group is the LoRA; its norm is `grad_norm`)
        for n, (group, name) in enumerate(zip(self.optimizer.param_groups, self.group_names[self._slot])):
            norm = float(torch.nn.utils.clip_grad_norm_(group["params"], self.config.grad_clip))
            stats["grad_norm" if n == 0 else f"grad_norm_{name}"] = norm
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
        for group, base in zip(self.optimizer.param_groups, self.base_lrs[self._slot]):
            group["lr"] = base * scale
        return self.optimizer.param_groups[0]["lr"]

    def freeze_reference(self) -> Path:
        """Make the current weights the KL reference, e.g. the SFT warm start: the KL then holds
        RL near what SFT taught, where the base model (the default reference) cannot even call
        tools. Saved in the run folder, so a resumed run keeps the same reference."""
        if len(self.slots) > 1:
            raise Unsupported("freeze_reference with per-role adapters (role_slots): the KL "
                              "reference is the base model there")
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
        args = (batch["input_ids"], batch["attention_mask"], batch["loss_mask"], False, batch.get("temperature"))
        with torch.no_grad():
            if self.reference is not None:
                return token_logprobs(self.reference, *args)[0]
            with self.model.disable_adapter():
                return token_logprobs(self.model, *args, share_prefix=self.share_prefix)[0]

    # ------------------------------------------------------------------ publish, log, checkpoint
    def version_name(self, n: int, slot: str = DEFAULT_SLOT) -> str:
        """'<run>-vN' for the shared LoRA, '<run>-<slot>-vN' for a role slot's."""
        return f"{self.config.run_name}-v{n}" if slot == DEFAULT_SLOT else f"{self.config.run_name}-{slot}-v{n}"

    def publish_next(self) -> str:
        """Count one more update (an SFT warm start, say) and publish it as the next version."""
        self.iteration += 1
        return self.publish(self.iteration)

    def publish(self, n: int) -> str:
        """Save adapter vN of every LoRA atomically and make the live policy serve each from its
        slot; returns the shared LoRA's version."""
        return self.publish_all(n)[DEFAULT_SLOT]

    def publish_all(self, n: int) -> dict[str, str]:
        """`publish`, returning every slot's new version."""
        versions = {}
        for slot in self.slots:
            version = versions[slot] = self.version_name(n, slot)
            path = save_adapter(self.model, self.out / "adapters" / version, adapter=slot)
            if version not in self.policy.versions(slot):
                self.policy.load_adapter(path, version, slot=slot)
        return versions

    def log(self, metrics: dict) -> None:
        metrics = {"run_id": self.run_id, **metrics}
        self.history.append(metrics)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # a bare GPU machine: metrics.jsonl still has every number
                self._tb = False
                warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=2)
            else:
                self._tb = SummaryWriter(str(self.out / "tb"))
        if self._tb is False:
            return
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and key != "iteration":
                self._tb.add_scalar(key, value, metrics["iteration"])
        self._tb.flush()

    def save_checkpoint(self) -> Path:
        return checkpoint.save(self.out / "checkpoints", self.iteration, self.model, self.optimizers,
                               self.extra_modules, {"config": self.config.to_dict(),
                                                    "trainer_rng": list(self.rng.getstate()[1]),
                                                    **self._checkpoint_state()})

    def _checkpoint_state(self) -> dict:
        """What a subclass records in its checkpoints to check on resume (`_check_resumable`)."""
        return {}

    def _check_resumable(self, state: dict, path: Path) -> None:
        """Raise `InvalidState` when a checkpoint cannot continue this run as it is."""

    def resume(self) -> int:
        """Continue the run in the folder from its last checkpoint (none: from the start). The
        rollouts of an iteration the kill interrupted stay stored, marked `excluded`: that
        iteration runs again with fresh rollouts."""
        if (self.out / "reference" / "adapter_model.safetensors").is_file():
            self._load_reference(self.out / "reference")
        path = checkpoint.latest(self.out / "checkpoints")
        if path is not None:  # refused before anything is restored: a refusal changes nothing
            self._check_resumable(json.loads((path / "state.json").read_text()), path)
        state = None if path is None else checkpoint.load(path, self.model, self.optimizers,
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
        if self._tb:
            self._tb.close()
