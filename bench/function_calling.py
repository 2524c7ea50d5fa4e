"""Does RL make an agent better at calling tools it never practised on? SFT vs SFT+RL on the
generated function-calling suite (`forge_bridge.app.tasks.functions`), held-out functions only.

    .venv/bin/python bench/function_calling.py [--seeds 0 1 2] [--iterations 6] [--out runs/bench-fc]
    .venv/bin/python bench/function_calling.py --breakdown runs/bench-fc  # what the calls got wrong, what they wrote
    .venv/bin/python bench/function_calling.py --transfer runs/bench-fc   # practised functions vs unseen ones
    .venv/bin/python bench/function_calling.py --suite-seed 1 ...          # the same on a newly generated suite

Per seed: an ordinary LangChain `create_agent` agent, built per function with that function as
its one tool, on the embedded SmolLM2-135M through `ForgeMiddleware`; `--demos` demonstrations
(the exact call, then a short answer) through the same agent; an SFT warm start on them; greedy
evaluation on the held-out functions (never seen in training: the suite is split by function);
then GRPO on training functions, and the same held-out evaluation again. The evaluation scores
whether an episode's first model call was exactly the right call (one call, the right name,
exactly the requested arguments). The RL reward is that exact check, pass/fail
(`--reward exact`), or partial credit (`--reward partial`: the share of argument names, over
those expected or given, that the call got exactly right; 1 only for the exact call), the
default: it had the larger gain on the validation functions (docs/experiments/function-calling.md). With
`--credit argument` each argument of the call is also rewarded on its own tokens (+1 right, -1
wrong or not asked for; the tokens that close the arguments -1 when one is missing, else +1;
`forge_bridge.policies.call_spans`), as given or, `--span-baseline group`, centred per argument
over the rollouts compared (0 for a rollout that did not write it). With `--credit decision`
each decision that wrote the arguments is rewarded in the state it was made in (a `,` by whether
an asked argument was still unwritten, a key by whether it is asked for and new, an asked value by
whether it is right, the close by whether nothing asked was left; `reward_decisions`).

With `--guide teacher` the scripted expert's rollouts through the same agent join the groups whose
exact-call rate is at or below `--guide-below` (`GRPOConfig(guidance=...)`, docs/teacher.md).

With `--return-direct` the tool is LangChain's `return_direct`: its answer ends the episode, so each
episode (demonstrations included) is the call alone, one model call with no closing reply
(`bench/vs_trl.py` runs so: TRL samples one completion per prompt).

Settings are chosen on the validation functions (`--split validation`); the held-out split is
reported once (`--split held_out`, the default). Not covered: distractor tools (each agent has
only the task's function), multi-call tasks, speed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def build_agent(policy, task, temperature: float, max_tokens: int, return_direct: bool = False):
    """An ordinary LangChain agent whose one tool is the task's function (it answers 'done'); with
    `return_direct` the tool's answer ends the episode (LangChain's `return_direct`), so the agent
    makes one model call, not two (the call, then its closing reply)."""
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI

    from forge_bridge.adapters.langchain import ForgeMiddleware

    fn = task.tool["function"]
    tool = StructuredTool.from_function(func=lambda **kwargs: "done", name=fn["name"],
                                        description=fn["description"], args_schema=fn["parameters"],
                                        return_direct=return_direct)
    model = ChatOpenAI(model="gpt-4o-mini", api_key="unused", base_url="http://127.0.0.1:9/v1")
    return create_agent(model, [tool], middleware=[ForgeMiddleware(
        policy, temperature=temperature, max_tokens=max_tokens, max_model_calls=2)])


def attempt(policy, task, temperature: float, max_tokens: int, reward: str = "exact",
            credit: str = "call", return_direct: bool = False) -> float:
    """One episode (inside the current one), scored on its first call: 1 when it is exactly right,
    else 0 (`reward="exact"`) or the share of its arguments that are right (`"partial"`). With
    `credit="argument"` each argument's tokens also get a span reward, +1 right / -1 wrong or not
    asked for, and the tokens that close the arguments -1 when one is missing, else +1; with
    `credit="decision"` each decision's tokens do (`reward_decisions`)."""
    import forge_bridge as fb
    from forge_bridge.app.tasks.functions import argument_verdicts, check_call, score_call
    from forge_bridge.policies.call_spans import reward_arguments, reward_decisions

    agent = build_agent(policy, task, temperature, max_tokens, return_direct)
    try:
        agent.invoke({"messages": [{"role": "user", "content": task.request}]}, {"recursion_limit": 6})
    except Exception as exc:  # the agent's own error: a failed attempt, recorded as such
        if isinstance(exc, fb.PolicyError):
            raise
        fb.current_episode().mark_end("crashed", f"{type(exc).__name__}: {exc}")
    steps = fb.current_episode().trajectory.transitions
    if not steps:
        return 0.0
    verdicts = argument_verdicts(task, steps[0].action.tool_calls) if credit != "call" else None
    if verdicts is not None and credit == "argument":
        reward_arguments(fb.current_episode(), policy.tokenizer, *verdicts, step=0)
    elif verdicts is not None:
        reward_decisions(fb.current_episode(), policy.tokenizer, task.expected, verdicts[0], step=0)
    if reward == "partial":
        return score_call(task, steps[0].action.tool_calls)
    return 1.0 if check_call(task, steps[0].action.tool_calls) else 0.0


