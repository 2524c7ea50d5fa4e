"""How often anchor-state credit differs from trajectory credit, on the rollouts a
`bench/credit.py` run actually trained on.

    .venv/bin/python bench/credit_structure.py runs/bench-credit [--arm anchor]

For every seed folder of the run, it reads the arm's GRPO groups back from the trajectory store
and computes, on the same groups, the advantages both GRPO arms give each step
(`grpo_advantages` with the bench's settings: credit="anchor", gamma=0.95, and
credit="trajectory", gamma=1). Reported per seed: the steps that have a sibling (another step
taken from the same state), the steps whose step-level term is non-zero (their state's members
acted differently and got different returns), the steps both arms push (a non-zero advantage
from each; a uniform group gives neither a push), and of those the ones pushed in opposite
directions, and the steps that only one of them pushes at all.

What it does not cover: the two arms' rollouts differ after their first update, so this scores
both credits on one arm's rollouts; it says what the anchor term changes, not what it would
have sampled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def structure(store_path: Path, arm: str) -> dict:
    import forge_bridge as fb
    from forge_bridge.core.store import TrajectoryStore
    from forge_bridge.trainer.advantages import anchor_step_advantages, discounted_returns, step_rewards
    from forge_bridge.trainer.grpo import action_key, grpo_advantages, state_key

    with TrajectoryStore(store_path) as store:
        run_ids = sorted({t.run_id for t in store.iter() if t.run_id and t.run_id.startswith(f"{arm}-")})
        if len(run_ids) != 1:
            raise SystemExit(f"{store_path}: expected one {arm!r} run, found {run_ids}")
        groups = store.groups(run_id=run_ids[0])
    anchor = grpo_advantages(groups, fb.GRPOConfig(credit="anchor", gamma=0.95))
    trajectory = grpo_advantages(groups, fb.GRPOConfig(credit="trajectory", gamma=1.0))
    steps = both = opposite = only_one = 0
    for advs_a, advs_t in zip(anchor, trajectory):
        for a, t in zip(advs_a, advs_t):
            for x, y in zip(a.tolist(), t.tolist()):
                steps += 1
                pushed_a, pushed_t = abs(x) > 1e-6, abs(y) > 1e-6
                both += pushed_a and pushed_t
                opposite += pushed_a and pushed_t and x * y < 0
                only_one += pushed_a != pushed_t
    sibling = nonzero = 0
    for group in groups:
        trajs = group.trajectories
        rewards = [step_rewards([s.reward for s in t.transitions], t.reward) for t in trajs]
        step, has = anchor_step_advantages([discounted_returns(r, 0.95) for r in rewards],
                                           [[state_key(t, k) for k in range(len(t.transitions))] for t in trajs],
                                           [[action_key(s) for s in t.transitions] for t in trajs])
        sibling += sum(int(h.sum()) for h in has)
        nonzero += sum(int((s.abs() > 1e-6).sum()) for s in step)
    return {"groups": len(groups), "steps": steps, "with_sibling": sibling, "step_term_nonzero": nonzero,
            "pushed_by_both": both, "opposite_sign": opposite, "pushed_by_one_arm_only": only_one}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a bench/credit.py --out folder")
    p.add_argument("--arm", default="anchor", choices=("anchor", "trajectory"),
                   help="whose rollouts to score (default: anchor)")
    args = p.parse_args(argv)
    stores = sorted(Path(args.run).glob("seed*/trajectories.db"))
    if not stores:
        p.error(f"{args.run}: no seed*/trajectories.db (an earlier bench/credit.py --out folder)")
    rows = {}
    print("| seed | groups | steps | with a sibling | step term non-zero | pushed by both arms | of those, opposite "
          "sign | pushed by one arm only |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for store in stores:
        r = structure(store, args.arm)
        rows[store.parent.name] = r
        pct = lambda k: f"{r[k]} ({r[k] / max(r['steps'], 1):.0%})"  # noqa: E731
        print(f"| {store.parent.name.removeprefix('seed')} | {r['groups']} | {r['steps']} | {pct('with_sibling')} | "
              f"{pct('step_term_nonzero')} | {pct('pushed_by_both')} | "
              f"{r['opposite_sign']} ({r['opposite_sign'] / max(r['pushed_by_both'], 1):.0%}) | "
              f"{pct('pushed_by_one_arm_only')} |")
    (Path(args.run) / f"credit_structure_{args.arm}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
