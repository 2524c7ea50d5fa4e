"""A small suite of tasks that need tools, with pass/fail answers.

- `multiply`: "What is 4821 times 37?" -- one call to the calculator, then the exact product;
- `lookup`: "What is the population of Varenna?" -- one call to a lookup over a local table;
- `lookup_multiply`: "What is 3 times the population of Varenna?" -- look the value up, then
  compute with it: two tool calls in sequence, where per-step credit matters.
- `lookup_add` (not in the demo's default suite; `bench/credit.py` uses it): "What is the
  combined population of Varenna and Kelmor?" -- two lookups, then `add`: three tool calls.
- `BRIDGE_KINDS`, demonstrated only, never evaluated (`bridge_tasks`): two calls each, to find
  out which piece of `lookup_multiply` a warm start must have seen before pass/fail RL can
  find the rest (docs/experiments/demo.md). `multiply_chain`, "What is 4821 times 37 times 5?"
  (the second multiply on the first's result); `lookup_max`, "Which is larger, the population of
  Sallow or of Juniper Bay?" (two lookups); `lookup_and_multiply`, "What is the population of
  Lindmoor, and what is 7968 times 22?" (a lookup, then a multiply on the question's numbers:
  two tools, but never a lookup's result as an argument).

The cities are made up, so the answers cannot be recalled, only looked up. Splits are drawn
from a fixed seed: the evaluation tasks use numbers and cities the training tasks do not, and
`held_out_tasks` uses cities that neither the training nor the validation tasks name.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from forge_bridge.core.errors import InvalidArgument

CITIES = {
    "Varenna": 48213, "Ostrava Nova": 91577, "Kelmor": 23904, "Brightwater": 67120,
    "Dunmere": 15388, "Sallow": 80245, "Tarvin": 39761, "Quillon": 56032,
    "Marrowby": 72819, "Elston": 30457, "Fenwick": 44690, "Greyhaven": 98134,
    "Holloway": 26578, "Isenford": 61093, "Juniper Bay": 35246, "Kestrel": 77402,
    "Lindmoor": 19865, "Northam": 52731, "Oakridge": 84310, "Pellham": 41127,
    # added for `held_out_tasks` after the demo's settings were chosen on the validation split
    "Corvale": 58342, "Dravenport": 27691, "Emberlyn": 83156, "Falkridge": 46273,
    "Glenmarsh": 64918, "Harrowgate": 31584, "Wexley": 72047,
}
SPLIT_CITIES = tuple(CITIES)[:20]
"""The cities `make_splits` divides into training (14) and validation (6) cities."""
HELD_OUT_CITIES = tuple(CITIES)[20:]
"""The cities of `held_out_tasks` only: no training or validation question names them."""
KINDS = ("multiply", "lookup", "lookup_multiply")
"""The demo's kinds."""
KINDS_ORDER = KINDS
ALL_KINDS = KINDS + ("lookup_add",)
"""Every kind the suite can make."""
BRIDGE_KINDS = ("multiply_chain", "lookup_max", "lookup_and_multiply")
"""Kinds of two calls each, for demonstrations only (`bridge_tasks`; the module docstring)."""
MULTI_STEP_KINDS = ("lookup_multiply", "lookup_add")
"""The kinds that need more than one tool call in sequence."""


@dataclass(frozen=True)
class Task:
    """One question with its exact answer."""

    id: str
    """Stable identifier, e.g. 'multiply-3'."""
    kind: str
    """One of KINDS; the demo reports each kind as its own row."""
    question: str
    """What the user asks the agent."""
    answer: int
    """The exact number a correct final answer contains."""


def tool_schemas(with_add: bool = False) -> list[dict]:
    """The tools' OpenAI schemas (what the agent's `@tool` functions produce)."""
    add = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                             "parameters": {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                            "required": ["a", "b"], "type": "object"}}}]
    return (add if with_add else []) + [
        {"type": "function", "function": {"name": "multiply", "description": "Multiply two integers.",
                                          "parameters": {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                         "required": ["a", "b"], "type": "object"}}},
        {"type": "function", "function": {"name": "lookup", "description": "Population of a city.",
                                          "parameters": {"properties": {"city": {"type": "string"}},
                                                         "required": ["city"], "type": "object"}}},
    ]


def _tasks(kind: str, rng: random.Random, cities: list[str], n: int, start: int) -> list[Task]:
    out = []
    for i in range(n):
        if kind == "multiply":
            a, b = rng.randint(100, 9999), rng.randint(11, 99)
            out.append(Task(f"multiply-{start + i}", kind, f"What is {a} times {b}?", a * b))
        elif kind == "multiply_chain":
            a, b, c = rng.randint(100, 9999), rng.randint(11, 99), rng.randint(2, 9)
            out.append(Task(f"{kind}-{start + i}", kind, f"What is {a} times {b} times {c}?", a * b * c))
        elif kind == "lookup":
            city = cities[i % len(cities)]
            out.append(Task(f"lookup-{start + i}", kind, f"What is the population of {city}?", CITIES[city]))
        elif kind == "lookup_max":
            first, second = rng.sample(cities, 2)
            out.append(Task(f"{kind}-{start + i}", kind,
                            f"Which is larger, the population of {first} or of {second}?",
                            max(CITIES[first], CITIES[second])))
        elif kind == "lookup_and_multiply":
            city, a, b = rng.choice(cities), rng.randint(100, 9999), rng.randint(11, 99)
            out.append(Task(f"{kind}-{start + i}", kind,
                            f"What is the population of {city}, and what is {a} times {b}?", a * b))
        elif kind == "lookup_multiply":
            city, k = cities[(i * 3 + 1) % len(cities)], rng.randint(2, 9)
            out.append(Task(f"lookup_multiply-{start + i}", kind,
                            f"What is {k} times the population of {city}?", k * CITIES[city]))
        elif kind == "lookup_add":
            first, second = rng.sample(cities, 2)
            out.append(Task(f"lookup_add-{start + i}", kind,
                            f"What is the combined population of {first} and {second}?",
                            CITIES[first] + CITIES[second]))
        else:
            raise InvalidArgument(f"unknown task kind {kind!r}; expected one of {ALL_KINDS + BRIDGE_KINDS}")
    return out