def evaluate(policy, tasks, store, run_id: str, max_tokens: int, concurrency: int,
             return_direct: bool = False) -> float:
    import forge_bridge as fb

    def one(task) -> float:
        with fb.sampling(temperature=0), fb.episode(task.id, recorder=fb.Recorder(store, run_id)) as ep:
            score = attempt(policy, task, 0.0, max_tokens, return_direct=return_direct)
            ep.reward(score)
            return score

    with ThreadPoolExecutor(concurrency) as pool:
        scores = list(pool.map(one, tasks))
    return sum(scores) / len(scores)


def errors(store, run_id: str, tasks) -> dict[str, int]:
    """How many of an evaluation's first calls passed, and what the others got wrong (`call_error`)."""
    from forge_bridge.app.tasks.functions import CALL_ERRORS, call_error

    by_id = {t.id: t for t in tasks}
    counts = dict.fromkeys(CALL_ERRORS, 0)
    for traj in store.trajectories(run_id=run_id):
        first = traj.transitions[0].action.tool_calls if traj.transitions else []
        counts[call_error(by_id[traj.task_id], first)] += 1
    return counts


def choices(store, run_id: str, tasks) -> dict[str, list[int]]:
    """Over an evaluation's first calls that could be scored: how many of the parameters the
    request named were written, and how many of those it did not name (`argument_choices`):
    {"calls": [n], "asked": [written, of], "not_asked": [written, of]}."""
    from forge_bridge.app.tasks.functions import argument_choices

    by_id = {t.id: t for t in tasks}
    out = {"calls": [0], "asked": [0, 0], "not_asked": [0, 0]}
    for traj in store.trajectories(run_id=run_id):
        first = traj.transitions[0].action.tool_calls if traj.transitions else []
        counts = argument_choices(by_id[traj.task_id], first)
        if counts is not None:
            out["calls"][0] += 1
            for key, (written, of) in (("asked", counts[:2]), ("not_asked", counts[2:])):
                out[key][0] += written
                out[key][1] += of
    return out


