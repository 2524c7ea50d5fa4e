"""Can pass/fail RL find the two-step kind on its own? How often a warm start taught only the
single-tool kinds solves `lookup_multiply` when sampled.

GRPO learns from differences between rollouts: a kind that no rollout solves gives it nothing
to compare. The demo issue asks for the multi-step kinds to be learned from the reward alone,
with demonstrations of the single-tool kinds only. This measures the premise: SFT on the
scripted expert's `multiply` and `lookup` demonstrations (the demo's agent, model and
settings), then the demo's LangChain agent sampled on every training `lookup_multiply` task at
several temperatures, with each rollout's seed fixed. It prints the success rate and what the
rollouts did (the sequence of tool calls), and the greedy success of the single-tool kinds on
the validation tasks (what the warm start did learn).

    .venv/bin/python bench/exploration.py [--sft-epochs 1 2] [--seed 0] [--samples 4] [--bridge KIND ...]
        [--system-prompt P] [--calls-only KIND ...] [--explore E]
    .venv/bin/python bench/exploration.py --forced [--sft-epochs 1 2 3]

`--forced` asks instead whether a turn-level exploration scheme could find the second call. On
every training `lookup_multiply` task, at T = 0.7 (`--temperatures` is not used), it prints
the warm start's probability of the scripted expert's first call (the lookup), and, at the
state after that lookup, of the right `multiply` call (the population and k, in either order)
and of the call's first token. Then it samples `--samples` continuations per task with the
opening of a tool call forced (`<tool_call>` up to the tool's name, which is left to the model;
no top-k, as the policy samples), and counts the tools named and the `multiply` calls whose
product is the task's answer.

`--bridge KIND ...` adds 24 demonstrations of each named two-call kind of `BRIDGE_KINDS`, never
of `lookup_multiply` itself: `multiply_chain` (a multiply on the previous multiply's result) and
`lookup_max` (two lookups) use one tool each; `lookup_and_multiply` (a lookup, then a multiply
whose arguments come from the question) uses both. docs/experiments/demo.md has the results.

`--explore E` makes the sampled rollouts force a tool call's opening after a tool's result with
probability E (`fb.sampling(explore=E)`). `--system-prompt P` gives the agent instructions (the
demonstrations, recorded through it, carry them too). `--calls-only KIND ...` trains the SFT on
those kinds' tool calls only, leaving out their answers after a tool's result. Each sampled row
also counts the rollouts that call `multiply` right after their first lookup, and those whose
multiply has the looked-up population as an argument.

What it does not cover: other models (a larger one may compose the two calls on its own), tool
descriptions or prompts other than the one given, and any exploration bonus. It measures what
exploration finds; it does not train on it (`forge-bridge demo` and `bench/credit.py` do not
explore).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    from forge_bridge.app.tasks import BRIDGE_KINDS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sft-epochs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0, 1.3])
    ap.add_argument("--samples", type=int, default=4, help="rollouts per task and temperature")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bridge", nargs="+", default=[], choices=BRIDGE_KINDS,
                    help="also demonstrate these two-call kinds (BRIDGE_KINDS), never lookup_multiply itself")
    ap.add_argument("--forced", action="store_true",
                    help="measure the second call after a correct lookup, with a tool call's opening forced")
    ap.add_argument("--system-prompt", default=None,
                    help="give the agent (and so the demonstrations, recorded through it) these instructions")
    ap.add_argument("--calls-only", nargs="+", default=[], metavar="KIND", choices=("multiply", "lookup", *BRIDGE_KINDS),
                    help="SFT on these kinds' demonstrated tool calls only, not on their answers after a tool's result")
    ap.add_argument("--explore", type=float, default=0.0,
                    help="sampled rollouts force a tool call's opening after a tool's result with this probability")
    ap.add_argument("--out", default="runs/bench-exploration")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="a named model (forge-bridge fetch --list) or a model directory")
    args = ap.parse_args()
    args.bridge = list(dict.fromkeys(args.bridge))  # each kind once
    if undemonstrated := set(args.calls_only) - {"multiply", "lookup", *args.bridge}:
        ap.error(f"--calls-only {sorted(undemonstrated)}: not demonstrated (add them to --bridge)")

    import torch

    import forge_bridge as fb
    from forge_bridge.app.demo import DemoConfig, attempt, build_agent, demonstration_tasks
    from forge_bridge.app.tasks import expert_reply, make_splits
    from forge_bridge.core.episode import derive_seed
    from forge_bridge.core.store import TrajectoryStore
    from forge_bridge.policies.scripted import ScriptedPolicy
    from forge_bridge.trainer.sft import SFTConfig, sft as warm_start

    train, validation = make_splits(24, 10, args.seed)
    single = demonstration_tasks(DemoConfig(seed=args.seed, demonstrate=("multiply", "lookup", *args.bridge)), train)
    two_step = [t for t in train if t.kind == "lookup_multiply"]
    for epochs in args.sft_epochs:
        torch.manual_seed(args.seed)
        out = Path(args.out) / f"sft{epochs}-seed{args.seed}{''.join('-' + k for k in args.bridge)}"
        shutil.rmtree(out, ignore_errors=True)
        store = TrajectoryStore(out / "trajectories.db")
        policy = fb.LocalPolicy(args.model, max_batch=20)
        agent = build_agent(policy, 0.7, 48, system_prompt=args.system_prompt)

        def run(agent, task, recorder, temperature, seed=None):
            with fb.sampling(temperature=temperature, explore=args.explore if temperature else 0.0), \
                    fb.episode(task.id, recorder=recorder, metadata={"kind": task.kind}, seed=seed) as ep:
                try:
                    passed = attempt(agent, task, 4)
                except fb.PolicyError:
                    raise
                except Exception as exc:
                    ep.mark_end("crashed", str(exc))
                    passed = False
                ep.reward(float(passed))
                return passed

        expert = build_agent(ScriptedPolicy(expert_reply, policy.tokenizer), 0.0, 48, system_prompt=args.system_prompt)
        demos = fb.Recorder(store, "demonstrations")
        with ThreadPoolExecutor(20) as pool:
            list(pool.map(lambda t: run(expert, t, demos, 0.0), single))
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(run_name="explore", out_dir=str(out), seed=args.seed,
                                                       progress=False, max_seq_len=768, merge_steps=True,
                                                       microbatch_size=8, lr=1e-4, minibatch_size=8, warmup_steps=0,
                                                       kl_beta=0.0), recorder=fb.Recorder(store))
        recorded = sorted(store.trajectories(run_id="demonstrations", status="complete"), key=lambda t: t.task_id)
        recorded = [dataclasses.replace(t, transitions=[s for s in t.transitions if s.action.tool_calls])
                    if t.task_id.rsplit("-", 1)[0] in args.calls_only else t for t in recorded]
        sft = warm_start(trainer, recorded, SFTConfig(epochs=epochs, lr=1e-3, batch_size=8))
        print(f"\nSFT {epochs} epoch(s) on {len(recorded)} demonstrations of {sorted({t.task_id.rsplit('-', 1)[0] for t in recorded})}: loss "
              f"{sft['sft_loss_first']:.3f} -> {sft['sft_loss_last']:.3f}")
        if args.forced:
            with ThreadPoolExecutor(20) as pool:
                list(pool.map(lambda t: run(expert, t, fb.Recorder(store, "expert"), 0.0), two_step))
            forced_second_call(trainer, list(store.iter(run_id="expert")), two_step, args)
            trainer.close()
            policy.close()
            store.close()
            continue
        recorder = fb.Recorder(store, "single")
        with ThreadPoolExecutor(20) as pool:
            ok = list(pool.map(lambda t: run(agent, t, recorder, 0.0), [t for t in validation if t.kind != "lookup_multiply"]))
        print(f"  single-tool kinds, validation, greedy: {sum(ok)}/{len(ok)}")
        for temperature in [0.0] + args.temperatures:
            run_id = f"T{temperature}"
            recorder = fb.Recorder(store, run_id)
            jobs = [(t, k) for t in two_step for k in range(1 if temperature == 0 else args.samples)]
            with ThreadPoolExecutor(20) as pool:
                ok = list(pool.map(lambda job: run(agent, job[0], recorder, temperature,
                                                   derive_seed(args.seed, job[0].id, job[1], temperature)), jobs))
            patterns = collections.Counter(
                " -> ".join([c.name for s in t.transitions for c in s.action.tool_calls] + ["answer"])
                for t in store.iter(run_id=run_id))
            then, used = lookup_then_multiply(store.iter(run_id=run_id))
            print(f"  lookup_multiply, training tasks, T={temperature}: {sum(ok)}/{len(ok)} solved; "
                  + "; ".join(f"{n}x {p}" for p, n in patterns.most_common(4))
                  + f"; a lookup then a multiply in {then} (the looked-up population an argument in {used})")
        trainer.close()
        policy.close()
        store.close()


def lookup_then_multiply(trajectories) -> tuple[int, int]:
    """(rollouts in which a lookup is followed at once by a multiply, those of them whose first such
    multiply has the looked-up city's population as an argument)."""
    import json

    from forge_bridge.app.tasks import CITIES

    then = used = 0
    for traj in trajectories:
        calls = [c for step in traj.transitions for c in step.action.tool_calls]
        i = next((i for i, c in enumerate(calls[:-1]) if c.name == "lookup" and calls[i + 1].name == "multiply"), None)
        if i is None:
            continue
        then += 1
        try:
            population = CITIES.get(str(json.loads(calls[i].arguments).get("city", "")).strip())
            used += population is not None and str(population) in map(str, json.loads(calls[i + 1].arguments).values())
        except (ValueError, AttributeError):  # arguments that are not a JSON object
            pass
    return then, used


def forced_second_call(trainer, expert_runs, two_step, args, temperature: float = 0.7) -> None:
    """The `--forced` measurement (the module docstring), at `temperature` (not `--temperatures`).
    "The right call" is `multiply` with the population and k in either order."""
    import json
    import math
    import re

    import torch

    from forge_bridge.core.episode import derive_seed

    model, tok = trainer.model.eval(), trainer.tokenizer
    answers = {t.id: t.answer for t in two_step}

    def logprobs(prompt: list[int], call: list[int]) -> torch.Tensor:  # [len(call)]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + call])).logits[0, len(prompt) - 1:-1].float() / temperature
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(call)[:, None])[:, 0]

    def swapped(call: list[int]) -> list[int]:  # the same call with `a` and `b` exchanged
        text = tok.decode(call[:-1])
        if tok.encode(text, add_special_tokens=False) + call[-1:] != call:
            raise SystemExit("--forced: the expert's call does not re-encode to its own tokens")
        given = re.search(r'"arguments": (\{.*?\})', text)[1]
        a = json.loads(given)
        exchanged = text.replace(given, json.dumps({"a": a["b"], "b": a["a"]}))
        return tok.encode(exchanged, add_special_tokens=False) + call[-1:]

    lookup, whole, first, named, right = [], [], [], collections.Counter(), 0
    for traj in sorted(expert_runs, key=lambda t: t.task_id):
        looked, step = traj.transitions[0], traj.transitions[1]  # the lookup; the multiply after its result
        lookup.append(math.exp(logprobs(looked.prompt_token_ids, looked.completion_token_ids).sum()))
        prompt, call = step.prompt_token_ids, step.completion_token_ids
        lp = logprobs(prompt, call)
        whole.append(math.exp(lp.sum()) + math.exp(logprobs(prompt, swapped(call)).sum()))
        first.append(math.exp(lp[0]))
        opening = next(n for n in range(1, len(call)) if tok.decode(call[:n]).endswith('"name": "'))
        ids = torch.tensor([prompt + call[:opening]])
        for k in range(args.samples):
            torch.manual_seed(derive_seed(args.seed, traj.task_id, k, "forced"))
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=40,
                                 pad_token_id=tok.eos_token_id)
            text = tok.decode(call[:opening] + out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
            name = re.search(r'"name": "(\w+)"', text)
            named[name[1] if name else "(unreadable)"] += 1
            try:
                a = json.loads(re.search(r'"arguments": (\{.*?\})', text)[1])
                right += name[1] == "multiply" and int(a["a"]) * int(a["b"]) == answers[traj.task_id]
            except (TypeError, ValueError, KeyError, OverflowError):  # no name or arguments, or not numbers
                pass
    n = len(whole)
    print(f"  first call, T={temperature}: P(the right lookup) mean {sum(lookup) / n:.2g}")
    print(f"  after a correct lookup, T={temperature}: P(the right multiply call, either order) mean "
          f"{sum(whole) / n:.2g} (max {max(whole):.2g}); P(its first token) mean {sum(first) / n:.2g}")
    print(f"  the call's opening forced, {n * args.samples} samples: tools named {dict(named.most_common())}; "
          f"multiply with the task's product {right}/{n * args.samples}")


if __name__ == "__main__":
    main()
