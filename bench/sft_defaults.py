"""The warm start's defaults (`SFTConfig.lr`, `.epochs`), measured on the own-agent template
(examples/own_agent) with the default model.

For each learning rate a fresh LoRA is fitted to the template's 12 demonstrations (30 model
calls; batch 8 calls, merged or not: it was measured with each call a sample of its own) for up to `--epochs`
passes; after each pass the adapter is published to the live agent and the template's training
tasks (20, which SFT never sees: the validation split of this sweep) are run once each, greedily. The held-out tasks are not touched. The rule, fixed before the run: the
default is the (lr, epochs) with the highest validation success; a tie goes to fewer epochs,
then to the lower rate. One seed (the template's split 0): a sweep, not a confidence interval.

    .venv/bin/python bench/sft_defaults.py --out runs/sft-defaults

What it does not cover: other models (a 1B model wants a lower rate), other batch sizes, more
demonstrations than the template's dozen.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "own_agent"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3, 3e-3])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/sft-defaults")
    args = p.parse_args()

    import forge_bridge as fb
    from agent import make_rollout, splits

    out = Path(args.out)
    demo_tasks, validation, _ = splits(args.seed)
    policy = fb.LocalPolicy(args.model)
    rollout = make_rollout(policy)
    recorder = fb.Recorder(fb.TrajectoryStore(out / "trajectories.db"))
    table: dict[str, dict[int, dict[str, float]]] = {}
    demos = None
    for i, lr in enumerate(args.lrs):
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(run_name=f"lr{i}", out_dir=str(out / f"lr{i}"), seed=args.seed,
                                                       concurrency=16, max_seq_len=768), recorder=recorder)
        if demos is None:
            demos = fb.record_demonstrations(make_rollout, demo_tasks, trainer.tokenizer, recorder)
            base = trainer.probe(rollout, validation, name="base", greedy=True)
            table["base"] = {0: {k: v.success_rate for k, v in base.kinds.items()} | {"all": base.success_rate}}
        row = table[f"{lr:g}"] = {}

        def check(epoch: int, trainer=trainer, row=row) -> None:
            trainer.publish(epoch)  # '<run>-v<epoch>': the live agent serves it
            report = trainer.probe(rollout, validation, name=f"e{epoch}", greedy=True)
            row[epoch] = {k: v.success_rate for k, v in report.kinds.items()} | {"all": report.success_rate}
            print(f"lr {lr:g}, epoch {epoch}: validation {report.success_rate:.0%}", flush=True)

        t = time.perf_counter()
        fb.sft(trainer, demos, fb.SFTConfig(lr=lr, epochs=args.epochs, batch_size=8, publish=False), on_epoch=check)
        row["time_s"] = time.perf_counter() - t
        trainer.close()
    policy.close()
    scored = [(row[e]["all"], -e, -float(lr), lr, e) for lr, row in table.items() if lr != "base"
              for e in range(1, args.epochs + 1)]
    best = max(scored)
    (out / "sft_defaults.json").write_text(json.dumps({"table": table, "chosen": {"lr": best[3], "epochs": best[4]},
                                                       "validation_tasks": len(validation)}, indent=2))
    kinds = sorted(k for k in table["base"][0] if k != "all")
    print(f"\nvalidation success, greedy ({len(validation)} tasks); base model: {table['base'][0]['all']:.0%}")
    print("| lr | " + " | ".join(f"epoch {e}" for e in range(1, args.epochs + 1)) + " |")
    print("| --- |" + " --- |" * args.epochs)
    for lr, row in table.items():
        if lr != "base":
            cells = [f"{row[e]['all']:.0%} ({', '.join(f'{row[e][k]:.0%}' for k in kinds)})" for e in
                     range(1, args.epochs + 1)]
            print(f"| {lr} | " + " | ".join(cells) + " |")
    print(f"(per kind: {', '.join(kinds)})\nchosen by the rule: lr {best[3]}, {best[4]} epochs")


if __name__ == "__main__":
    main()
