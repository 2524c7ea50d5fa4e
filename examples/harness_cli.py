"""Codex, Claude Code or OpenClaw itself, trained as it is: forge-bridge's policy answers the API
the CLI speaks, and the task's checker reads the files it leaves.

Each rollout runs the real CLI (pinned in harnesses/; `make harnesses`) in the terminal's
bubblewrap sandbox: a fresh working directory at /work with the task's files, the system
read-only, no network but the gateway. Its tool calls run there; every model call is recorded
with the policy's tokens.

| `--harness` | command | API | pointed at the gateway by | its shell tool |
| --- | --- | --- | --- | --- |
| codex (`@openai/codex`) | `codex exec` | Responses | a custom provider whose `base_url` is the episode's URL (Codex's own sandbox off) | `exec_command` |
| claude-code (`@anthropic-ai/claude-code`) | `claude -p` | Messages | `ANTHROPIC_BASE_URL` | `Bash` |
| openclaw (`openclaw`, on Node 24) | `openclaw agent exec` | chat completions | a config whose one provider's `baseUrl` is `${OPENAI_BASE_URL}` | `exec` |

    .venv/bin/python examples/harness_cli.py --harness codex          # a scripted expert answers
    .venv/bin/python examples/harness_cli.py --harness claude-code --model qwen2.5-coder-0.5b-instruct --train 2

The scripted expert (the default) makes the one shell call the task needs: it shows the plumbing
in seconds. With `--model` an embedded model answers; the harnesses' prompts are long (about
6,000 tokens for Codex, 7,600 for OpenClaw, 11,600 for Claude Code), so on a CPU each call takes
a while. OpenClaw takes about 15 s to start on two cores.
"""

import argparse
import shutil
import tempfile
from pathlib import Path

import forge_bridge as fb
from forge_bridge.envs.in_sandbox import InSandbox
from forge_bridge.envs.terminal import TerminalEnvironment
from forge_bridge.envs.tool import ToolTask
from forge_bridge.serving import harnesses
from forge_bridge.serving.command_rollout import CommandRollout

INSTALL = (Path(__file__).resolve().parents[1] / "harnesses" / "node_modules").resolve()  # may be a link to /opt

CLIS = {  # --harness -> (executable, npm package, its shell tool, that tool's command argument)
    "codex": ("codex", "@openai/codex", "exec_command", "cmd"),
    "claude-code": ("claude", "@anthropic-ai/claude-code", "Bash", "command"),
    "openclaw": ("openclaw", "openclaw (on Node 24)", "exec", "command"),
}


def sum_is_12(answer: str, terminal: TerminalEnvironment) -> bool:
    return terminal.inside("total.txt").is_file() and terminal.read_file("total.txt").strip() == "12"


TASK = ToolTask("sum", "Write the sum of the numbers in numbers.txt to total.txt.", sum_is_12,
                setup=lambda terminal: terminal.write_file("numbers.txt", "3\n4\n5\n"))


def expert(tool: str, key: str):
    """What a good model does here: one shell call with the harness's own tool, then a short answer."""
    def reply(messages: list[dict], tools: list[dict] | None):
        if any(m["role"] == "tool" for m in messages):
            return "total.txt holds the sum."
        return {"tool": tool, "args": {key: "awk '{s += $1} END {print s}' numbers.txt > total.txt"}}

    return reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness", choices=sorted(CLIS), default="codex")
    parser.add_argument("--model", help="an embedded model to answer instead of the scripted expert")
    parser.add_argument("--train", type=int, default=0, metavar="N", help="GRPO iterations (with --model)")
    parser.add_argument("--repeat", type=int, default=1, help="episodes to record")
    args = parser.parse_args()
    executable, package, tool, key = CLIS[args.harness]
    if shutil.which(executable) is None and not (INSTALL / ".bin" / executable).exists():
        raise SystemExit(f"{args.harness} is not installed: make harnesses (or npm install -g {package})")

    if args.model:
        policy: fb.Policy = fb.LocalPolicy(args.model)
    else:
        from forge_bridge.policies.models import tiny_tokenizer
        from forge_bridge.policies.scripted import ScriptedPolicy

        policy = ScriptedPolicy(expert(tool, key), tiny_tokenizer())
    config = Path(tempfile.mkdtemp(prefix="harness-config-"))  # read-only inside; the sandbox's user reads it
    config.chmod(0o755)
    if args.harness == "openclaw":
        harness = harnesses.openclaw(str(config / "openclaw.json"))
        (config / "openclaw.json").write_text(harness.files["openclaw.json"])
    else:
        harness = harnesses.codex() if args.harness == "codex" else harnesses.claude_code()
    installed = (str(INSTALL),) if INSTALL.exists() else ()
    sandbox = InSandbox(read_only=(*installed, str(config)), path=(str(INSTALL / ".bin"),) if installed else ())
    recorder = fb.Recorder("runs/examples/harnesses.db", run_id=f"{args.harness}-example")
    with CommandRollout(list(harness.argv), policy, env=harness.env, sandbox=sandbox, timeout_s=600) as rollout:
        for _ in range(args.repeat):
            with fb.episode(TASK.id, recorder=recorder) as ep:
                reward = rollout(TASK)  # what the task's check gave (a trainer records it itself)
                ep.reward(reward)
            traj = ep.trajectory
            print(f"[{TASK.id}] reward={reward} status={traj.status} steps={len(traj)}")
            for i, step in enumerate(traj):
                calls = [f"{c.name}({c.arguments})" for c in step.action.tool_calls]
                print(f"  step {i} ({step.info['api']}): {len(step.completion_token_ids)} tokens, "
                      f"calls={calls or '-'}, text={step.action.content[:60]!r}")
        if args.train and args.model:
            trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, concurrency=1, run_name=args.harness,
                                                           out_dir=f"runs/examples/{args.harness}"))
            for metrics in trainer.train(rollout, [TASK], iterations=args.train):
                print(f"iteration {metrics['iteration']}: reward {metrics['reward_mean']:.2f}, "
                      f"published {metrics['version']}")
            trainer.close()
    policy.close()
    shutil.rmtree(config)


if __name__ == "__main__":
    main()
