"""Training one's own agent from the command line: `train` (probe, warm start, then RL), `probe`
and `sft` on their own. The agent is the user's: `--rollout module:make_rollout` (a function
policy -> rollout(task) -> reward) or `--agent-cmd` (a program per rollout), and `--tasks`
names their tasks (each with a `kind` for the probe)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, cast

from forge_bridge.app.config_file import merged
from forge_bridge.app.config_flags import config_kwargs
from forge_bridge.core.errors import InvalidArgument

TRAIN_FLAGS = ("group_size", "tasks_per_iteration", "concurrency", "gamma", "lr", "epochs", "minibatch_size",
               "microbatch_size", "max_memory_gb", "kl_beta", "lora_rank", "device", "gradient_checkpointing",
               "run_name", "out_dir", "seed", "report_to")
"""TrainerConfig fields the `train` and `sft` commands take as flags."""


def load_attr(spec: str, what: str):
    """`module:name` from the user's code; the working directory is searched first, as uvicorn
    and pytest do (the console script's own folder is on sys.path, the user's is not)."""
    import importlib
    import os

    module_name, _, attr = spec.partition(":")
    if not attr:
        raise InvalidArgument(f"{what}: expected 'module:name', got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"{what}: cannot load {spec!r} ({exc})") from None


def cmd_train(args: argparse.Namespace) -> int:
    import forge_bridge as fb
    from forge_bridge.core.runs import set_aside

    if args.new and args.resume:
        print("forge-bridge train: --new and --resume exclude each other", file=sys.stderr)
        return 2
    if args.from_store:
        return train_from_store(args)
    if (args.rollout is None) == (args.agent_cmd is None) or args.tasks is None:
        print("forge-bridge train: give --rollout (a Python function) or --agent-cmd (a program), and --tasks; "
              "or --from-store", file=sys.stderr)
        return 2
    if args.nproc < 1:
        raise InvalidArgument(f"--nproc: expected an int >= 1, got {args.nproc}")
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return _torchrun(args.nproc, args.argv)
    make_rollout = load_attr(args.rollout, "--rollout") if args.rollout else None
    tasks = _tasks(args.tasks)
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # by --nproc, or by torchrun on several machines
    spread: dict[str, Any] = {"distributed": fb.Distributed(strategy=args.strategy)} if launched else {}
    kind = fb.GRPOConfig if args.algo == "grpo" else fb.PPOConfig
    config = kind(**merged(kind, args.config, {**teaching_kwargs(args), **config_kwargs(args, TRAIN_FLAGS)}),
                  **spread)
    if spread:
        from forge_bridge.trainer.distributed import leader

        if not leader():
            return _follow(args, config)
    if args.new:
        earlier = set_aside(config.out_dir)
        if earlier is not None:
            print(f"(the earlier run in {config.out_dir} was moved to {earlier})")
    server = None
    policy: fb.Policy | None = None
    try:
        if args.vllm:
            server = _vllm_server(args, config)
            print(f"starting vLLM on {server.model} (log: {server.log_path}) ...", flush=True)
            server.start()
            policy = fb.VLLMPolicy(server.base_url, tool_format=args.tool_format or "auto")
        else:
            policy = fb.LocalPolicy(args.model, device=config.device, tool_format=args.tool_format or "auto")
        return _train(args, policy, config, make_rollout, tasks)
    finally:
        if policy is not None:
            policy.close()
        if server is not None:
            server.stop()


def train_from_store(args: argparse.Namespace) -> int:
    """`train --from-store`: one iteration learned from recorded episodes and their feedback."""
    import datetime

    import forge_bridge as fb

    since = None
    if args.since:
        try:
            since = float(args.since)
        except ValueError:
            try:
                since = datetime.datetime.fromisoformat(args.since).replace(
                    tzinfo=datetime.timezone.utc).timestamp()
            except ValueError:
                raise InvalidArgument(f"--since: expected an ISO date or a unix time, got {args.since!r}") from None
    if any("=" not in item for item in args.where):
        raise InvalidArgument(f"--where: expected KEY=VALUE each, got {args.where}")
    where = dict(item.split("=", 1) for item in args.where)
    if len(where) != len(args.where):
        raise InvalidArgument(f"--where: a key given twice in {args.where} (an episode has one value of each)")
    offline = fb.OfflineConfig(since=since, run_id=args.store_run, where=where or None, threshold=args.threshold)
    config = fb.GRPOConfig(**merged(fb.GRPOConfig, args.config, config_kwargs(args, TRAIN_FLAGS)))
    policy = fb.LocalPolicy(args.model, device=config.device, tool_format=args.tool_format or "auto")
    trainer = fb.GRPOTrainer(policy, config, model=args.model)
    try:
        with fb.TrajectoryStore(args.from_store, readonly=True) as store:
            metrics = trainer.train_offline(store, offline)
    finally:
        trainer.close()
        policy.close()
    print(f"learned from {args.from_store}: {metrics['offline_episodes']} episodes, "
          f"{metrics['offline_missing_reward']} without a reward (left out), {metrics['offline_imitated']} imitated, "
          f"{metrics['offline_own']} of the student's own reinforced; published {metrics['version']} in {config.out_dir}")
    return 0


def _torchrun(nproc: int, argv: list[str]) -> int:
    """This command (`argv`) again on `nproc` processes of this machine, launched as `torchrun
    --standalone` launches them (torch's elastic launcher, called here: torchrun's own flags
    would take some of ours); 0, or 1 when a rank failed."""
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
    try:
        elastic_launch(config, sys.executable)("-m", "forge_bridge.app.cli", *argv)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        print(f"forge-bridge train: rank {rank} failed (exit code {failure.exitcode}); its error is above",
              file=sys.stderr)
        return 1
    return 0


def _follow(args: argparse.Namespace, config) -> int:
    """A rank other than 0: no policy, rollouts or run folder; it takes its share of each update."""
    import forge_bridge as fb

    # a follower rank has neither a policy nor a rollout (Trainer takes None for both there)
    trainer = (fb.GRPOTrainer if args.algo == "grpo" else fb.PPOTrainer)(None, config,  # type: ignore[arg-type]
                                                                         model=args.model)
    try:
        trainer.train(None, [], args.iterations, resume=args.resume)  # type: ignore[arg-type]
    finally:
        trainer.close()  # leaves the process group: a gloo group left to the exit can abort the rank
    return 0


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
    return VLLMServer(model_dir, max_lora_rank=rank, tool_parser=_template_format(model_dir),
                      reasoning_parser=args.reasoning_parser, max_model_len=args.max_model_len,
                      extra_args=["--gpu-memory-utilization", "0.45"] if shared_gpu else [])


def _template_format(model_dir) -> str:
    from forge_bridge.policies import models
    from forge_bridge.policies.toolcalls import detect_format

    return detect_format(models.load_tokenizer(model_dir).chat_template)


def _train(args: argparse.Namespace, policy, config, make_rollout, tasks) -> int:
    import forge_bridge as fb
    from forge_bridge.core.errors import RunExistsError

    validation = _tasks(args.validation) if args.validation else None  # a bad name fails before anything runs
    trainer = (fb.GRPOTrainer if args.algo == "grpo" else fb.PPOTrainer)(policy, config, model=args.model)
    if make_rollout is not None:
        rollout = make_rollout(policy)
    else:
        from forge_bridge.serving.command_rollout import CommandRollout

        rollout = CommandRollout(args.agent_cmd, policy, timeout_s=args.agent_timeout)
    try:
        fresh = not args.resume and not trainer.previous_run  # else train() resumes, or refuses the folder
        if fresh and args.demos:
            warm_start(args, trainer, make_rollout, rollout)
        teacher = teacher_of(args, trainer, make_rollout)
        if teacher is not None:  # the teacher flags are GRPO's (`teaching_kwargs` refuses them with PPO)
            cast(fb.GRPOTrainer, trainer).use_teacher(teacher)
        if fresh and not args.no_probe:
            report = trainer.probe(rollout, tasks, kind_key=args.kind_key, require_kind=False)
            print(f"signal probe ({report.group_size} rollouts of each of the {len(tasks)} tasks):\n{report}")
            trainer.run.log.log_event("probe", report.metrics())
        history = trainer.train(rollout, tasks, args.iterations, resume=args.resume, validation=validation,
                                eval_every=args.eval_every, patience=args.patience)
    except RunExistsError as exc:
        print(f"forge-bridge train: {exc}", file=sys.stderr)
        return 2
    finally:
        trainer.close()
        if make_rollout is None:
            rollout.close()
        used_teacher = getattr(trainer, "teacher", None)  # GRPO's
        if used_teacher is not None and used_teacher.policy is not None:
            used_teacher.policy.close()
    last = history[-1] if history else {}
    print(f"done: {trainer.iteration} iterations, live adapter {policy.current()}, last mean "
          f"reward {last.get('reward_mean', float('nan')):.3f}; run folder {config.out_dir}")
    return 0


def demonstrations(args: argparse.Namespace, trainer, make_rollout, tasks) -> list:
    """The demonstrations `--demos` names: 'tasks' (recorded through the agent from each task's
    'demo' plan), a JSONL file of OpenAI conversations, or a trajectory store (.db)."""
    import forge_bridge as fb

    spec = args.demos
    if spec == "tasks":
        if make_rollout is None:
            raise InvalidArgument("--demos tasks records through the agent: it needs --rollout, not --agent-cmd")
        return fb.record_demonstrations(make_rollout, tasks, trainer.tokenizer, trainer.recorder,
                                        concurrency=trainer.config.concurrency, progress=trainer.config.progress)
    path = Path(spec)
    if not path.is_file():
        raise InvalidArgument(f"--demos: expected 'tasks', a .jsonl file or a .db store, got {spec!r} (no such file)")
    if path.suffix == ".jsonl":
        return fb.import_demonstrations(path, trainer.tokenizer, trainer.recorder)
    return stored_demonstrations(path, args.demos_run)


def stored_demonstrations(path: str | Path, run_id: str) -> list:
    """The usable demonstrations recorded under `run_id` in another trajectory store, read without writing to it."""
    import forge_bridge as fb

    with fb.TrajectoryStore(path, readonly=True) as store:
        return fb.read_demonstrations(store, run_id)


def warm_start(args: argparse.Namespace, trainer, make_rollout, rollout) -> dict:
    """SFT on `--demos`, checked greedily on `--held-out` tasks when given; published as '<run>-sft'."""
    import forge_bridge as fb

    tasks = _tasks(args.tasks)
    demos = demonstrations(args, trainer, make_rollout, tasks)
    held_out = _tasks(args.held_out) if args.held_out else None
    config = fb.SFTConfig(**{k: v for k, v in (("epochs", args.sft_epochs), ("lr", args.sft_lr)) if v is not None})
    result = fb.sft(trainer, demos, config, rollout=rollout if held_out else None, held_out=held_out,
                    kind_key=args.kind_key)
    print(f"SFT on {len(demos)} demonstrations ({result['sft_samples']} model calls): loss "
          f"{result['sft_loss_first']:.3f} -> {result['sft_loss_last']:.3f}; published {result.get('version')}")
    return result


def teaching_kwargs(args: argparse.Namespace) -> dict:
    """The GRPOConfig settings of the teacher flags (none when no teacher flag is set)."""
    import forge_bridge as fb

    wants = args.guide or args.distill_beta or args.relabel_weight
    if (wants or args.teacher) and args.algo != "grpo":
        raise InvalidArgument("--teacher, --guide, --distill-beta and --relabel-weight are GRPO's (--algo grpo)")
    if (args.distill_beta or args.relabel_weight or args.guide == "teacher") and not args.teacher:
        raise InvalidArgument("--distill-beta, --relabel-weight and --guide teacher need --teacher")
    if args.guide == "demonstrations" and not args.demos and not args.resume:
        raise InvalidArgument("--guide demonstrations draws guides from --demos: give them")
    out: dict = {k: v for k, v in (("distill_beta", args.distill_beta), ("relabel_weight", args.relabel_weight)) if v}
    if args.guide:
        out["guidance"] = fb.Guidance(below=args.guide_below, k=args.guide_k, source=args.guide)
    return out


def teacher_policy(spec: str, args: argparse.Namespace):
    """The policy `--teacher` names: an adapter folder on the run's base model, a model folder, a
    URL of an OpenAI-compatible server, or module:name of a Policy in the user's code."""
    import forge_bridge as fb

    path = Path(spec)
    if spec.startswith(("http://", "https://")):
        return fb.VLLMPolicy(spec, model=args.teacher_model)
    if (path / "adapter_config.json").is_file():
        policy = fb.LocalPolicy(args.model, tool_format=args.tool_format or "auto")
        policy.load_adapter(path, "teacher")
        return policy
    if (path / "config.json").is_file():
        return fb.LocalPolicy(str(path), tool_format=args.tool_format or "auto")
    if ":" in spec and not path.exists():
        policy = load_attr(spec, "--teacher")
        if not isinstance(policy, fb.Policy):
            raise InvalidArgument(f"--teacher {spec}: expected a forge_bridge Policy, got {type(policy).__name__}")
        return policy
    raise InvalidArgument(f"--teacher {spec!r}: expected an adapter folder, a model folder, a URL or module:name")


