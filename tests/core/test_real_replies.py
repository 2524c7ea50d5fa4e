"""The parser on real models' own replies: every reply each model available here wrote, greedy,
through a LangChain agent on public BFCL requests (`bench/real_models.py --fixtures`), with the
calls each reply holds read independently and loosely (`held`: any JSON object naming the offered
function anywhere in the reply, else a Python call of it; `held_in`: where, 'prose' for a call in
prose or in a code sample, which must stay text)."""

import json
from pathlib import Path

import pytest

from forge_bridge.policies.toolcalls import parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replies"
REPLIES = [(path.stem, json.loads(line)) for path in sorted(FIXTURES.glob("*.jsonl"))
           for line in path.read_text().splitlines() if line.strip()]


KNOWN = {
    ("qwen2.5-coder-0.5b-instruct", "simple_python_243"): "echoes its prompt's <tools> block, then writes the call "
                                                          "inside another <tools> tag: text",
    ("qwen2.5-coder-0.5b-instruct", "simple_python_248"): "echoes its prompt's <tools> block, then writes a bare "
                                                          "call after it: text",
    ("qwen2.5-coder-1.5b-instruct", "irrelevance_200"): "writes the call in doubled braces {{...}}: a malformed call",
}
"""The replies that hold a call the parser does not read (docs/real-models.md), and what it makes of them."""


def test_every_model_has_replies():
    assert {model for model, _ in REPLIES} == {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct",
                                              "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"}
    assert len(REPLIES) == 4 * 130


@pytest.mark.parametrize("model, record", REPLIES, ids=[f"{m}-{r['id']}" for m, r in REPLIES])
def test_a_reply_is_read_as_the_calls_it_holds(model, record):
    action = parse(record["reply"], record["finish_reason"], tools=record["tools"])
    got = [[c.name, json.loads(c.arguments)] for c in action.tool_calls]
    if (model, record["id"]) in KNOWN:
        assert got == [] and action.malformed == ("malformed" in KNOWN[model, record["id"]])
    elif record["held_in"] in ("", "prose"):
        assert got == [], "a reply that holds no call (or only one in prose) became a call"
    else:
        assert got == record["held"], f"read {got} from a reply holding {record['held']}"
