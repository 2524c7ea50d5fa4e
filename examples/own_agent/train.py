"""Train your own agent (agent.py) start to finish: demonstrations -> warm start -> signal probe
-> GRPO -> held-out check -> serve back. Copy the folder, replace agent.py, keep this file.

    .venv/bin/python examples/own_agent/train.py                # the embedded model, ~17 minutes on 2 cores
    .venv/bin/python examples/own_agent/train.py --seed 1 --out runs/own_agent-1

Everything lands in the run folder: the trajectories (trajectories.db, `forge-bridge inspect`),
the adapters (adapters/own-sft, own-v1, ...), metrics.jsonl and TensorBoard logs, and
results.json with the held-out success per kind before and after each stage.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import forge_bridge as fb
from agent import make_rollout, splits  # your agent: this script's own folder is on sys.path


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="embedded name or a model directory")
    p.add_argument("--seed", type=int, default=0, help="the task split, sampling and training")
    p.add_argument("--iterations", type=int, default=4, help="GRPO iterations")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per task in GRPO (the probe takes 4)")
    p.add_argument("--tasks-per-iteration", type=int, default=5, help="tasks in each GRPO iteration")
    p.add_argument("--out", default="runs/own_agent", help="the run folder (a new one per run)")
    args = p.parse_args(argv)

    demo_tasks, tasks, held_out = splits(args.seed)
    policy = fb.LocalPolicy(args.model)
    rollout = make_rollout(policy)  # the one agent object: it serves every new adapter as it lands
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(  # the recommended settings are the defaults
        group_size=args.group_size, tasks_per_iteration=args.tasks_per_iteration, max_seq_len=768, concurrency=16,
        run_name="own", out_dir=args.out, seed=args.seed))
    try:
        # 1. Demonstrations: each demo task's plan replayed through your agent, kept if your checker passes it.
        demos = fb.record_demonstrations(make_rollout, demo_tasks, trainer.tokenizer, trainer.recorder)
        # 2. The warm start (version own-sft), checked greedily on the held-out tasks before and after.
        warm = fb.sft(trainer, demos, fb.SFTConfig(), rollout=rollout, held_out=held_out)
        trainer.freeze_reference()  # GRPO's KL holds the policy near the warm start, not the base model
        # 3. The probe: does each kind of task give GRPO a success to compare? (docs/own-agent.md)
        report = trainer.probe(rollout, tasks, group_size=4)
        print(f"signal probe, {report.group_size} rollouts of each training task:\n{report}")
        # 4. GRPO: each iteration's adapter (own-v1, own-v2, ...) is served to the same agent object.
        trainer.train(rollout, tasks, iterations=args.iterations)
        # 5. The same held-out check on the last version.
        final = trainer.probe(rollout, held_out, name="check-rl", greedy=True)
    finally:
        trainer.close()
        policy.close()
    results = {"seed": args.seed, "held_out": len(held_out), "demonstrations": len(demos),
               "base": warm["held_out_base"], "sft": warm["held_out_sft"],
               "rl": {kind: k.success_rate for kind, k in final.kinds.items()},
               "probe": {kind: [k.successes, k.rollouts] for kind, k in report.kinds.items()},
               "version": policy.current()}
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=2))
    print("\nheld-out success, greedy:", *(f"  {kind:<8} base {results['base'][kind]:.0%} -> SFT "
                                          f"{results['sft'][kind]:.0%} -> SFT+RL {v:.0%}"
                                          for kind, v in results["rl"].items()), sep="\n")
    # 6. Serve it back: the same model plus the last adapter, behind vLLM's OpenAI API.
    print(f"\nserve it: forge-bridge serve {args.model} --adapter {args.out}/adapters/{results['version']} "
          "--adapter-name own\n  then point your agent's ChatOpenAI(base_url=..., model='own') at it")
    return results


if __name__ == "__main__":
    main()