def teacher_of(args: argparse.Namespace, trainer, make_rollout):
    """The `fb.Teacher` of the flags (None without them): its policy, the agent to run it through,
    and the demonstrations recorded in the run's store for `--guide demonstrations`."""
    import forge_bridge as fb

    if not args.teacher and not args.guide:
        return None
    if args.guide == "teacher" and make_rollout is None:
        raise InvalidArgument("--guide teacher runs the teacher through your agent: it needs --rollout")
    demos = []
    if args.guide == "demonstrations":
        if args.demos and Path(args.demos).suffix == ".db":  # read where they are, not copied
            demos = stored_demonstrations(args.demos, args.demos_run)
        else:  # recorded or imported into the run's store by the warm start
            demos = fb.read_demonstrations(trainer.recorder.store)
    policy = teacher_policy(args.teacher, args) if args.teacher else None
    return fb.Teacher(policy=policy, make_rollout=make_rollout, demonstrations=demos)


def _tasks(spec: str) -> list:
    tasks = load_attr(spec, "--tasks")
    return list(tasks() if callable(tasks) else tasks)


def cmd_sft(args: argparse.Namespace) -> int:
    """The warm start alone: a run folder whose checkpoint `train --resume` continues from."""
    import forge_bridge as fb

    make_rollout = load_attr(args.rollout, "--rollout")
    config = fb.GRPOConfig(**merged(fb.GRPOConfig, args.config, config_kwargs(args, TRAIN_FLAGS)))
    policy = fb.LocalPolicy(args.model, device=config.device, tool_format=args.tool_format or "auto")
    trainer = fb.GRPOTrainer(policy, config, model=args.model)
    try:
        if trainer.previous_run:
            print(f"forge-bridge sft: {config.out_dir} holds a run already; give another --out", file=sys.stderr)
            return 2
        warm_start(args, trainer, make_rollout, make_rollout(policy))
    finally:
        trainer.close()
        policy.close()
    print(f"adapter: {Path(config.out_dir) / 'adapters' / trainer.version_name('sft')}; continue with "
          "forge-bridge train ... --resume")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """One group per task on the policy as it is (and `--adapter`): is there anything for GRPO?"""
    import forge_bridge as fb
    from forge_bridge.trainer.probe import probe

    make_rollout = load_attr(args.rollout, "--rollout")
    tasks = _tasks(args.tasks)
    policy = fb.LocalPolicy(args.model, tool_format=args.tool_format or "auto")
    try:
        if args.adapter:
            policy.load_adapter(args.adapter, "probed")
        with fb.TrajectoryStore(args.store) as store:
            report = probe(make_rollout(policy), tasks, recorder=fb.Recorder(store), run_id="probe",
                           group_size=args.group_size, kind_key=args.kind_key, greedy=args.greedy,
                           concurrency=args.concurrency)
    finally:
        policy.close()
    print(f"signal probe ({report.group_size} rollout(s) of each of the {len(tasks)} tasks, on "
          f"{args.adapter or 'the base model'}):\n{report}")
    return 0


__all__ = ["TRAIN_FLAGS", "VLLM_LORA_RANKS", "cmd_probe", "cmd_sft", "cmd_train", "demonstrations", "load_attr", "stored_demonstrations", "teacher_of",
           "teacher_policy", "teaching_kwargs", "warm_start"]
