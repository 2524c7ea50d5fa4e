"""How fast `forge-bridge inspect` answers on a big store: a synthetic store of 100,000
trajectories (2 steps each, 200,000 transitions, 10 task kinds, 50 iterations), served by the
inspector, each page fetched over HTTP as a browser would. Side by side: the inspector's first
page against loading the same store the obvious way, `TrajectoryStore.trajectories()` (every
trajectory parsed), which is what a table that is not paged would cost. Goal: the trajectory
list's first page in < 1 s.

Not covered: the browser's own rendering time (the pages are plain server-rendered HTML, no
script), stores on a network file system, and concurrent writers (see tests/e2e/test_inspect.py
for reading while a run writes).

    .venv/bin/python bench/inspect_list.py [--trajectories 100000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from tqdm import tqdm

from forge_bridge.app.inspector.server import Inspector
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Observation, Trajectory, Transition

KINDS = [f"kind{k}" for k in range(10)]


def synthesize(path: Path, n: int, seed: int = 0) -> None:
    """Write `n` trajectories into a store through `TrajectoryStore.add_many`, 5,000 to a
    transaction (the recorder's one-transaction-per-step path would take hours for 100,000)."""
    rng = random.Random(seed)
    step = Transition(observation=Observation(messages=[{"role": "user", "content": "What is 2 plus 3?"}]),
                      action=Action(content="The answer is 5."), prompt_token_ids=list(range(60)),
                      completion_token_ids=list(range(12)), completion_logprobs=[-0.1] * 12)
    with TrajectoryStore(path) as store:
        for start in tqdm(range(0, n, 5000), desc="synthesizing", unit_scale=5000):
            batch = []
            for i in range(start, min(n, start + 5000)):
                kind, it = KINDS[i % len(KINDS)], i // (n // 50 or 1) + 1
                steps = [dataclasses.replace(step, version=f"bench-v{it}") for _ in range(2)]
                batch.append(Trajectory(id=f"t{i:07d}", run_id="bench-run", task_id=f"{kind}-{i % 97}",
                                        group_id=f"bench-run-it{it}-{kind}-{i % 97}", reward=float(rng.random() < 0.4),
                                        metadata={"iteration": it, "kind": kind}, end_reason="terminated",
                                        transitions=steps))
            store.add_many(batch)


def timed(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="forge-bench-inspect-") as tmp:
        store = Path(tmp) / "trajectories.db"
        synthesize(store, args.trajectories)
        pages = {
            "first page (newest 50)": "/trajectories",
            "filtered: kind + failures": "/trajectories?kind=kind3&outcome=failure",
            "sorted by reward": "/trajectories?sort=reward&order=asc",
            "deep page (offset 99,950)": f"/trajectories?page={max(1, args.trajectories // 50)}",
            "one trajectory": "/trajectory/t0001234",
            "runs and curves": "/",
        }
        with Inspector(store=store) as inspector:
            results = {}
            for name, path in pages.items():
                cold = timed(inspector.url + path)[0]  # the first visit; then SQLite's page cache is warm
                times = [timed(inspector.url + path)[0] for _ in range(args.repeats)]
                results[name] = (cold, statistics.median(times), max(times), timed(inspector.url + path)[1])
        t0 = time.perf_counter()
        with TrajectoryStore(store) as s:
            loaded = len(s.trajectories())
        load_all = time.perf_counter() - t0
    print(f"\n{args.trajectories:,} trajectories; the first fetch, then the median (max) of {args.repeats} more")
    for name, (cold, median, worst, size) in results.items():
        print(f"  {name:28} first {cold * 1000:7.1f} ms, then {median * 1000:7.1f} ms ({worst * 1000:7.1f})  "
              f"{size / 1024:6.1f} KiB")
    first = max(results["first page (newest 50)"][:2])
    print(f"  {'load every trajectory':28} {load_all * 1000:8.1f} ms  ({loaded:,} parsed: what an unpaged table costs)")
    print(f"first page vs loading all: {load_all / first:.0f}x faster; goal < 1 s: {'met' if first < 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
