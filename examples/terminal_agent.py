"""Train a policy directly in an environment, no agent framework: a terminal.

`HarnessAgent` runs the plain loop -- obs = env.reset(task); action = policy(obs);
obs, reward, done = env.step(action) -- over `TerminalEnvironment`, which gives every episode a
fresh temporary working directory and three tools (run, read_file, write_file), each command
in a bubblewrap sandbox (the working directory the only writable place; time, CPU, memory,
file-size and process limits; no network, no shell). The task's checker
decides pass/fail. Every model call is recorded with its exact tokens, like a wrapped agent's,
and `HarnessAgent` is the rollout function the trainer takes, like a wrapped agent's.

    .venv/bin/python examples/terminal_agent.py              # record 4 episodes, print them
    .venv/bin/python examples/terminal_agent.py --train 2    # then 2 GRPO iterations on them

Runs offline on the embedded SmolLM2-135M on a CPU. Out of the box it rarely uses the tools
well; the episodes are still recorded in full, which is what the trainer learns from.
"""

import argparse

import forge_bridge as fb
from forge_bridge.envs.confined import CommandLimits
from forge_bridge.envs.harness import HarnessAgent
from forge_bridge.envs.terminal import TerminalEnvironment
from forge_bridge.envs.tool import ToolTask


def file_is(name: str, text: str):
    def check(answer: str, env: TerminalEnvironment) -> bool:
        path = env.workdir / name
        return path.is_file() and path.read_text().strip() == text

    return check


def count_lines(answer: str, env: TerminalEnvironment) -> bool:
    return "3" in answer


def seed_notes(env: TerminalEnvironment) -> None:
    (env.workdir / "notes.txt").write_text("alpha\nbeta\ngamma\n")


TASKS = [
    ToolTask("greet", "Create a file named hello.txt that contains the word hello.", file_is("hello.txt", "hello")),
    ToolTask("count", "How many lines does notes.txt have? Use the tools, then answer with the number.",
             count_lines, setup=seed_notes),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=0, metavar="N", help="GRPO iterations after recording")
    args = parser.parse_args()

    policy = fb.LocalPolicy("smollm2-135m-instruct")
    make_env = lambda: TerminalEnvironment(CommandLimits(timeout_s=5, cpu_s=5, memory_mb=512))  # noqa: E731
    harness = HarnessAgent(policy, make_env, system="You can use tools in a terminal.", max_model_calls=4,
                           temperature=0.7, max_tokens=96)
    recorder = fb.Recorder("runs/examples/terminal.db", run_id="terminal-example")
    for task in TASKS * 2:
        traj = harness.run(task, recorder=recorder)
        print(f"\n[{task.id}] reward={traj.reward} status={traj.status} steps={len(traj)}")
        for i, step in enumerate(traj):
            calls = [f"{c.name}({c.arguments})" for c in step.action.tool_calls]
            results = [r["content"][:60] for r in step.info.get("tool_results", {}).values()]
            print(f"  step {i}: {len(step.completion_token_ids)} tokens, calls={calls or '-'}, "
                  f"results={results or '-'}, text={step.action.content[:60]!r}")
    if args.train:
        trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, lr=1e-4, concurrency=4,
                                                       out_dir="runs/examples/terminal", run_name="terminal"))
        for metrics in trainer.train(harness, TASKS, iterations=args.train):
            print(f"iteration {metrics['iteration']}: reward {metrics['reward_mean']:.2f}, "
                  f"published {metrics['version']}")
        trainer.close()
    policy.close()


if __name__ == "__main__":
    main()
