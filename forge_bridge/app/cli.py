"""The `forge-bridge` command line."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from forge_bridge.app.config_flags import add_config_flags, config_kwargs
from forge_bridge.core.errors import InvalidArgument

DEMO_FLAGS = ("model", "out_dir", "seed", "rl_iterations", "sft_epochs", "demonstrate",
              "multi_step_demos")
"""DemoConfig fields the `demo` command takes as flags."""
TRAIN_FLAGS = ("group_size", "tasks_per_iteration", "concurrency", "gamma", "lr", "epochs",
               "minibatch_size", "kl_beta", "lora_rank", "device", "gradient_checkpointing",
               "run_name", "out_dir", "seed")
"""TrainerConfig fields the `train` command takes as flags."""
QUICK = dict(train_per_kind=4, eval_per_kind=2, sft_epochs=1, rl_iterations=2, rl_tasks_per_kind=(1, 1, 1),
             group_size=4)
"""`demo --quick`: a minute-long smoke run of the whole pipeline (flags given still win)."""


def _cmd_demo(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from forge_bridge.app import demo

    config = replace(demo.DemoConfig(), **QUICK) if args.quick else demo.DemoConfig()
    demo.run(replace(config, **config_kwargs(args, DEMO_FLAGS)))
    return 0


def _load_attr(spec: str, what: str):
    import importlib

    module_name, _, attr = spec.partition(":")
    if not attr:
        raise InvalidArgument(f"{what}: expected 'module:name', got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"{what}: cannot load {spec!r} ({exc})") from None


def _cmd_train(args: argparse.Namespace) -> int:
    import forge_bridge as fb
    from forge_bridge.core.runs import set_aside

    if args.new and args.resume:
        print("forge-bridge train: --new and --resume exclude each other", file=sys.stderr)
        return 2
    if (args.rollout is None) == (args.agent_cmd is None):
        print("forge-bridge train: give --rollout (a Python function) or --agent-cmd (a program)",
              file=sys.stderr)
        return 2
    make_rollout = _load_attr(args.rollout, "--rollout") if args.rollout else None
    tasks = _load_attr(args.tasks, "--tasks")
    tasks = tasks() if callable(tasks) else tasks
    config = (fb.GRPOConfig if args.algo == "grpo" else fb.PPOConfig)(**config_kwargs(args, TRAIN_FLAGS))
    if args.new:
        earlier = set_aside(config.out_dir)
        if earlier is not None:
            print(f"(the earlier run in {config.out_dir} was moved to {earlier})")
    server = policy = None
    try:
        if args.vllm:
            server = _vllm_server(args, config)
            print(f"starting vLLM on {server.model} (log: {server.log_path}) ...", flush=True)
            server.start()
            policy = fb.VLLMPolicy(server.base_url, tool_format=server.tool_parser)
        else:
            policy = fb.LocalPolicy(args.model, device=config.device, tool_format=args.tool_format or "auto")
        return _train(args, policy, config, make_rollout, tasks)
    finally:
        if policy is not None:
            policy.close()
        if server is not None:
            server.stop()


VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The `--max-lora-rank` values vLLM accepts."""


def _vllm_server(args: argparse.Namespace, config):
    """A vLLM server for the run: LoRA on with room for the trainer's rank, the model family's
    tool-call parser (the client parses what it leaves in the text in the same format), and on
    a GPU the trainer's model on the same device, so vLLM takes half its memory, not 90 %."""
    import torch

    from forge_bridge.policies import models
    from forge_bridge.policies.device import resolve_device
    from forge_bridge.policies.vllm_server import VLLMServer

    model_dir = models.model_path(args.model)
    rank = next((r for r in VLLM_LORA_RANKS if r >= config.lora_rank), None)
    if rank is None:
        raise InvalidArgument(f"--lora-rank {config.lora_rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")
    shared_gpu = torch.cuda.is_available() and resolve_device(config.device).startswith("cuda")
    return VLLMServer(model_dir, max_lora_rank=rank, tool_parser=args.tool_format or _template_format(model_dir),
                      reasoning_parser=args.reasoning_parser, max_model_len=args.max_model_len,
                      extra_args=["--gpu-memory-utilization", "0.45"] if shared_gpu else [])


def _template_format(model_dir) -> str:
    from forge_bridge.policies import models
    from forge_bridge.policies.toolcalls import detect_format

    return detect_format(models.load_tokenizer(model_dir).chat_template)


