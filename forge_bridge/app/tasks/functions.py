"""A generated function-calling suite: a few hundred functions of varied schemas, each with
natural-language requests and an exact checker of the call.

Schemas mix strings, integers, numbers, booleans, enums, lists and nested objects, with required
and optional arguments. A request states every argument the call must carry, and no other: an
optional argument the request does not mention must be left out. `check_call` accepts exactly one
call of the right function whose arguments equal the expected ones (JSON values compared exactly;
an integer written as 3.0 is not 3). `split_by_function` splits by function, so no held-out
function appears in training: what transfers is calling *a* tool correctly, not one tool.

Everything is drawn from a seeded `random.Random`, so a suite is the same on every machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Sequence

from forge_bridge.core.errors import InvalidArgument

VERBS = ("create", "update", "find", "cancel", "schedule", "book", "send", "archive", "rate",
         "register", "estimate", "convert")
NOUNS = ("invoice", "meeting", "flight", "order", "ticket", "reminder", "shipment", "reservation",
         "playlist", "profile", "subscription", "report", "delivery", "appointment", "workout",
         "recipe", "loan", "lease", "donation", "survey", "backup", "alert", "refund", "course",
         "vehicle", "parcel", "budget", "review", "campaign", "inventory")
WORDS = ("amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo",
         "juniper", "kestrel", "lumen", "meadow", "nimbus", "onyx", "pepper", "quartz", "raven",
         "saffron", "tundra", "umber", "violet", "willow", "yonder", "zephyr")
CITIES = ("Oslo", "Lima", "Kyoto", "Accra", "Quito", "Perth", "Tunis", "Hanoi", "Bergen", "Cusco",
          "Dakar", "Turin", "Leeds", "Porto", "Riga", "Split")
ENUMS = {"priority": ("low", "medium", "high"), "unit": ("celsius", "fahrenheit"),
         "currency": ("USD", "EUR", "JPY", "GBP"), "channel": ("email", "sms", "push"),
         "size": ("small", "medium", "large"), "format": ("pdf", "csv", "json"),
         "status": ("draft", "active", "closed"), "day": ("monday", "wednesday", "friday")}
STRINGS = {"title": "the title", "name": "the name", "note": "the note", "code": "the code",
           "owner": "the owner", "label": "the label"}
INTEGERS = {"quantity": ("a quantity of", 1, 50), "year": ("the year", 2020, 2035),
            "seats": ("seats for", 1, 9), "duration_minutes": ("a duration of", 5, 240),
            "count": ("a count of", 1, 99)}
NUMBERS = {"amount": ("an amount of", 5, 900), "weight_kg": ("a weight in kg of", 1, 60),
           "rating": ("a rating of", 1, 5)}
BOOLEANS = {"urgent": ("mark it urgent", "do not mark it urgent"),
            "notify": ("notify me", "do not notify me"),
            "public": ("make it public", "keep it private")}


@dataclass(frozen=True)
class FunctionTask:
    """One request for one function, with the exact call that answers it."""

    id: str
    """'<function name>-<k>'."""
    tool: dict
    """The function's OpenAI tool schema."""
    request: str
    """What the user asks, naming every argument value the call must carry."""
    expected: dict
    """The exact arguments of the one correct call."""

    @property
    def function(self) -> str:
        return self.tool["function"]["name"]


def _schema(kind: str, name: str) -> dict:
    """The JSON schema of one parameter."""
    if kind == "string":
        return {"type": "string", "description": STRINGS[name].capitalize() + "."}
    if kind == "integer":
        return {"type": "integer", "description": INTEGERS[name][0].capitalize() + "."}
    if kind == "number":
        return {"type": "number", "description": NUMBERS[name][0].capitalize() + "."}
    if kind == "boolean":
        return {"type": "boolean", "description": f"Whether to {BOOLEANS[name][0]}."}
    if kind == "enum":
        return {"type": "string", "enum": list(ENUMS[name]), "description": f"The {name}."}
    if kind == "list":
        return {"type": "array", "items": {"type": "string"}, "description": "Tags to attach."}
    return {"type": "object", "description": "Where it goes.",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}, "required": ["city", "zip"]}


