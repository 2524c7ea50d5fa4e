"""The `forge-bridge` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_demo(args: argparse.Namespace) -> int:
    from forge_bridge import demo

    demo.run(args.out)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from forge_bridge.store import TrajectoryStore

    if not Path(args.store).is_file():
        print(f"forge-bridge export: no trajectory store at {args.store}", file=sys.stderr)
        return 2
    fmt = args.format or ("parquet" if str(args.out).endswith(".parquet") else "jsonl")
    filters = {k: v for k, v in (("run_id", args.run), ("task_id", args.task),
                                 ("group_id", args.group), ("status", args.status),
                                 ("adapter", args.adapter)) if v is not None}
    with TrajectoryStore(args.store) as store:
        if fmt == "parquet":
            n = store.export_parquet(args.out, **filters)
            print(f"wrote {n} transitions to {args.out}")
        else:
            n = store.export_jsonl(args.out, **filters)
            print(f"wrote {n} trajectories to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forge-bridge",
        description="Record, train and serve tool-using LangChain and CrewAI agents with RL.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="run the end-to-end demo on the embedded model",
                       description="Load the embedded SmolLM2-135M model (offline), make one "
                                   "tool-calling model call, record it with its exact token ids "
                                   "into a trajectory store and export it.")
    p.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("export", help="export recorded trajectories to JSONL or Parquet",
                       description="Export trajectories from a SQLite trajectory store. JSONL "
                                   "has one trajectory per line (versioned schema); Parquet has "
                                   "one row per transition.")
    p.add_argument("store", help="path of the trajectory store (a .db file)")
    p.add_argument("out", help="output file (.jsonl or .parquet)")
    p.add_argument("--format", choices=("jsonl", "parquet"), help="default: from the extension")
    p.add_argument("--run", help="only this run id")
    p.add_argument("--task", help="only this task id")
    p.add_argument("--group", help="only this group id")
    p.add_argument("--status", choices=("incomplete", "complete", "failed", "truncated"),
                   help="only trajectories with this status")
    p.add_argument("--adapter", help="only trajectories with a step from this adapter version")
    p.set_defaults(func=_cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (OSError, LookupError, ValueError, RuntimeError) as exc:
        print(f"forge-bridge {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
