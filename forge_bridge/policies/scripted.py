"""A policy that answers from a script instead of a model, with real token ids.

Demonstrations for a warm start are recorded by running the ordinary agent with this policy:
the script decides the reply text (an expert that knows the answer), and the target model's
tokenizer turns prompt and reply into the token ids the trainer learns from, exactly as the
model itself would have to produce them. Logprobs are recorded as 0 (the script is certain).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

from forge_bridge.core.errors import InvalidArgument, Unsupported
from forge_bridge.policies.base import Policy, PolicyOutput, Sampling
from forge_bridge.policies.messages import normalize_messages, prompt_ids
from forge_bridge.policies.toolcalls import formats, parse, render_calls

Step = Union[str, Mapping[str, Any], Sequence[Mapping[str, Any]]]
"""One scripted reply: its text (a final answer), a tool call `{"tool": name, "args": {...}}`,
or a list of tool calls made at once."""

Script = Callable[[list[dict], "list[dict] | None"], "str | Step"]
"""(messages, tools) -> the assistant's reply: text with tool calls written in the policy's
format, or a `Step`."""


def as_calls(step: Step) -> tuple[str, list[tuple[str, dict]]]:
    """A step's (content, [(tool name, arguments)]); a malformed step is a clear error."""
    if isinstance(step, str):
        return step, []
    calls = [step] if isinstance(step, Mapping) else list(step)
    out = []
    for call in calls:
        if not (isinstance(call, Mapping) and isinstance(call.get("tool"), str)
                and isinstance(call.get("args", {}), Mapping)):
            raise InvalidArgument(f"a scripted step must be text, {{'tool': name, 'args': {{...}}}} or a list of "
                                  f"those, got {call!r}")
        out.append((call["tool"], dict(call.get("args", {}))))
    return "", out


def check_tools(calls: list[tuple[str, dict]], tools: list[dict] | None) -> None:
    """Refuse a scripted call of a tool the agent was not given: the demonstration would teach
    the model to call something that does not exist."""
    names = [t.get("function", t).get("name") for t in tools or []]
    for name, _ in calls:
        if name not in names:
            raise InvalidArgument(f"the demonstration calls the tool {name!r}, which the agent does not have "
                                  f"(its tools: {', '.join(map(str, names)) or 'none'}); fix the task's demo plan "
                                  "or give the agent that tool")


def rendered(tokenizer: Any, tool_format: str, messages: list[dict], tools: list[dict] | None, content: str,
             calls: list[tuple[str, Any]], max_tokens: int, version: str | None, info: dict,
             cut: bool = False) -> PolicyOutput:
    """A reply written by someone else (a script, an upstream model) as the model of `tokenizer`
    would have produced it: the prompt in its chat template, the content and calls in its
    tool-call format, then its end-of-turn token (cut at `max_tokens`, as a model hitting the
    limit is; `cut`: the writer hit its own limit there, so no end-of-turn token either).
    Normalized `messages` in; the output's log-probabilities are 0 (not sampled)."""
    prompt = prompt_ids(tokenizer, messages, tools)
    text = render_calls(content, calls, tool_format)
    ids = tokenizer.encode(text, add_special_tokens=False)
    ended = len(ids) < max_tokens and not cut  # room for the end-of-turn token too
    ids = ids if ended else ids[:max_tokens]  # cut as a model hitting max_tokens is
    completion = ids + [tokenizer.eos_token_id] if ended else ids
    reply = text if ended else tokenizer.decode(ids, skip_special_tokens=False)  # specials such as [TOOL_CALLS] kept
    return PolicyOutput(action=parse(reply, "stop" if ended else "length", tool_format, tools or []),
                        prompt_token_ids=prompt, completion_token_ids=completion,
                        completion_logprobs=[0.0] * len(completion), version=version, info=info)


class ScriptedPolicy(Policy):
    behaviour = None
    """Whose steps it records: a script's replies stand for whoever the episode says they are
    (a demonstration, a teacher's guide, an upstream model's in a test)."""

    def __init__(self, script: Script, tokenizer: Any, tool_format: str = "auto") -> None:
        """`tool_format`: the format the script writes tool calls in (one of `toolcalls.FORMATS`;
        'auto': the one the target model's chat template teaches)."""
        super().__init__()
        self.script = script
        self.tokenizer = tokenizer
        self.tool_format = formats(tool_format, getattr(tokenizer, "chat_template", None))[0]
        self.problems: list[str] = []
        """Why scripted replies were refused (a tool the agent lacks, a plan too short): each
        also raised inside the agent, where a framework may have caught it."""

    @classmethod
    def replay(cls, plans: Mapping[str, Sequence[Step]], tokenizer: Any, tool_format: str = "auto") -> "ScriptedPolicy":
        """A policy that answers the k-th model call of an episode on task T with `plans[T][k]`
        (the task id of the episode it is called in): a scripted tool-call sequence per task."""
        from forge_bridge.core.episode import current_episode

        calls: dict[str, int] = {}
        lock = threading.Lock()

        def script(messages: list[dict], tools: list[dict] | None) -> Step:
            ep = current_episode()
            if ep is None:
                raise InvalidArgument("a replayed plan answers inside an episode (fb.episode, or the trainer's)")
            task = ep.trajectory.task_id
            if task is None or task not in plans:
                raise InvalidArgument(f"no demonstration plan for the task {task!r} (plans: {', '.join(sorted(plans))})")
            with lock:
                k = calls[ep.id] = calls.get(ep.id, -1) + 1
            if k >= len(plans[task]):
                raise InvalidArgument(f"the demonstration plan of task {task!r} has {len(plans[task])} steps, but "
                                      f"the agent asked for model call {k + 1}; end the plan with the final answer")
            return plans[task][k]

        return cls(script, tokenizer, tool_format)

    def generate(self, messages, tools, sampling: Sampling, adapter) -> PolicyOutput:
        messages = normalize_messages(messages)
        try:
            step = self.script(messages, tools)
            content, calls = as_calls(step)
            check_tools(calls, tools if calls else None)
        except InvalidArgument as exc:
            self.problems.append(str(exc))
            raise
        return rendered(self.tokenizer, self.tool_format, messages, tools, content, calls, sampling.max_tokens,
                        adapter, {"scripted": True})

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def load_version(self, path: Path, version: str) -> None:
        raise Unsupported("a scripted policy has no weights to adapt")

    def unload_version(self, version: str) -> None:
        pass