def _value(kind: str, name: str, rng: random.Random) -> tuple[Any, str]:
    """(a value, the request's phrase for it)."""
    v: Any
    if kind == "string":
        v = f"{rng.choice(WORDS)}-{rng.randint(10, 99)}"
        return v, f"{STRINGS[name]} '{v}'"
    if kind == "integer":
        desc, lo, hi = INTEGERS[name]
        v = rng.randint(lo, hi)
        return v, f"{desc} {v}"
    if kind == "number":
        desc, lo, hi = NUMBERS[name]
        v = round(rng.uniform(lo, hi), 1)
        return v, f"{desc} {v}"
    if kind == "boolean":
        v = rng.random() < 0.5
        return v, BOOLEANS[name][0 if v else 1]
    if kind == "enum":
        v = rng.choice(ENUMS[name])
        return v, f"{name} {v}"
    if kind == "list":
        v = rng.sample(WORDS, rng.randint(1, 3))
        return v, "the tags " + ", ".join(f"'{t}'" for t in v)
    v = {"city": rng.choice(CITIES), "zip": str(rng.randint(10000, 99999))}
    return v, f"the address {v['city']}, zip {v['zip']}"


_POOLS = [("string", n) for n in STRINGS] + [("integer", n) for n in INTEGERS] + \
         [("number", n) for n in NUMBERS] + [("boolean", n) for n in BOOLEANS] + \
         [("enum", n) for n in ENUMS] + [("list", "tags"), ("object", "address")]


def generate_suite(n_functions: int = 300, requests_per_function: int = 2, seed: int = 0) -> list[FunctionTask]:
    """`n_functions` distinct functions (verb_noun names), each with 2-5 parameters of mixed kinds
    (at least one required, at least one optional), and `requests_per_function` requests each."""
    names = [f"{v}_{n}" for v in VERBS for n in NOUNS]
    if not 1 <= n_functions <= len(names):
        raise InvalidArgument(f"n_functions: expected 1..{len(names)}, got {n_functions}")
    rng = random.Random(seed)
    rng.shuffle(names)
    tasks = []
    for name in names[:n_functions]:
        verb, noun = name.split("_", 1)
        params = rng.sample(_POOLS, rng.randint(2, 5))
        n_required = rng.randint(1, len(params) - 1) if len(params) > 1 else 1
        required = [p[1] for p in params[:n_required]]
        properties = {pname: _schema(kind, pname) for kind, pname in params}
        tool = {"type": "function", "function": {
            "name": name, "description": f"{verb.capitalize()} a {noun}.",
            "parameters": {"type": "object", "properties": properties, "required": required}}}
        for k in range(requests_per_function):
            args, phrases = {}, []
            for kind, pname in params:
                if pname in required or rng.random() < 0.5:
                    value, phrase = _value(kind, pname, rng)
                    args[pname] = value
                    phrases.append(phrase)
            rng.shuffle(phrases)
            request = f"Please {verb} a {noun} with " + "; ".join(phrases) + "."
            tasks.append(FunctionTask(f"{name}-{k}", tool, request, args))
    return tasks


def split_by_function(tasks: Sequence[FunctionTask], validation: float = 0.15, held_out: float = 0.25,
                      seed: int = 0) -> tuple[list[FunctionTask], list[FunctionTask], list[FunctionTask]]:
    """(train, validation, held-out) with every function's requests in one split only."""
    functions = sorted({t.function for t in tasks})
    random.Random(seed).shuffle(functions)
    n_held, n_val = round(len(functions) * held_out), round(len(functions) * validation)
    held = set(functions[:n_held])
    val = set(functions[n_held:n_held + n_val])
    return ([t for t in tasks if t.function not in held | val], [t for t in tasks if t.function in val],
            [t for t in tasks if t.function in held])


def check_call(task: FunctionTask, tool_calls: Sequence[Any]) -> bool:
    """Exactly one call, to the task's function, with exactly the expected arguments (`tool_calls`:
    `ToolCall`s or OpenAI-format dicts; arguments as a JSON string or a dict)."""
    args = _arguments_of_the_one_call(task, tool_calls)
    return args is not None and _same(args, task.expected)


