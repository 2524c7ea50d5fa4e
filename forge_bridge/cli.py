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


def _cmd_serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from forge_bridge import models
    from forge_bridge.policy import check_adapter_dir
    from forge_bridge.vllm_server import VLLMServer

    model_dir = models.model_path(args.model)
    adapters = {}
    if args.adapter:
        adapters[args.adapter_name] = str(check_adapter_dir(args.adapter).resolve())
    server = VLLMServer(model_dir, served_name=args.served_name, host=args.host, port=args.port,
                        adapters=adapters, max_model_len=args.max_model_len)
    print(f"starting vLLM for {model_dir} (log: {server.log_path}) ...", flush=True)
    server.start(timeout_s=args.timeout)
    name = args.adapter_name if adapters else args.served_name
    print(f"serving at {server.base_url}  (model name: {name!r})", flush=True)
    print(f"""
LangChain:
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url="{server.base_url}", api_key="unused", model="{name}")

CrewAI:
    from crewai import LLM
    llm = LLM(model="hosted_vllm/{name}", base_url="{server.base_url}", api_key="unused")

Any OpenAI client: OPENAI_BASE_URL={server.base_url}
Ctrl-C stops the server.""", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if server.proc is not None and server.proc.poll() is not None:
            print(f"vLLM exited with code {server.proc.returncode}:\n{server.log_tail()}",
                  file=sys.stderr)
            return 1
    server.stop()
    print("stopped", flush=True)
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

    p = sub.add_parser("serve", help="serve a model (and a trained adapter) with vLLM",
                       description="Start a vLLM OpenAI-compatible server for MODEL (the embedded "
                                   "model's name or a local transformers directory), optionally "
                                   "with a trained LoRA adapter, wait until it is healthy, print "
                                   "its base_url and how to point LangChain or CrewAI at it, and "
                                   "run until Ctrl-C. Uses .venv-vllm (make vllm builds it) or "
                                   "FORGE_BRIDGE_VLLM_PYTHON.")
    p.add_argument("model", help="embedded model name (smollm2-135m-instruct) or a model directory")
    p.add_argument("--adapter", help="a peft LoRA adapter directory (safetensors) to serve")
    p.add_argument("--adapter-name", default="forge", help="model name the adapter is served "
                                                          "under (default: forge)")
    p.add_argument("--served-name", default="base", help="model name of the base model (default: base)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--max-model-len", type=int, default=2048, help="context length (default: 2048)")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for health")
    p.set_defaults(func=_cmd_serve)
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