def print_errors(results: list[dict]) -> None:
    from forge_bridge.app.tasks.functions import CALL_ERRORS

    print("\n| seed, phase | " + " | ".join(CALL_ERRORS) + " |")
    print("| --- |" + " --- |" * len(CALL_ERRORS))
    for r in results:
        for phase in ("SFT", "SFT+RL"):
            print(f"| {r['seed']}, {phase} | " + " | ".join(str(r["errors"][phase][e]) for e in CALL_ERRORS) + " |")
    if not all("choices" in r for r in results):
        return  # a run from before the choices were recorded
    print("\n| seed, phase | calls scored | parameters asked for, written | parameters not asked for, written |")
    print("| --- | --- | --- | --- |")
    for r in results:
        for phase in ("SFT", "SFT+RL"):
            c = r["choices"][phase]
            rates = [f"{w}/{n} = {w / max(n, 1):.2f}" for w, n in (c["asked"], c["not_asked"])]
            print(f"| {r['seed']}, {phase} | {c['calls'][0]} | {rates[0]} | {rates[1]} |")


def breakdown_of(run: Path) -> list[dict]:
    """The error breakdown of an earlier run's evaluations, read back from its stores (its suite
    rebuilt with its own `--functions`)."""
    from forge_bridge.app.tasks.functions import generate_suite
    from forge_bridge.core.store import TrajectoryStore

    recorded = json.loads((run / "fc.json").read_text())
    suite = recorded["args"].get("suite_seed", 0)
    tasks = generate_suite(recorded["args"]["functions"], seed=suite)
    results = []
    for r in recorded["results"]:
        db = run / f"seed{r['seed']}" / "trajectories.db"
        if not db.is_file():
            sys.exit(f"--breakdown {run}: {db} is missing")
        with TrajectoryStore(db) as store:
            results.append({"seed": r["seed"], **{what: {
                "SFT": count(store, "eval-sft", tasks), "SFT+RL": count(store, "eval-rl", tasks)}
                for what, count in (("errors", errors), ("choices", choices))}})
    return results


def splits(functions: int, suite_seed: int) -> tuple[list, list, list]:
    """(train, validation, held-out) of the suite a run used (`--functions`, `--suite-seed`)."""
    from forge_bridge.app.tasks.functions import generate_suite, split_by_function

    return split_by_function(generate_suite(functions, seed=suite_seed), seed=suite_seed)


def demonstrated(train: list, seed: int, n: int) -> list:
    """The `n` training requests a seed demonstrates for SFT (drawn the same way by a run and by
    `--transfer`, which must know which requests the run never saw)."""
    return random.Random(seed).sample(train, n)


def transfer_of(run: Path, n: int) -> list[dict]:
    """Greedy exact rates of an earlier run's SFT adapter (its first) and SFT+RL adapter (its last),
    side by side in one process, on the first `n` requests (at most) of each of: training functions
    GRPO practised on (requests not demonstrated), training functions neither demonstrated nor
    practised, and the split the run reported. Does RL improve the functions it practised, and only those?"""
    import forge_bridge as fb
    from forge_bridge.core.runs import read_run_id
    from forge_bridge.core.store import TrajectoryStore

    recorded = json.loads((run / "fc.json").read_text())
    a = recorded["args"]
    train, validation, held_out = splits(a["functions"], a.get("suite_seed", 0))
    reported = held_out if a["split"] == "held_out" else validation
    fn_of = {t.id: t.function for t in train}
    results = []
    for r in recorded["results"]:
        seed, folder = r["seed"], run / f"seed{r['seed']}"
        db, adapter_dir = folder / "trajectories.db", folder / "run" / "adapters"
        for needed in (db, adapter_dir):
            if not needed.exists():
                sys.exit(f"--transfer {run}: {needed} is missing")
        versions = {int(m[1]): d for d in adapter_dir.iterdir() if (m := re.fullmatch(r"fc-v(\d+)", d.name))}
        if sorted(versions) != list(range(1, len(r["training_reward"]) + 2)):
            sys.exit(f"--transfer {run}: {adapter_dir} holds versions {sorted(versions)}; expected fc-v1 "
                     f"(the SFT warm start) to fc-v{len(r['training_reward']) + 1}")
        shown = {t.id for t in demonstrated(train, seed, a["demos"])}
        with TrajectoryStore(db) as store:
            practised = {t.task_id for t in store.iter(run_id=read_run_id(folder / "run", "fc"))}
        practised_fns = {fn_of[i] for i in practised}
        seen_fns = practised_fns | {fn_of[i] for i in shown}
        groups = {
            "practised": [t for t in train if t.function in practised_fns and t.id not in shown][:n],
            "unseen (train split)": [t for t in train if t.function not in seen_fns][:n],
            a["split"]: reported[:n]}
        groups = {g: ts for g, ts in groups.items() if ts}
        policy = fb.LocalPolicy(a["model"], max_batch=a["concurrency"])
        scores: dict = {"seed": seed, "sizes": {g: len(ts) for g, ts in groups.items()}}
        try:
            with tempfile.TemporaryDirectory() as tmp, TrajectoryStore(Path(tmp) / "transfer.db") as scratch:
                for phase, version in (("SFT", 1), ("SFT+RL", max(versions))):
                    policy.load_adapter(versions[version], f"transfer-{phase.replace('+', '')}")
                    scores[phase] = {g: evaluate(policy, ts, scratch, f"{phase}-{g}", a["max_tokens"], a["concurrency"],
                                                 a.get("return_direct", False)) for g, ts in groups.items()}
        finally:
            policy.close()
        results.append(scores)
    return results


