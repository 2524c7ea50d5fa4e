"""Record a two-agent CrewAI crew with forge-bridge: one trajectory per role.

A researcher with a lookup tool finds a number, a writer turns it into a sentence. Both agents
run on the embedded SmolLM2-135M through `ForgeLLM`; each role's steps are recorded into its own
trajectory (children of one episode) and could be trained as one shared adapter or one adapter
per role (`role_slot=`). Offline: CrewAI's telemetry is switched off by the adapter.

    .venv/bin/python examples/crewai_crew.py
"""

from crewai import Agent, Crew, Process, Task
from crewai.tools import tool

import forge_bridge as fb
from forge_bridge.adapters.crewai import ForgeLLM

POPULATION = {"paris": 2102650, "berlin": 3596999, "madrid": 3332035}


@tool("lookup")
def lookup(city: str) -> str:
    """Population of a city, from a small local table."""
    return str(POPULATION.get(city.strip().lower(), "unknown city"))


def main() -> None:
    policy = fb.LocalPolicy("smollm2-135m-instruct")
    llm = ForgeLLM(policy, temperature=0.7, max_tokens=96)
    researcher = Agent(role="researcher", goal="find facts", backstory="You look things up.", llm=llm, tools=[lookup],
                       max_iter=3, verbose=False)
    writer = Agent(role="writer", goal="write one sentence", backstory="You write.", llm=llm, max_iter=2,
                   verbose=False)
    find = Task(description="Find the population of Berlin.", expected_output="a number", agent=researcher)
    write = Task(description="Write one sentence about the population of Berlin.", expected_output="one sentence",
                 agent=writer, context=[find])
    crew = Crew(agents=[researcher, writer], tasks=[find, write], process=Process.sequential)

    recorder = fb.Recorder("runs/examples/crewai.db", run_id="crewai-example")
    with fb.episode("berlin", recorder=recorder) as ep:
        result = crew.kickoff()
        ep.reward(1.0 if "3596999" in result.raw.replace(",", "") else 0.0)
    print(f"crew answer: {result.raw!r}  reward={ep.trajectory.reward}")
    for role, child in ep.children.items():
        traj = recorder.store.get(child.id)
        print(f"\n[{role}] trajectory {traj.id}: {len(traj)} steps, status {traj.status}, "
              f"reward {traj.reward}")
        for i, step in enumerate(traj):
            calls = [f"{c.name}({c.arguments})" for c in step.action.tool_calls]
            print(f"  step {i}: {len(step.prompt_token_ids)} prompt + {len(step.completion_token_ids)} "
                  f"completion tokens, calls={calls or '-'}, text={step.action.content[:60]!r}")
    policy.close()


if __name__ == "__main__":
    main()
