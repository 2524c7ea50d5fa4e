"""What the terminal's sandbox costs per command: the same commands through `run_confined` with
`sandbox="none"` (prlimit + `unshare -n`, the confinement before bubblewrap) and with
`sandbox="bwrap"` (prlimit + setpriv + bubblewrap namespaces), and a bare `subprocess.run` for
scale, interleaved in one run so machine noise hits all three alike. The goal is < 20 ms added
per command.

Commands: `true` (pure start-up cost), `sh -c 'ls -la; cat f'` (a typical agent command) and
`python3 -c pass` (an interpreter start). Not covered: commands that run long (the sandbox adds
nothing per second of work, only at start and exit) and concurrency (parallel rollouts each pay
this once per command).

    .venv/bin/python bench/sandbox.py [--repeats 100]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from forge_bridge.envs.confined import CommandLimits, run_confined

PLAIN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}  # the same programs the confined runs find
COMMANDS = {"true": ["true"], "sh: ls + cat": ["sh", "-c", "ls -la; cat f"], "python3 -c pass": ["python3", "-c", "pass"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # sandbox="none" warns on every call site; known here
    workdir = Path(tempfile.mkdtemp(prefix="forge-bench-sandbox-"))
    (workdir / "f").write_text("hello\n")
    limits = CommandLimits()
    ways = {
        "bare subprocess": lambda argv: subprocess.run(argv, cwd=workdir, capture_output=True, env=PLAIN_ENV),
        "none (prlimit+unshare)": lambda argv: run_confined(argv, workdir, limits, "none"),
        "bwrap": lambda argv: run_confined(argv, workdir, limits, "bwrap"),
    }
    times: dict[tuple[str, str], list[float]] = {(c, w): [] for c in COMMANDS for w in ways}
    for way in ways.values():  # warm up: first-call probes and page cache
        way(["true"])
    for _ in range(args.repeats):
        for command, argv in COMMANDS.items():
            for name, way in ways.items():
                t0 = time.perf_counter()
                way(argv)
                times[(command, name)].append((time.perf_counter() - t0) * 1000)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"ms per command, median (p90) over {args.repeats} interleaved repeats")
    print(f"{'command':18} " + " ".join(f"{w:>24}" for w in ways) + f" {'bwrap - none':>14}")
    for command in COMMANDS:
        cells, medians = [], {}
        for way in ways:
            xs = sorted(times[(command, way)])
            medians[way] = statistics.median(xs)
            cells.append(f"{medians[way]:9.1f} ({xs[int(0.9 * len(xs)) - 1]:5.1f})")
        extra = medians["bwrap"] - medians["none (prlimit+unshare)"]
        print(f"{command:18} " + " ".join(f"{c:>24}" for c in cells) + f" {extra:+13.1f}")


if __name__ == "__main__":
    main()
