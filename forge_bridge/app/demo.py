"""The main job, `forge-bridge demo` (what `make demo` runs): an ordinary LangChain agent gets
measurably better at tool use through forge-bridge, on the embedded model, on a CPU.

1. build a `create_agent` agent with calculator and lookup tools, on `LocalPolicy` through
   `ForgeMiddleware` (the one added line);
2. evaluate it greedily on the held-out tasks (base), and on the validation tasks the settings
   were chosen on;
3. record demonstrations through the same middleware with a scripted expert policy, and warm
   start the LoRA with SFT on them (a 135M model does not call tools out of the box);
4. evaluate (SFT); train with multi-turn GRPO (per-step gamma credit, a batch baseline, a KL
   to the warm start) while the same agent object keeps running and picks up every new
   adapter; evaluate (SFT+RL);
5. print the table, write the reward curve and TensorBoard logs, and let the live agent answer
   one more question with the trained adapter.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from forge_bridge.app.report import print_table, rates
from forge_bridge.app.tasks import (
    BRIDGE_KINDS,
    KINDS_ORDER,
    MULTI_STEP_KINDS,
    Task,
    bridge_tasks,
    check_answer,
    expert_reply,
    held_out_tasks,
    make_splits,
)
from forge_bridge.core.errors import InvalidArgument

_MAY_BE_ZERO = ("seed", "rl_iterations", "rl_warmup_steps")


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo pipeline (the defaults are the measured `make demo`)."""

    model: str = "smollm2-135m-instruct"
    """Embedded model name or a local model directory."""
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
    docs/experiments/demo.md)."""
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
    rl_lr: float = 3e-4
    """GRPO learning rate."""
    rl_minibatch: int = 64
    """Rollout samples per GRPO optimizer step: more than an iteration has, so one step on all of
    them, and opposite pushes of two kinds on a decision they share cancel instead of taking
    turns (docs/experiments/demo.md)."""
    rl_warmup_steps: int = 2
    """Optimizer steps over which the GRPO learning rate rises to `rl_lr` (a fresh Adam's first
    steps are its largest, whatever the gradient's size)."""
    baseline: str = "batch"
    """GRPO's baseline: 'batch' (every rollout of the iteration, so a kind whose rollouts all
    failed, or all passed, still has a signal) or 'group' (the task's own rollouts: then such a
    kind was silent and the others pulled the shared decisions their way until it was lost)."""
    kl_beta: float = 0.1
    """Weight of the KL to the SFT warm start (not the base model, which cannot call tools);
    0: none."""
    temperature: float = 0.7
    """Sampling temperature of the rollouts (evaluation is greedy)."""
    max_tokens: int = 48
    """Completion limit per model call (the longest expert call is under 40 tokens)."""
    max_model_calls: int = 4
    """Step limit of one episode: a longer tool loop is cut and recorded as truncated."""
    gamma: float = 0.95
    """Per-step discount."""
    concurrency: int = 20
    """Agents run at once (their model calls are batched together: 40 rollouts in two waves)."""
    guide: str = "teacher"
    """Guides in GRPO groups the agent fails: 'none', 'teacher' (the scripted expert's rollouts) or 'demonstrations'."""
    guide_k: int = 2
    """Guide trajectories per guided group (the scripted expert's are all alike)."""
    guide_shaping: float = 0.01
    """gamma of the guide tokens' weight pi / (pi + gamma) (`Guidance.shaping`; picked on validation)."""
    relabel_weight: float = 0.0
    """DAgger: imitate the scripted expert at the states of failed rollouts, with this weight (0: off)."""

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
        if self.baseline not in ("group", "batch"):
            raise InvalidArgument(f"DemoConfig.baseline: expected 'group' or 'batch', got {self.baseline!r}")
        if self.gamma > 1:
            raise InvalidArgument(f"DemoConfig.gamma: expected a number in [0, 1], got {self.gamma!r}")


def build_agent(policy: Any, temperature: float, max_tokens: int, with_add: bool = False,
                system_prompt: str | None = None) -> Any:
    """The user's ordinary LangChain agent, plus the one forge-bridge line (`with_add`: an `add`
    tool too, for the suite's `lookup_add` kind; `system_prompt`: the agent's instructions, none
    by default)."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from forge_bridge.adapters.langchain import ForgeMiddleware
    from forge_bridge.app.tasks import CITIES

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool
    def lookup(city: str) -> str:
        """Population of a city."""
        value = CITIES.get(city.strip())
        return str(value) if value is not None else f"unknown city: {city}"

    # The model the agent was written for; the middleware replaces it on every call.
    model = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1")
    return create_agent(model, [add, multiply, lookup] if with_add else [multiply, lookup],
                        system_prompt=system_prompt,
                        middleware=[ForgeMiddleware(policy, temperature=temperature, max_tokens=max_tokens)])


def final_text(result: dict) -> str:
    return str(result["messages"][-1].content)


def attempt(agent: Any, task: Task, max_model_calls: int) -> bool:
    """Run the agent on one task inside the current episode; pass/fail. A tool loop longer
    than `max_model_calls` is cut (LangGraph's recursion limit) and the episode truncated."""
    from langgraph.errors import GraphRecursionError

    import forge_bridge as fb

    try:
        result = agent.invoke({"messages": [{"role": "user", "content": task.question}]},
                              {"recursion_limit": 2 * max_model_calls})
    except GraphRecursionError:
        fb.current_episode().truncate(f"more than {max_model_calls} model calls")
        return False
    return check_answer(task, final_text(result))


def run_tasks(agent: Any, tasks: list[Task], recorder: Any, *, greedy: bool, concurrency: int,
              desc: str, progress: bool = True, max_model_calls: int = 4) -> list[bool]:
    """Run each task once inside its own episode; returns pass/fail per task. `recorder`: the
    `Recorder` every episode goes to, or a list of one per task."""
    from tqdm.auto import tqdm

    import forge_bridge as fb

    recorders = recorder if isinstance(recorder, list) else [recorder] * len(tasks)
    if len(recorders) != len(tasks):
        raise InvalidArgument(f"run_tasks: {len(recorders)} recorders for {len(tasks)} tasks")

    def one(task: Task, recorder: Any) -> bool:
        with fb.sampling(temperature=0) if greedy else contextlib.nullcontext():
            with fb.episode(task.id, recorder=recorder, metadata={"kind": task.kind}) as ep:
                try:
                    passed = attempt(agent, task, max_model_calls)
                except fb.PolicyError:
                    raise
                except Exception as exc:  # the agent stopped on its own error: a failed attempt
                    ep.mark_end("crashed", f"{type(exc).__name__}: {exc}")
                    passed = False
                ep.reward(1.0 if passed else 0.0)
                return passed

    with ThreadPoolExecutor(concurrency) as pool:
        return list(tqdm(pool.map(one, tasks, recorders), total=len(tasks), desc=desc, leave=False,
                         disable=not progress))


def demonstration_tasks(config: DemoConfig, train: list[Task]) -> list[Task]:
    """The tasks the scripted expert demonstrates: the training tasks of the kinds in
    `config.demonstrate` (of a multi-step kind only the first `multi_step_demos`), then the
    bridge kinds' own tasks."""
    first = {kind: [t for t in train if t.kind == kind][:config.multi_step_demos if kind in MULTI_STEP_KINDS else None]
             for kind in config.demonstrate if kind not in BRIDGE_KINDS}
    return [t for t in train if t in first.get(t.kind, ())] + [
        t for kind in config.demonstrate if kind in BRIDGE_KINDS for t in bridge_tasks(kind, config.train_per_kind, config.seed)]


def run(config: DemoConfig = DemoConfig(), progress: bool = True) -> dict:
    """The whole demo: base -> warm start -> GRPO, evaluated after each, then one live answer."""
    import torch

    torch.manual_seed(config.seed)
    demo = DemoRun(config, progress)
    demo.evaluate("base", "eval-base", f"evaluating the base model on {len(demo.held_out)} held-out and "
                  f"{len(demo.validation)} validation tasks (greedy)")
    trainer, sft = demo.warm_start()
    demo.evaluate("SFT", "eval-sft", "evaluating after SFT (same agent object, now on the SFT adapter)")
    if config.rl_iterations:
        demo.reinforce(trainer)
        demo.evaluate("SFT+RL", "eval-rl", "evaluating after SFT+RL")
    trainer.close()
    return demo.finish(sft)


class DemoRun:
    """One run of the demo in its folder: the store, the splits, the live agent and what was measured."""

    def __init__(self, config: DemoConfig, progress: bool) -> None:
        import forge_bridge as fb
        from forge_bridge.core.runs import set_aside
        from forge_bridge.core.store import TrajectoryStore

        self.config, self.progress = config, progress
        self.out = out = Path(config.out_dir)
        earlier = set_aside(out)
        if earlier is not None:
            print(f"(the earlier run in {out} was moved to {earlier})")
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(asdict(config), indent=2))
        self.store = TrajectoryStore(out / "trajectories.db")
        self.train, self.validation = make_splits(config.train_per_kind, config.eval_per_kind, config.seed)
        self.held_out = held_out_tasks(config.eval_per_kind, config.seed)
        self.timings: dict[str, float] = {}
        self.results: dict[str, dict] = {}
        self.on_validation: dict[str, dict] = {}
        t = self.phase(f"loading {config.model} (offline) and building the LangChain agent")
        self.policy = fb.LocalPolicy(config.model, max_batch=config.concurrency)
        self.agent = build_agent(self.policy, config.temperature, config.max_tokens)
        self.timings["load"] = time.perf_counter() - t

    @staticmethod
    def phase(name: str) -> float:
        print(f"\n== {name}", flush=True)
        return time.perf_counter()

    def evaluate(self, label: str, run_id: str, title: str) -> None:
        """Greedy success on the held-out and the validation tasks, by kind."""
        import forge_bridge as fb

        t = self.phase(title)
        # validation episodes under their own run id: `eval-*` (the inspector's) stays held-out only
        recorders = ([fb.Recorder(self.store, run_id)] * len(self.held_out)
                     + [fb.Recorder(self.store, run_id.replace("eval-", "validation-"))] * len(self.validation))
        passed = run_tasks(self.agent, self.held_out + self.validation, recorders, greedy=True,
                           concurrency=self.config.concurrency, desc=f"eval {label}", progress=self.progress,
                           max_model_calls=self.config.max_model_calls)
        self.results[label] = rates(self.held_out, passed[:len(self.held_out)])
        self.on_validation[label] = rates(self.validation, passed[len(self.held_out):])
        self.timings[f"{label} eval"] = time.perf_counter() - t

    def warm_start(self) -> tuple[Any, dict]:
        """Demonstrations recorded through the same middleware, then SFT; returns the trainer and the SFT's figures."""
        import forge_bridge as fb
        from forge_bridge.trainer.sft import SFTConfig, sft

        config, store = self.config, self.store
        shown = demonstration_tasks(config, self.train)
        t = self.phase(f"recording {len(shown)} demonstrations of {', '.join(config.demonstrate)} through the same "
                       "middleware (scripted expert)")
        expert_agent = build_agent(fb.ScriptedPolicy(expert_reply, self.policy.tokenizer), 0.0, config.max_tokens)
        run_tasks(expert_agent, shown, fb.Recorder(store, "demonstrations"), greedy=True,
                  concurrency=config.concurrency, desc="demonstrations", progress=self.progress,
                  max_model_calls=config.max_model_calls)
        # in task order, not the order concurrent agents finished in: the same seed, the same SFT
        self.demos = demos = sorted(store.trajectories(run_id="demonstrations", status="complete"), key=lambda t: t.task_id)
        trainer = fb.GRPOTrainer(self.policy, fb.GRPOConfig(
            gamma=config.gamma, group_size=config.group_size, lr=config.rl_lr,
            warmup_steps=config.rl_warmup_steps, kl_beta=config.kl_beta,
            minibatch_size=config.rl_minibatch, microbatch_size=8,
            baseline=config.baseline, skip_uniform_groups=config.kl_beta == 0,
            concurrency=config.concurrency,
            run_name="demo", out_dir=str(self.out), seed=config.seed, progress=self.progress,
            max_seq_len=768, merge_steps=True, relabel_weight=config.relabel_weight,
            guidance=None if config.guide == "none" else fb.Guidance(k=config.guide_k, source=config.guide,
                                                                     shaping=config.guide_shaping)),
            recorder=fb.Recorder(store))  # episodes: the run id
        warm = sft(trainer, demos, SFTConfig(epochs=config.sft_epochs, lr=config.sft_lr, batch_size=8))
        print(f"  SFT on {warm['sft_samples']} model calls: loss {warm['sft_loss_first']:.3f} -> "
              f"{warm['sft_loss_last']:.3f}; published {warm['adapter']} to the live agent")
        if config.kl_beta > 0:
            trainer.freeze_reference()  # GRPO's KL is to this warm start, not to the base model
        self.timings["demos + SFT"] = time.perf_counter() - t
        return trainer, warm

    def reinforce(self, trainer: Any) -> None:
        """GRPO on the training tasks, the same number of each kind every iteration."""
        config = self.config
        t = self.phase(f"GRPO: {config.rl_iterations} iterations x {sum(config.rl_tasks_per_kind)} tasks x "
                       f"{config.group_size} rollouts at T={config.temperature}, per-step gamma={config.gamma}")

        def rollout(task: Task) -> float:
            return 1.0 if attempt(self.agent, task, config.max_model_calls) else 0.0

        by_kind = {kind: [t for t in self.train if t.kind == kind] for kind in KINDS_ORDER}
        if config.guide != "none" or config.relabel_weight > 0:
            trainer.use_teacher(self.teacher())

        def schedule(it: int) -> list[Task]:  # the same number of tasks of each kind, drawn anew
            rng = random.Random(config.seed * 100_003 + it)
            return [t for kind, n in zip(KINDS_ORDER, config.rl_tasks_per_kind)
                    for t in rng.sample(by_kind[kind], n)]

        trainer.train(rollout, schedule, iterations=trainer.iteration + config.rl_iterations)
        self.timings["GRPO"] = time.perf_counter() - t

    def teacher(self) -> Any:
        """The scripted expert as a teacher (guides, relabelling), and the recorded demonstrations."""
        import forge_bridge as fb

        config = self.config

        def make_rollout(policy: Any) -> Any:
            agent = build_agent(policy, config.temperature, config.max_tokens)
            return lambda task: 1.0 if attempt(agent, task, config.max_model_calls) else 0.0
        return fb.Teacher(policy=fb.ScriptedPolicy(expert_reply, self.policy.tokenizer), make_rollout=make_rollout,
                          demonstrations=self.demos)

    def finish(self, sft: dict) -> dict:
        """Print the table, draw the curve, have the live agent answer once more; save results.json."""
        import forge_bridge as fb
        from forge_bridge.app.plot import plot_run

        out, policy = self.out, self.policy
        print_table(self.results, self.timings, self.held_out, self.on_validation)
        print()
        if self.config.rl_iterations:  # without a GRPO iteration there is no reward curve to draw
            print(f"reward curve: {plot_run(out)}\nTensorBoard: tensorboard --logdir {out / 'tb'}")
        print(f"adapters: {out / 'adapters'} (live: {policy.current()})")
        last = self.held_out[-1]
        with fb.sampling(temperature=0), fb.episode(last.id, recorder=fb.Recorder(self.store, "final")) as ep:
            answer = final_text(self.agent.invoke({"messages": [{"role": "user", "content": last.question}]}))
        steps = [f"{c.name}({c.arguments})" for s in ep.trajectory for c in s.action.tool_calls]
        print(f"\nthe live agent, on {policy.current()}: {last.question!r}\n  tool calls: "
              f"{' -> '.join(steps) or 'none'}\n  answer: {answer!r} "
              f"({'correct' if check_answer(last, answer) else 'wrong'}; expected {last.answer})")
        summary = {"results": self.results, "validation": self.on_validation, "timings_s": self.timings,
                   "adapter": policy.current(), "sft": sft, "config": asdict(self.config)}
        (out / "results.json").write_text(json.dumps(summary, indent=2))
        policy.close()
        self.store.close()
        return summary