def _train(args: argparse.Namespace, policy, config, make_rollout, tasks) -> int:
    import forge_bridge as fb
    from forge_bridge.core.errors import RunExistsError

    trainer = (fb.GRPOTrainer if args.algo == "grpo" else fb.PPOTrainer)(policy, config, model=args.model)
    if make_rollout is not None:
        rollout = make_rollout(policy)
    else:
        from forge_bridge.serving.command_rollout import CommandRollout

        rollout = CommandRollout(args.agent_cmd, policy, timeout_s=args.agent_timeout)
    try:
        history = trainer.train(rollout, tasks, args.iterations, resume=args.resume)
    except RunExistsError as exc:
        print(f"forge-bridge train: {exc}", file=sys.stderr)
        return 2
    finally:
        trainer.close()
        if make_rollout is None:
            rollout.close()
    last = history[-1] if history else {}
    print(f"done: {trainer.iteration} iterations, live adapter {policy.current()}, last mean "
          f"reward {last.get('reward_mean', float('nan')):.3f}; run folder {config.out_dir}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import forge_bridge as fb
    from forge_bridge.app import demo
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
    rates = demo.rates(held_out, passed)
    for name, value in rates.items():
        print(f"{name:<20}{value * 100:>6.0f}%")
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from forge_bridge.policies import models
    from forge_bridge.policies.base import check_adapter_dir

    print(f"wrote {models.merge(args.model, check_adapter_dir(args.adapter), args.out)}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from forge_bridge.app.plot import plot_run

    print(f"wrote {plot_run(args.run_dir, args.out)}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from forge_bridge.app.inspector.server import Inspector

    if args.run_dir is None and args.store is None:
        print("forge-bridge inspect: give a run folder, or --store for a store outside one", file=sys.stderr)
        return 2
    inspector = Inspector(args.run_dir, store=args.store, host=args.host, port=args.port)
    print(f"forge-bridge inspect: {inspector.url}  (reads {inspector.view.store_path}; Ctrl-C stops)", flush=True)
    inspector.serve_forever()
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from forge_bridge.core.store import TrajectoryStore

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


def _stop_on_signal() -> threading.Event:
    """An event set by Ctrl-C or SIGTERM: a server command waits on it, then shuts down cleanly."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _cmd_gateway(args: argparse.Namespace) -> int:

    import forge_bridge as fb
    from forge_bridge.serving.gateway import Gateway

    if args.vllm_url:
        policy = fb.VLLMPolicy(args.vllm_url, model=args.served_model)
    else:
        policy = fb.LocalPolicy(args.model)
    if args.adapter:
        policy.load_adapter(args.adapter, args.adapter_name)
    gateway = Gateway(policy, fb.Recorder(args.store), host=args.host, port=args.port, token=args.token,
                      max_model_calls=args.max_model_calls)
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


def _cmd_serve(args: argparse.Namespace) -> int:

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forge-bridge",
        description="Record, train and serve tool-using LangChain and CrewAI agents with RL.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="train a LangChain agent on the embedded model: base -> SFT -> GRPO",
                       description="The main job: an ordinary LangChain create_agent agent with "
                                   "calculator and lookup tools runs on the embedded SmolLM2-135M "
                                   "(offline, CPU) through ForgeMiddleware; it is evaluated, warm-"
                                   "started with SFT on scripted demonstrations, trained with multi-"
                                   "turn GRPO while it keeps running, and evaluated again. Prints "
                                   "the held-out success table and writes the run folder.")
    from forge_bridge.app.demo import DemoConfig

    add_config_flags(p, DemoConfig, DEMO_FLAGS, aliases={"out_dir": "--out"})
    p.add_argument("--quick", action="store_true", help="tiny scale: checks the pipeline in a minute")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("train", help="train your own agent: a rollout function and tasks",
                       description="Train a LoRA on LocalPolicy(MODEL) with GRPO or PPO. --rollout "
                                   "names a function policy -> rollout, where rollout(task) runs "
                                   "your agent on the policy and returns the reward; --tasks names "
                                   "a list of tasks (or a function returning one). Each iteration's "
                                   "adapter is published to the policy your agent runs on.")
    p.add_argument("--rollout", help="module:function, e.g. my_agent:make_rollout")
    p.add_argument("--agent-cmd", help="or: a program run per rollout with OPENAI_BASE_URL set to its "
                   "episode, e.g. \"python my_agent.py {task_json}\"; it prints a JSON line "
                   "{\"reward\": r} (see forge_bridge.serving.command_rollout)")
    p.add_argument("--agent-timeout", type=float, default=300.0,
                   help="seconds before an --agent-cmd process is killed (episode truncated; default: 300)")
    p.add_argument("--tasks", required=True, help="module:name of the task list, e.g. my_agent:TASKS")
    p.add_argument("--model", default="smollm2-135m-instruct", help="embedded name or model directory")
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--vllm", action="store_true", help="roll out on a vLLM server started for the run "
                   "(.venv-vllm; LoRA on, each new adapter loaded into it) instead of the embedded policy")
    p.add_argument("--tool-format", choices=("hermes", "llama3_json", "mistral"),
                   help="the model family's tool-call format (default: from its chat template)")
    p.add_argument("--reasoning-parser", help="with --vllm: vLLM's parser for thinking blocks, e.g. qwen3")
    p.add_argument("--max-model-len", type=int, default=2048, help="with --vllm: the server's context")
    from forge_bridge.trainer.config import TrainerConfig

    add_config_flags(p, TrainerConfig, TRAIN_FLAGS, aliases={"out_dir": "--out"})
    p.add_argument("--resume", action="store_true", help="continue the run in the folder from its checkpoint")
    p.add_argument("--new", action="store_true", help="set an earlier run in the folder aside "
                   "(renamed to <out>-<time>) and start a new one")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("gateway", help="an OpenAI-compatible server that records every call (zero code change)",
                       description="Serve a policy behind an OpenAI-compatible API that records every "
                                   "call into a trajectory store: point an agent's OPENAI_BASE_URL at "
                                   "an episode URL and it is recorded with the policy's exact tokens.")
    p.add_argument("--model", default="smollm2-135m-instruct", help="embedded model name or directory")
    p.add_argument("--vllm-url", help="serve through a running vLLM server instead (its /v1 URL)")
    p.add_argument("--served-model", default="base", help="the vLLM server's model name (default: base)")
    p.add_argument("--adapter", help="a LoRA adapter directory to serve")
    p.add_argument("--adapter-name", default="forge-v1", help="its version name (default: forge-v1)")
    p.add_argument("--store", default="runs/gateway/trajectories.db", help="the trajectory store")
    p.add_argument("--token", help="require Authorization: Bearer TOKEN")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8100, help="port (default: 8100)")
    p.add_argument("--max-model-calls", type=int, default=25, help="step limit per episode (default: 25)")
    p.set_defaults(func=_cmd_gateway)

    p = sub.add_parser("eval", help="held-out success of the demo agent, optionally with an adapter",
                       description="Run the demo's LangChain agent greedily on the held-out tasks "
                                   "and print the success rate per task kind.")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--adapter", help="a LoRA adapter directory to evaluate")
    p.add_argument("--per-kind", type=int, default=10, help="tasks per kind (default: 10)")
    p.add_argument("--split", choices=("held_out", "validation"), default="held_out",
                   help="the demo's held-out tasks (default) or the validation tasks its settings were chosen on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store", default="runs/eval/trajectories.db", help="where the episodes are recorded")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("merge", help="merge an adapter into the base model (a standalone model directory)",
                       description="Write MODEL with ADAPTER merged into its weights as a standalone "
                                   "transformers directory (safetensors, tokenizer and chat template "
                                   "included) that vLLM, llama.cpp converters or transformers load "
                                   "without peft.")
    p.add_argument("model", help="embedded model name or model directory")
    p.add_argument("adapter", help="the LoRA adapter directory")
    p.add_argument("out", help="output directory")
    p.set_defaults(func=_cmd_merge)

    p = sub.add_parser("plot", help="plot the reward curve of a training run folder",
                       description="Read RUN_DIR/metrics.jsonl and write a PNG of the mean reward "
                                   "and success rate per iteration.")
    p.add_argument("run_dir", help="a run folder (with metrics.jsonl)")
    p.add_argument("--out", help="PNG path (default: RUN_DIR/reward_curve.png)")
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser("inspect", help="look at a run in the browser: curves, trajectories, tokens, credit",
                       description="Serve a local web app over RUN_DIR (its trajectory store, read-only and "
                                   "safe while a run is writing, metrics.jsonl and results.json): training "
                                   "curves, a filterable trajectory table, each trajectory step by step with "
                                   "its tokens coloured by logprob, loss mask or advantage, groups side by "
                                   "side, and adapter versions on the same held-out task.")
    p.add_argument("run_dir", nargs="?", help="a run folder (with trajectories.db)")
    p.add_argument("--store", help="a trajectory store outside a run folder")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.set_defaults(func=_cmd_inspect)

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
