"""Guidance on the demo's two-step kind with few demonstrations of it: SFT alone, SFT + GRPO, SFT +
guided GRPO (the scripted expert's rollouts as guides), SFT + GRPO with relabelling, SFT + on-policy
distillation from a teacher adapter (the same base, its LoRA trained on a demonstration of every
training task, standing in for a bigger model).

Each cell is one `forge-bridge demo` run (the same agent, tasks, splits, warm start on the
single-tool kinds as today and `--demos` of the two-step kind, 8 GRPO iterations of 5 tasks x 8
rollouts, the same number of on-policy rollouts in every method: guides are added, never
swapped in), reporting greedy success on the held-out split, per kind, and on the validation
split. SFT alone is every run's own SFT column. The rule to pick a method, fixed before the runs:
the highest validation success of the two-step kind, ties to the higher overall validation
success; the held-out split is reported once, for every method, with the seed-to-seed spread.

    .venv/bin/python bench/guidance.py --seeds 0 1 2 --demos 4 --methods grpo guided relabel --out runs/guidance

Distillation's beta (0.1 or 1) is picked on seed 0's validation split by the same rule.

What it does not cover: a teacher that is a real bigger model (the scripted expert is right on
every task, as a model that does the job would be; the teacher adapter is the same 135M model,
taught more), other task suites. On 2 cores each cell takes 15 to 25 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

UNGUIDED = {"guide": "none", "guide_k": 1, "guide_shaping": 0.1, "relabel_weight": 0.0, "distill_beta": 0.0}
METHODS = {"grpo": UNGUIDED, "guided": {**UNGUIDED, "guide": "teacher"},
           "guided-sharp": {**UNGUIDED, "guide": "teacher", "guide_k": 2, "guide_shaping": 0.01},
           "relabel": {**UNGUIDED, "relabel_weight": 1.0},
           "guided+relabel": {**UNGUIDED, "guide": "teacher", "relabel_weight": 1.0},
           "distill-0.1": {**UNGUIDED, "distill_beta": 0.1}, "distill-1": {**UNGUIDED, "distill_beta": 1.0},
           "guided-sharp+distill-1": {**UNGUIDED, "guide": "teacher", "guide_k": 2, "guide_shaping": 0.01,
                                      "distill_beta": 1.0}}
"""Method -> its DemoConfig settings (all five given, whatever the demo's defaults; `make demo` is
guided-sharp+distill-1). distill-*: on-policy distillation from the teacher adapter (`DemoConfig.distill_beta`),
which then also acts as the guides' teacher."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--demos", type=int, nargs="+", default=[4], help="demonstrations of the two-step kind")
    p.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=["grpo", "guided"])
    p.add_argument("--out", default="runs/guidance")
    p.add_argument("--add", nargs="*", default=[], metavar="DEMOS/METHOD/SEED=DIR",
                   help="take a cell from a `forge-bridge demo` run folder already made with those settings")
    args = p.parse_args()

    from forge_bridge.app.demo import DemoConfig, run

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells_path = out / "cells.json"
    cells = json.loads(cells_path.read_text()) if cells_path.is_file() else {}
    for item in args.add:
        key, _, folder = item.partition("=")
        summary = json.loads((Path(folder) / "results.json").read_text())
        cells[key] = {"held_out": summary["results"], "validation": summary["validation"],
                      "minutes": sum(summary["timings_s"].values()) / 60}
    if args.add:  # kept with the cells run here, so the table shows them from now on
        cells_path.write_text(json.dumps(cells, indent=1))
    for n in args.demos:
        for method in args.methods:
            for seed in args.seeds if not args.add else []:
                key = f"{n}/{method}/{seed}"
                if key in cells:  # a rerun continues where it stopped
                    continue
                t = time.perf_counter()
                config = replace(DemoConfig(), seed=seed, multi_step_demos=n, out_dir=str(out / key.replace("/", "-")),
                                 **METHODS[method])
                summary = run(config)
                cells[key] = {"held_out": summary["results"], "validation": summary["validation"],
                              "minutes": (time.perf_counter() - t) / 60}
                cells_path.write_text(json.dumps(cells, indent=1))
    print(table(cells))


def table(cells: dict) -> str:
    """Held-out success (mean ± std over seeds) of SFT and of SFT + each method, per demonstration count."""
    rows = ["| two-step demos | method | seeds | held-out all | held-out two-step | validation two-step |",
            "| --- | --- | --- | --- | --- | --- |"]
    groups: dict[tuple[str, str], list[dict]] = {}
    sft: dict[tuple[str, str], dict] = {}  # one warm start per (demonstrations, seed): every method's is the same
    for key, cell in cells.items():
        n, method, seed = key.split("/")
        sft[(n, seed)] = {"held_out": cell["held_out"]["SFT"], "validation": cell["validation"]["SFT"]}
        groups.setdefault((n, f"SFT + {method}"), []).append({"held_out": cell["held_out"]["SFT+RL"],
                                                             "validation": cell["validation"]["SFT+RL"]})
    for (n, _), runs in sft.items():
        groups.setdefault((n, "SFT"), []).append(runs)

    def spread(values: list[float]) -> str:
        mean = 100 * statistics.mean(values)
        return f"{mean:.0f} ± {100 * statistics.pstdev(values):.0f} %" if len(values) > 1 else f"{mean:.0f} %"

    for (n, method), runs in sorted(groups.items()):
        rows.append(f"| {n} | {method} | {len(runs)} | {spread([r['held_out']['all'] for r in runs])} | "
                    f"{spread([r['held_out']['lookup_multiply'] for r in runs])} | "
                    f"{spread([r['validation']['lookup_multiply'] for r in runs])} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
