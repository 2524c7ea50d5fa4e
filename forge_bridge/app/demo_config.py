"""The demo's settings (`forge-bridge demo`'s flags): one frozen dataclass, checked on creation."""

from __future__ import annotations

from dataclasses import dataclass, fields

from forge_bridge.app.tasks import BRIDGE_KINDS, KINDS_ORDER, MULTI_STEP_KINDS
from forge_bridge.core.errors import InvalidArgument

_MAY_BE_ZERO = ("seed", "sft_epochs", "rl_iterations", "validate_every")


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo pipeline (the defaults are the measured `make demo`)."""

    model: str = "smollm2-135m-instruct"
    """A named model (`forge-bridge fetch --list`) or a local model directory."""
    out_dir: str = "runs/demo"
    """Run folder: trajectories, adapters, metrics, TensorBoard logs, reward_curve.png."""
    seed: int = 0
    """Seed for the task splits, sampling and training."""
    train_per_kind: int = 24
    """Training tasks of each kind."""
    eval_per_kind: int = 10
    """Validation tasks, and held-out tasks, of each kind."""
    demonstrate: tuple[str, ...] = ("multiply", "lookup", "lookup_multiply")
    """Kinds the scripted expert demonstrates for SFT: the demo's own (its training tasks) and
    `BRIDGE_KINDS`, demonstrated only, never evaluated (`train_per_kind` tasks of each)."""
    multi_step_demos: int | None = 4
    """Demonstrations of each multi-step kind in `demonstrate` (its first training tasks; GRPO
    draws from all of them; the guides teach the rest); None: all. Bridge kinds are not limited."""
    sft_epochs: int = 3
    """Passes over the demonstrations (chosen on the validation split among 1, 2 and 3 epochs:
    docs/experiments/demo.md); 0: no warm start, GRPO from the base model (one that already calls
    tools, such as qwen2.5-coder-0.5b-instruct)."""
    sft_lr: float = 1e-3
    """SFT learning rate."""
    rl_iterations: int = 8
    """GRPO iterations (0: SFT alone)."""
    rl_tasks_per_kind: tuple[int, ...] = (2, 1, 2)
    """Tasks of each kind (multiply, lookup, lookup_multiply) in every GRPO iteration: every kind
    gets its signal each time; the first call (multiply for 2 tasks, lookup for 3) and the call
    after a lookup (answer 1, multiply 2) are each taught both ways in every update."""
    group_size: int = 8
    """Rollouts per task (GRPO group)."""
    validate_every: int = 2
    """GRPO scores the validation tasks greedily at its start and every this many iterations, and
    ends serving the best version on them, never one below the warm start (`train(validation=...)`);
    0: off, the last version is served."""
    baseline: str = "batch"
    """GRPO's baseline: 'batch' (every rollout of the iteration, so a kind whose rollouts all
    failed, or all passed, still has a signal) or 'group' (the task's own rollouts: then such a
    kind was silent and the others pulled the shared decisions their way until it was lost)."""
    temperature: float = 0.7
    """Sampling temperature of the rollouts (evaluation is greedy)."""
    max_tokens: int = 48
    """Completion limit per model call (the longest expert call is under 40 tokens)."""
    max_model_calls: int = 4
    """Step limit of one episode: a longer tool loop is cut and recorded as truncated."""
    concurrency: int = 20
    """Agents run at once (their model calls are batched together: 40 rollouts in two waves)."""
    guide: str = "teacher"
    """Guides in GRPO groups the agent fails: 'none', 'teacher' (the teacher's rollouts: the teacher
    adapter's with `distill_beta`, else the scripted expert's) or 'demonstrations'."""
    guide_k: int = 2
    """Guide trajectories per guided group (the scripted expert's are all alike)."""
    guide_shaping: float = 0.01
    """The constant c of the guide tokens' weight pi / (pi + c) (`Guidance.shaping`; picked on validation)."""
    relabel_weight: float = 0.0
    """DAgger: imitate the teacher (the teacher adapter with `distill_beta`, else the scripted expert)
    at the states of failed rollouts, with this weight (0: off)."""
    distill_beta: float = 1.0
    """On-policy distillation from a teacher adapter (the same base, a LoRA trained by SFT on a
    demonstration of every training task), weight beta (`GRPOConfig.distill_beta`; 0: off and the
    scripted expert guides; 1 picked on validation among 0.1 and 1: docs/teacher.md)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str" and not (isinstance(value, str) and value):
                raise InvalidArgument(f"DemoConfig.{f.name}: expected a non-empty string, got {value!r}")
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < (0 if f.name in _MAY_BE_ZERO else 1)):
                raise InvalidArgument(f"DemoConfig.{f.name}: expected an int >= "
                                 f"{0 if f.name in _MAY_BE_ZERO else 1}, got {value!r}")
            if f.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or value < 0 or (value == 0 and f.name.endswith("lr"))):
                raise InvalidArgument(f"DemoConfig.{f.name}: expected a number {'> 0' if f.name.endswith('lr') else '>= 0'}, "
                                 f"got {value!r}")
        if (not isinstance(self.rl_tasks_per_kind, tuple) or len(self.rl_tasks_per_kind) != len(KINDS_ORDER)
                or not all(isinstance(n, int) and n >= 0 for n in self.rl_tasks_per_kind)
                or sum(self.rl_tasks_per_kind) == 0):
            raise InvalidArgument(f"DemoConfig.rl_tasks_per_kind: expected {len(KINDS_ORDER)} counts >= 0 "
                             f"(one per kind: {', '.join(KINDS_ORDER)}), got {self.rl_tasks_per_kind!r}")
        if (not isinstance(self.demonstrate, tuple) or not self.demonstrate
                or any(not isinstance(kind, str) or kind not in KINDS_ORDER + BRIDGE_KINDS for kind in self.demonstrate)
                or len(set(self.demonstrate)) != len(self.demonstrate)):
            raise InvalidArgument(f"DemoConfig.demonstrate: expected distinct kinds from {KINDS_ORDER + BRIDGE_KINDS}, "
                                  f"got {self.demonstrate!r}")
        if self.guide not in ("none", "teacher", "demonstrations"):
            raise InvalidArgument(f"DemoConfig.guide: expected 'none', 'teacher' or 'demonstrations', got {self.guide!r}")
        if self.multi_step_demos is not None and (
                isinstance(self.multi_step_demos, bool) or not isinstance(self.multi_step_demos, int)
                or not 0 <= self.multi_step_demos <= self.train_per_kind):
            raise InvalidArgument(f"DemoConfig.multi_step_demos: expected None or an int in [0, train_per_kind="
                                  f"{self.train_per_kind}], got {self.multi_step_demos!r}")
        if self.multi_step_demos == 0 and set(self.demonstrate) <= set(MULTI_STEP_KINDS):
            raise InvalidArgument(f"DemoConfig: nothing to demonstrate: demonstrate={self.demonstrate!r} names only "
                                  "multi-step kinds and multi_step_demos=0")
        if self.sft_epochs == 0 and self.distill_beta > 0:
            raise InvalidArgument("DemoConfig: the teacher adapter (distill_beta > 0) is trained by SFT: with "
                                  "sft_epochs=0 set distill_beta=0")
        if self.baseline not in ("group", "batch"):
            raise InvalidArgument(f"DemoConfig.baseline: expected 'group' or 'batch', got {self.baseline!r}")