def _split_cities(rng: random.Random) -> tuple[list[str], list[str]]:
    names = sorted(SPLIT_CITIES)
    rng.shuffle(names)
    return names[:14], names[14:]


def training_cities(seed: int = 0) -> list[str]:
    """The cities `make_splits(seed=seed)` uses in its training questions."""
    return _split_cities(random.Random(seed))[0]


def make_splits(train_per_kind: int = 24, eval_per_kind: int = 10, seed: int = 0,
                kinds: tuple[str, ...] = KINDS) -> tuple[list[Task], list[Task]]:
    """(train, evaluation) task lists; evaluation cities never appear in training questions. The
    demo chose its settings on this evaluation split, so it calls it validation and reports
    `held_out_tasks`; `bench/credit.py` reports it as its held-out split (docs/experiments/credit.md says
    which of its choices followed a first run on it)."""
    rng = random.Random(seed)
    train_cities, eval_cities = _split_cities(rng)
    train, held_out = [], []
    for kind in kinds:
        train += _tasks(kind, rng, train_cities, train_per_kind, 0)
        held_out += _tasks(kind, rng, eval_cities, eval_per_kind, 1000)
    return train, held_out


def held_out_tasks(per_kind: int = 10, seed: int = 0, kinds: tuple[str, ...] = KINDS) -> list[Task]:
    """Tasks on `HELD_OUT_CITIES` (with numbers from their own stream), never used to choose a
    setting: the demo's held-out split, reported once per run."""
    rng = random.Random(f"held-out-{seed}")
    cities = list(HELD_OUT_CITIES)
    return [t for kind in kinds for t in _tasks(kind, rng, cities, per_kind, 2000)]


def bridge_tasks(kind: str, n: int = 24, seed: int = 0) -> list[Task]:
    """Tasks of one of `BRIDGE_KINDS` on the training cities of `make_splits(seed=seed)`, from
    their own random stream, so adding them to a run's demonstrations leaves `make_splits` and
    `held_out_tasks` exactly as they were."""
    if kind not in BRIDGE_KINDS:
        raise InvalidArgument(f"bridge_tasks: unknown kind {kind!r}; expected one of {BRIDGE_KINDS}")
    return _tasks(kind, random.Random(f"{kind}-{seed}"), training_cities(seed), n, 0)


def check_answer(task: Task, final_text: str) -> bool:
    """Pass when the final answer states the exact number (thousands separators allowed)."""
    numbers = re.findall(r"\d[\d,]*", final_text or "")
    return any(int(n.replace(",", "")) == task.answer for n in numbers if n.replace(",", "").isdigit())


def _call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


def _answer(m: re.Match, results: list[str]) -> str:
    return f"The answer is {results[-1]}."


# question pattern -> the expert's calls in order (each from the match and the results so far),
# then its final answer
_EXPERT = [
    (r"What is (\d+) times (\d+) times (\d+)\?",
     [lambda m, r: ("multiply", {"a": int(m[1]), "b": int(m[2])}),
      lambda m, r: ("multiply", {"a": int(r[0]), "b": int(m[3])})], _answer),
    (r"Which is larger, the population of (.+) or of (.+)\?",
     [lambda m, r: ("lookup", {"city": m[1]}), lambda m, r: ("lookup", {"city": m[2]})],
     lambda m, r: f"The answer is {max(int(x) for x in r)}."),
    (r"What is the population of (.+), and what is (\d+) times (\d+)\?",
     [lambda m, r: ("lookup", {"city": m[1]}), lambda m, r: ("multiply", {"a": int(m[2]), "b": int(m[3])})],
     lambda m, r: f"The population is {r[0]}, and the product is {r[1]}."),
    (r"What is (\d+) times (\d+)\?", [lambda m, r: ("multiply", {"a": int(m[1]), "b": int(m[2])})], _answer),
    (r"What is the population of (.+)\?", [lambda m, r: ("lookup", {"city": m[1]})], _answer),
    (r"What is (\d+) times the population of (.+)\?",
     [lambda m, r: ("lookup", {"city": m[2]}), lambda m, r: ("multiply", {"a": int(r[0]), "b": int(m[1])})], _answer),
    (r"What is the combined population of (.+) and (.+)\?",
     [lambda m, r: ("lookup", {"city": m[1]}), lambda m, r: ("lookup", {"city": m[2]}),
      lambda m, r: ("add", {"a": int(r[0]), "b": int(r[1])})], _answer),
]


def expert_reply(messages: list[dict], tools: list[dict] | None) -> str:
    """What a perfect agent says next (the scripted expert behind the demonstrations)."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    results = [m["content"] for m in messages if m["role"] == "tool"]
    for pattern, calls, answer in _EXPERT:
        m = re.match(pattern, question)
        if m:
            try:
                return _call(*calls[len(results)](m, results)) if len(results) < len(calls) else answer(m, results)
            except ValueError:  # a result it cannot compute with, e.g. "unknown city: X"
                return "I cannot answer that."
    return "I cannot answer that."