def print_transfer(results: list[dict]) -> None:
    print("\n| seed | group: SFT → SFT+RL (gain, requests) |")
    print("| --- | --- |")
    for r in results:
        print(f"| {r['seed']} | " + "; ".join(
            f"{g}: {100 * r['SFT'][g]:.0f} → {100 * r['SFT+RL'][g]:.0f} % "
            f"({100 * (r['SFT+RL'][g] - r['SFT'][g]):+.0f}, n = {n})" for g, n in r["sizes"].items()) + " |")


def run_seed(seed: int, args) -> dict:
    import torch

    import forge_bridge as fb
    from forge_bridge.app.tasks.functions import expert_call
    from forge_bridge.core.store import TrajectoryStore
    from forge_bridge.policies.scripted import ScriptedPolicy
    from forge_bridge.trainer.sft import SFTConfig, sft as warm_start

    torch.manual_seed(seed)
    out = Path(args.out) / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    store = TrajectoryStore(out / "trajectories.db")
    train, validation, held_out = splits(args.functions, args.suite_seed)
    report = held_out if args.split == "held_out" else validation
    report = report[:args.eval_tasks]
    policy = fb.LocalPolicy(args.model, max_batch=args.concurrency)
    result: dict = {"seed": seed, "split": args.split, "reward": args.reward, "credit": args.credit}
    t0 = time.perf_counter()

    # demonstrations: the exact call, then a short answer, through the same agent
    by_request = {t.request: t for t in train}

    def expert(messages, tools):
        task = by_request[next(m["content"] for m in messages if m["role"] == "user")]
        return "Done." if any(m["role"] == "tool" for m in messages) else expert_call(task)

    demo_tasks = demonstrated(train, seed, args.demos)
    scripted = ScriptedPolicy(expert, policy.tokenizer)
    for task in demo_tasks:
        with fb.episode(task.id, recorder=fb.Recorder(store, "demonstrations")) as ep:
            ep.reward(attempt(scripted, task, 0.0, args.max_tokens, return_direct=args.return_direct))
    demos = sorted(store.trajectories(run_id="demonstrations", status="complete"), key=lambda t: t.task_id)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(
        group_size=args.group_size, lr=args.lr, baseline=args.baseline, span_weight=args.span_weight,
        span_baseline=args.span_baseline, kl_beta=args.kl_beta, skip_uniform_groups=args.kl_beta == 0,
        warmup_steps=2, minibatch_size=args.minibatch_size, epochs=args.epochs, microbatch_size=8,
        concurrency=args.concurrency, max_seq_len=1024, merge_steps=True, run_name="fc",
        out_dir=str(out / "run"), seed=seed, progress=not args.quiet,
        guidance=None if args.guide == "none" else fb.Guidance(
            below=args.guide_below, k=args.guide_k, source="teacher", shaping=args.guide_shaping)),
        recorder=fb.Recorder(store))
    sft = warm_start(trainer, demos, SFTConfig(epochs=args.sft_epochs, lr=args.sft_lr, batch_size=8))
    result["sft_loss"] = [sft["sft_loss_first"], sft["sft_loss_last"]]
    if args.kl_beta > 0:
        trainer.freeze_reference()  # the KL holds RL near the warm start, not the base model
    result["SFT"] = evaluate(policy, report, store, "eval-sft", args.max_tokens, args.concurrency, args.return_direct)
    result["errors"] = {"SFT": errors(store, "eval-sft", report)}
    result["choices"] = {"SFT": choices(store, "eval-sft", report)}
    print(f"seed {seed}: SFT {result['SFT']:.2f} on {len(report)} {args.split} requests", flush=True)

    def rollout(task) -> float:
        return attempt(policy, task, args.temperature, args.max_tokens, args.reward, args.credit, args.return_direct)

    if args.guide != "none":  # the scripted expert through the same agent: guides in groups that fail
        trainer.use_teacher(fb.Teacher(policy=scripted, make_rollout=lambda teacher: lambda task: attempt(
            teacher, task, args.temperature, args.max_tokens, args.reward, args.credit, args.return_direct)))

    def schedule(it: int):
        return random.Random(seed * 100_003 + it).sample(train, args.tasks_per_iteration)

    t_rl = time.perf_counter()
    history = trainer.train(rollout, schedule, iterations=trainer.iteration + args.iterations)
    result["rl_s"] = time.perf_counter() - t_rl
    result["training_reward"] = [h["reward_mean"] for h in history]
    rolled = [t for t in store.trajectories(run_id=trainer.run_id) if t.behaviour != "guide"]  # on-policy only
    result["training_exact"] = [  # a partial score of 1.0 is an exact call
        statistics.mean([float(t.reward == 1.0) for t in rolled if t.metadata.get("iteration") == h["iteration"]] or [0.0])
        for h in history]
    result["SFT+RL"] = evaluate(policy, report, store, "eval-rl", args.max_tokens, args.concurrency, args.return_direct)
    result["errors"]["SFT+RL"] = errors(store, "eval-rl", report)
    result["choices"]["SFT+RL"] = choices(store, "eval-rl", report)
    result["wall_s"] = time.perf_counter() - t0
    print(f"seed {seed}: SFT+RL {result['SFT+RL']:.2f}; training reward per iteration "
          f"{[round(r, 2) for r in result['training_reward']]}, exact {[round(r, 2) for r in result['training_exact']]} "
          f"({result['wall_s']:.0f} s)", flush=True)
    trainer.close()
    policy.close()
    store.close()
    return result


