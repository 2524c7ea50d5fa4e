"""The CrewAI agents and crews the tests run, and a scripted expert that solves them.

The taught test model learns the expert's replies on the exact prompts CrewAI builds (recorded
by running these crews on a ScriptedPolicy), so tests can run real crews on a real model.
"""

from __future__ import annotations

import re

from crewai import Agent, Crew, Process, Task
from crewai.tools import tool

POPULATION = {"paris": 2102650, "berlin": 3596999}


@tool("add")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool("lookup")
def lookup(city: str) -> str:
    """Population of a city."""
    return str(POPULATION[city.strip().lower()])


@tool("add")
def broken_add(a: int, b: int) -> int:
    """Add two integers."""
    raise RuntimeError("calculator is on fire")


def calculator_crew(llm, *, tools=None, max_iter: int = 3) -> Crew:
    agent = Agent(role="calculator", goal="add numbers", backstory="You add.", llm=llm,
                  tools=tools if tools is not None else [add], max_iter=max_iter, verbose=False)
    task = Task(description="What is 2 plus 3?", expected_output="the sum", agent=agent)
    return Crew(agents=[agent], tasks=[task], process=Process.sequential, verbose=False)


def research_crew(llm_researcher, llm_writer=None) -> Crew:
    researcher = Agent(role="researcher", goal="find facts", backstory="You look things up.",
                       llm=llm_researcher, tools=[lookup], max_iter=3, verbose=False)
    writer = Agent(role="writer", goal="write one sentence", backstory="You write.",
                   llm=llm_writer or llm_researcher, max_iter=2, verbose=False)
    find = Task(description="Find the population of Paris.", expected_output="a number",
                agent=researcher)
    write = Task(description="Write one sentence about the population of Paris.",
                 expected_output="one sentence", agent=writer, context=[find])
    return Crew(agents=[researcher, writer], tasks=[find, write], process=Process.sequential,
                verbose=False)


CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def expert(messages: list[dict], tools: list[dict] | None) -> str:
    """What a perfect agent replies to each prompt of the crews above."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    last = messages[-1]
    if last["role"] == "tool":
        if last["content"].startswith("Error"):
            return "Sorry, the tool failed."
        if "researcher" in system:
            return f"Paris has {last['content']} people."
        return f"The answer is {last['content']}."
    if "writer" in system:
        found = re.search(r"\d{5,}", " ".join(m["content"] or "" for m in messages))
        return f"Paris is home to {found.group(0) if found else 'many'} people."
    if "researcher" in system:
        return CALL.format(name="lookup", args='{"city": "Paris"}')
    if "calculator" in system:
        return CALL.format(name="add", args='{"a": 2, "b": 3}')
    return "I do not know."


def crew_examples(tokenizer, store_path) -> list:
    """(messages, tools, reply) for every prompt the crews above send, exactly as CrewAI builds
    them: recorded by running the crews through ForgeLLM on the scripted expert."""
    import forge_bridge as fb
    from forge_bridge.adapters.crewai import ForgeLLM
    from forge_bridge.policies.scripted import ScriptedPolicy

    policy = ScriptedPolicy(expert, tokenizer)
    recorder = fb.Recorder(store_path, run_id="crew-demos")
    for crew in (calculator_crew(ForgeLLM(policy)),
                 calculator_crew(ForgeLLM(policy), tools=[broken_add]),
                 research_crew(ForgeLLM(policy))):
        with fb.episode(recorder=recorder):
            crew.kickoff()
    return [(t.observation.messages, t.observation.tools, expert(t.observation.messages, t.observation.tools))
            for traj in recorder.store.iter(run_id="crew-demos") for t in traj]
