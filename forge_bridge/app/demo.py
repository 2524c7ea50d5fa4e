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
   adapter, scoring the validation tasks every `validate_every` iterations and ending on the
   best version there (never below the warm start); evaluate (SFT+RL);
5. print the table, write the reward curve and TensorBoard logs, and let the live agent answer
   one more question with the trained adapter.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from forge_bridge.app.demo_config import DemoConfig
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
    model = ChatOpenAI(model="gpt-4o-mini", api_key="unused",  # type: ignore[arg-type]  # pydantic makes it a SecretStr
                       base_url="http://127.0.0.1:9/v1")
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
        episode = fb.current_episode()
        assert episode is not None  # every attempt runs inside an episode (run_tasks opens it)
        episode.truncate(f"more than {max_model_calls} model calls")
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
    if config.sft_epochs:
        demo.evaluate("SFT", "eval-sft", "evaluating after SFT (same agent object, now on the SFT adapter)")
    if config.rl_iterations:
        demo.reinforce(trainer)
        label = "SFT+RL" if config.sft_epochs else "RL"
        demo.evaluate(label, "eval-rl", f"evaluating after {label}")
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
        self.teacher_policy: Any = None  # the teacher adapter's, with distill_beta
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
        self.demos = demos = self.demonstrate(shown, "demonstrations")
        # every call of an iteration in one optimizer step, as measured (OptimizerConfig.minibatch_size)
        every_call = sum(config.rl_tasks_per_kind) * (config.group_size + config.guide_k) * config.max_model_calls
        trainer = fb.GRPOTrainer(self.policy, fb.GRPOConfig(  # the defaults otherwise: the demo measured them
            rollout=fb.RolloutConfig(group_size=config.group_size, concurrency=config.concurrency),
            optimizer=fb.OptimizerConfig(minibatch_size=every_call),
            run=fb.RunConfig(name="demo", out_dir=str(self.out), seed=config.seed, progress=self.progress),
            baseline=config.baseline, max_seq_len=768, merge_steps=True, relabel_weight=config.relabel_weight,
            distill_beta=config.distill_beta,
            guidance=None if config.guide == "none" else fb.Guidance(k=config.guide_k, source=config.guide,
                                                                     shaping=config.guide_shaping)),
            recorder=fb.Recorder(store))  # episodes: the run id
        if not config.sft_epochs:  # GRPO from the base model; its KL reference is the base
            self.timings["demos"] = time.perf_counter() - t
            return trainer, {"sft_demonstrations": 0}
        # the calls of 8 demonstrations a step, as measured when batches counted merged episodes
        batch = max(1, round(8 * sum(len(d) for d in demos) / max(len(demos), 1)))
        warm = sft(trainer, demos, SFTConfig(epochs=config.sft_epochs, lr=config.sft_lr, batch_size=batch))
        print(f"  SFT on {warm['sft_demonstrations']} episodes: loss {warm['sft_loss_first']:.3f} -> "
              f"{warm['sft_loss_last']:.3f}; published {warm['version']} to the live agent")
        if trainer.config.loss.kl_beta > 0:
            trainer.freeze_reference()  # GRPO's KL is to this warm start, not to the base model
        self.timings["demos + SFT"] = time.perf_counter() - t
        return trainer, warm

    def demonstrate(self, tasks: list[Task], run_id: str) -> list[Any]:
        """The scripted expert's episodes of `tasks` through the same middleware, stored under
        `run_id`; returned in task order, not the order concurrent agents finished in (the same
        seed, the same SFT)."""
        import forge_bridge as fb

        config = self.config
        expert_agent = build_agent(fb.ScriptedPolicy(expert_reply, self.policy.tokenizer), 0.0, config.max_tokens)
        run_tasks(expert_agent, tasks, fb.Recorder(self.store, run_id), greedy=True, concurrency=config.concurrency,
                  desc=run_id, progress=self.progress, max_model_calls=config.max_model_calls)
        return sorted(self.store.trajectories(run_id=run_id, status="complete"), key=lambda t: t.task_id)

    def reinforce(self, trainer: Any) -> None:
        """GRPO on the training tasks, the same number of each kind every iteration."""
        config = self.config
        if trainer.config.teacher_settings():
            trainer.use_teacher(self.teacher())
        t = self.phase(f"GRPO: {config.rl_iterations} iterations x {sum(config.rl_tasks_per_kind)} tasks x "
                       f"{config.group_size} rollouts at T={config.temperature}, per-step gamma={trainer.config.gamma}")

        def rollout(task: Task) -> float:
            return 1.0 if attempt(self.agent, task, config.max_model_calls) else 0.0

        by_kind = {kind: [t for t in self.train if t.kind == kind] for kind in KINDS_ORDER}

        def schedule(it: int) -> list[Task]:  # the same number of tasks of each kind, drawn anew
            rng = random.Random(config.seed * 100_003 + it)
            return [t for kind, n in zip(KINDS_ORDER, config.rl_tasks_per_kind)
                    for t in rng.sample(by_kind[kind], n)]

        # the validation split picks the version served at the end; the held-out split stays unseen
        trainer.train(rollout, schedule, iterations=trainer.iteration + config.rl_iterations,
                      validation=self.validation if config.validate_every else None,
                      eval_every=max(config.validate_every, 1))
        self.timings["GRPO"] = time.perf_counter() - t

    def teacher(self) -> Any:
        """The scripted expert as a teacher (guides, relabelling) -- with `distill_beta`, the
        teacher adapter instead (it scores tokens; it also acts) -- and the recorded demonstrations."""
        import forge_bridge as fb

        config = self.config

        def make_rollout(policy: Any) -> Any:
            agent = build_agent(policy, config.temperature, config.max_tokens)
            return lambda task: 1.0 if attempt(agent, task, config.max_model_calls) else 0.0
        acting = self.teacher_adapter() if config.distill_beta > 0 else fb.ScriptedPolicy(expert_reply, self.policy.tokenizer)
        return fb.Teacher(policy=acting, make_rollout=make_rollout, demonstrations=self.demos)

    def teacher_adapter(self) -> Any:
        """A policy of its own on the same base, its LoRA trained by SFT on the student's
        demonstrations and one of every other training task of the multi-step kinds: the
        distillation teacher, standing in for a bigger model that does the job."""
        import forge_bridge as fb
        from forge_bridge.trainer.sft import SFTConfig, sft

        config = self.config
        t = self.phase("the teacher adapter: SFT on a demonstration of every training task")
        shown = demonstration_tasks(config, self.train)
        extra = [task for task in demonstration_tasks(replace(config, multi_step_demos=None), self.train)
                 if task not in shown]
        demos = self.demos + self.demonstrate(extra, "teacher-demonstrations")
        self.teacher_policy = policy = fb.LocalPolicy(config.model, max_batch=config.concurrency)
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(
            run=fb.RunConfig(name="teacher", out_dir=str(self.out / "teacher"), seed=config.seed,
                             progress=self.progress), max_seq_len=768, merge_steps=False))  # as measured: docs/teacher.md
        warm = sft(trainer, demos, SFTConfig(epochs=config.sft_epochs, lr=config.sft_lr, batch_size=8))
        trainer.close()
        print(f"  teacher SFT on {warm['sft_demonstrations']} episodes ({warm['sft_samples']} model calls): "
              f"loss {warm['sft_loss_first']:.3f} -> {warm['sft_loss_last']:.3f}; "
              f"{policy.current()} scores the student's tokens")
        self.timings["teacher SFT"] = time.perf_counter() - t
        return policy

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
                   "version": policy.current(), "sft": sft, "config": asdict(self.config)}
        (out / "results.json").write_text(json.dumps(summary, indent=2))
        policy.close()
        if self.teacher_policy is not None:
            self.teacher_policy.close()
        self.store.close()
        return summary