def sd(xs: list[float]) -> float:
    """The sample standard deviation, 0 for a single value (one seed)."""
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def parser() -> argparse.ArgumentParser:
    """The command line (`bench/vs_trl.py` reads its defaults from here too)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--functions", type=int, default=300)
    p.add_argument("--suite-seed", type=int, default=0, help="generate (and split) another suite of functions: "
                   "every measurement in docs/experiments/function-calling.md before the replication used suite 0")
    p.add_argument("--split", choices=("validation", "held_out"), default="held_out")
    p.add_argument("--eval-tasks", type=int, default=60, help="requests of the reported split evaluated "
                   "(with --transfer: the first this many of each group)")
    p.add_argument("--demos", type=int, default=48)
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--tasks-per-iteration", type=int, default=6)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--kl-beta", type=float, default=0.0, help="weight of the KL to the SFT warm start "
                   "(frozen as the reference after SFT; groups with no signal are then kept, as in the demo)")
    p.add_argument("--minibatch-size", type=int, default=128,
                   help="sequences per GRPO optimiser step (128: one step per iteration at the default schedule)")
    p.add_argument("--epochs", type=int, default=1, help="GRPO passes over each iteration's samples")
    p.add_argument("--reward", choices=("exact", "partial"), default="partial",
                   help="RL reward: the exact check (pass/fail) or the share of arguments right")
    p.add_argument("--credit", choices=("call", "argument", "decision"), default="call",
                   help="the call's advantage on all its tokens, or also +1/-1 on each argument's tokens "
                        "(and on the tokens that close the arguments), or on each decision's tokens "
                        "(separator, key, value, close; reward_decisions)")
    p.add_argument("--span-weight", type=float, default=1.0, help="weight of the span rewards in their "
                   "tokens' advantages (with --credit argument or decision)")
    p.add_argument("--span-baseline", choices=("none", "group"), default="none",
                   help="the span rewards as given (+1/-1), or each minus its key's mean "
                        "over the rollouts compared, 0 where one did not write it (the group; with "
                        "--baseline batch, every rollout of the iteration; with --credit argument or decision)")
    p.add_argument("--baseline", choices=("group", "batch"), default="group")
    p.add_argument("--guide", choices=("none", "teacher"), default="none",
                   help="guided groups (GRPOConfig.guidance): the scripted expert's rollouts through the same "
                        "agent join groups whose exact-call rate is at or below --guide-below")
    p.add_argument("--guide-below", type=float, default=0.0)
    p.add_argument("--guide-k", type=int, default=2)
    p.add_argument("--guide-shaping", type=float, default=0.01)
    p.add_argument("--return-direct", action="store_true", help="the tool's answer ends the episode "
                   "(LangChain's return_direct): one model call per episode instead of the call and a closing reply")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", default="runs/bench-fc")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--breakdown", metavar="RUN", help="print what an earlier run's (--out RUN) evaluated "
                   "calls got wrong (on the split that run evaluated), and stop")
    p.add_argument("--transfer", metavar="RUN", help="evaluate an earlier run's SFT and SFT+RL adapters, "
                   "greedily, on functions GRPO practised, on unseen training functions and on its split "
                   "(up to --eval-tasks requests each), and stop")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.eval_tasks < 1:
        p.error(f"--eval-tasks: expected at least 1, got {args.eval_tasks}")
    for flag in ("breakdown", "transfer"):
        if getattr(args, flag) and not (Path(getattr(args, flag)) / "fc.json").is_file():
            p.error(f"--{flag} {getattr(args, flag)}: no fc.json there (an earlier run's --out)")
    if args.breakdown:
        print_errors(breakdown_of(Path(args.breakdown)))
        return 0
    if args.transfer:
        print_transfer(transfer_of(Path(args.transfer), args.eval_tasks))
        return 0
    if Path(args.out).exists() and any(Path(args.out).iterdir()):
        p.error(f"--out {args.out} holds an earlier run: move it away or name another folder")
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, args))
        (Path(args.out) / "fc.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    sft = [r["SFT"] * 100 for r in results]
    rl = [r["SFT+RL"] * 100 for r in results]
    gain = [b - a for a, b in zip(sft, rl)]
    print(f"\n{args.split} functions, exact first call (seeds {args.seeds}):")
    print(f"  SFT      {' / '.join(f'{x:.0f}' for x in sft)} %  (mean {statistics.mean(sft):.0f} ± {sd(sft):.0f})")
    print(f"  SFT+RL   {' / '.join(f'{x:.0f}' for x in rl)} %  (mean {statistics.mean(rl):.0f} ± {sd(rl):.0f})")
    print(f"  gain     {' / '.join(f'{x:+.0f}' for x in gain)} points (mean {statistics.mean(gain):+.0f})")
    print_errors(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
