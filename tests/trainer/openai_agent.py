"""A plain agent written without forge-bridge: the OpenAI SDK, two tools, the task as a JSON
argument, the reward printed as a JSON line. forge-bridge trains it through the gateway
(OPENAI_BASE_URL is set per rollout)."""

import json
import subprocess
import sys
import time

from openai import OpenAI


def tool(name: str, doc: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": doc, "parameters": {
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
        "type": "object"}}}


TOOLS = [tool("add", "Add two integers."), tool("multiply", "Multiply two integers.")]


def main() -> None:
    task = json.loads(sys.argv[1])
    if task.get("hang"):  # a stuck agent with a child of its own: both must be killed
        child = subprocess.Popen(["sleep", "3600"])
        with open(task["pid_file"], "w") as f:
            f.write(f"{child.pid}\n")
        time.sleep(3600)
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    messages = [{"role": "user", "content": task["question"]}]
    answer = ""
    for _ in range(4):
        reply = client.chat.completions.create(model="forge", messages=messages, tools=TOOLS,
                                               temperature=1.0, max_tokens=48)
        message = reply.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            break
        messages.append({"role": "assistant", "content": answer, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls]})
        for c in message.tool_calls:
            try:  # a tool's error goes back to the model, as agents do
                args = json.loads(c.function.arguments)
                value = args["a"] + args["b"] if c.function.name == "add" else args["a"] * args["b"]
            except (ValueError, KeyError, TypeError) as exc:
                value = f"Error: {type(exc).__name__}: {exc}"
            messages.append({"role": "tool", "tool_call_id": c.id, "name": c.function.name, "content": str(value)})
    # the answer must be 5 and backed by a tool that returned it: on the 2026-12-03 CI machine, a
    # reward for "5" alone was learned as "call multiply, see 6, say 5"
    backed = any(m["role"] == "tool" and m["content"] == "5" for m in messages)
    print(json.dumps({"reward": 1.0 if "5" in answer and backed else 0.0}))


if __name__ == "__main__":
    main()