def score_call(task: FunctionTask, tool_calls: Sequence[Any]) -> float:
    """Partial credit in [0, 1]: 0 unless exactly one call of the task's function with a JSON object
    of arguments; then the share of argument names, over those expected or given, that the call
    got exactly right (a missing, an extra and a wrong argument each cost one). 1.0 exactly when
    `check_call` passes."""
    args = _arguments_of_the_one_call(task, tool_calls)
    if not isinstance(args, dict):
        return 0.0
    names = set(args) | set(task.expected)
    if not names:  # no arguments expected and none given: the exact call
        return 1.0
    right = sum(1 for k in names if k in args and k in task.expected and _same(args[k], task.expected[k]))
    return right / len(names)


def argument_verdicts(task: FunctionTask, tool_calls: Sequence[Any]) -> tuple[dict[str, bool], bool] | None:
    """Per argument the one call of the task's function wrote: whether it is exactly the expected
    one (False for a wrong value and for an argument not asked for); and whether an expected
    argument is missing. None unless `score_call` could score the call (one call of the task's
    function with a JSON object of arguments)."""
    args = _arguments_of_the_one_call(task, tool_calls)
    if not isinstance(args, dict):
        return None
    verdicts = {k: k in task.expected and _same(v, task.expected[k]) for k, v in args.items()}
    return verdicts, bool(set(task.expected) - set(args))


def argument_choices(task: FunctionTask, tool_calls: Sequence[Any]) -> tuple[int, int, int, int] | None:
    """Which of the function's parameters the one call wrote, against which the request names:
    (asked and written, asked, not asked and written, not asked), values aside. A call that reads
    the request writes the first near the second and the third near 0. None unless `score_call`
    could score the call."""
    args = _arguments_of_the_one_call(task, tool_calls)
    if not isinstance(args, dict):
        return None
    params = task.tool["function"]["parameters"]["properties"]
    asked = [p for p in params if p in task.expected]
    other = [p for p in params if p not in task.expected]
    return sum(p in args for p in asked), len(asked), sum(p in args for p in other), len(other)


CALL_ERRORS = ("pass", "extra argument", "missing argument", "other key set", "wrong value", "malformed")
"""What `call_error` names, in the order reports print them."""


def call_error(task: FunctionTask, tool_calls: Sequence[Any]) -> str:
    """Why a call fails `check_call` (one of `CALL_ERRORS`): 'malformed' unless there is exactly one
    call of the task's function with a JSON object of arguments; then 'extra argument' or
    'missing argument' when the argument names are a strict superset or subset of those expected,
    'other key set' when both, 'wrong value' when the names are right; 'pass' when it passes."""
    args = _arguments_of_the_one_call(task, tool_calls)
    if not isinstance(args, dict):
        return "malformed"
    extra, missing = set(args) - set(task.expected), set(task.expected) - set(args)
    if extra and missing:
        return "other key set"
    if extra or missing:
        return "extra argument" if extra else "missing argument"
    return "pass" if _same(args, task.expected) else "wrong value"


def _arguments_of_the_one_call(task: FunctionTask, tool_calls: Sequence[Any]) -> Any:
    """The parsed arguments when there is exactly one call and it names the task's function; else None."""
    if len(tool_calls) != 1:
        return None
    call = tool_calls[0]
    if isinstance(call, dict):
        fn = call.get("function", call)
        name, arguments = fn.get("name"), fn.get("arguments", fn.get("args"))
    else:
        name, arguments = call.name, call.arguments
    if name != task.function:
        return None
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return None


def _same(a: Any, b: Any) -> bool:
    """JSON equality where the types must match too (True is not 1, 3.0 is not 3)."""
    if type(a) is not type(b):
        return isinstance(a, (int, float)) and isinstance(b, float) and not isinstance(a, bool) and a == b
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def expert_call(task: FunctionTask) -> str:
    """The correct call as the model writes it (Hermes format)."""
    return ("<tool_call>\n" + json.dumps({"name": task.function, "arguments": task.expected})
            + "\n</tool_call>")


__all__ = ["CALL_ERRORS", "FunctionTask", "argument_choices", "argument_verdicts", "call_error", "check_call",
           "expert_call", "generate_suite", "score_call", "split_by_function"]
