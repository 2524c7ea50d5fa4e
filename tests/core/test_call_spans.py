"""Per-argument spans of a Hermes call, in characters and in tokens, and the span rewards they carry."""

import pytest

import forge_bridge as fb
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Action, Observation, Transition
from forge_bridge.policies.call_spans import (
    argument_char_spans,
    argument_token_spans,
    reward_arguments,
    reward_decisions,
    token_ends,
)
from forge_bridge.policies.toolcalls import parse

CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": "x"}}\n</tool_call>'


class PieceTokenizer:
    """A tokenizer whose token k is the string pieces[k]."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, **kwargs):
        return "".join(self.pieces[i] for i in ids)


def test_each_argument_span_runs_from_the_end_of_the_previous_value_through_its_own():
    spans = argument_char_spans(CALL)
    assert {k: CALL[a:b] for k, (a, b) in spans.arguments.items()} == {"a": '"a": 1', "b": ', "b": "x"'}
    assert CALL[slice(*spans.close)] == "}"
    spaced = '<tool_call> {"name":"f","arguments": { "a" : [1, {"c": "}"}] ,"b":null } }</tool_call>'
    spans = argument_char_spans(spaced)
    assert {k: spaced[a:b] for k, (a, b) in spans.arguments.items()} == {
        "a": ' "a" : [1, {"c": "}"}]', "b": ' ,"b":null'}
    assert spaced[slice(*spans.close)] == " }"
    empty = '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
    spans = argument_char_spans(empty)
    assert spans.arguments == {} and empty[slice(*spans.close)] == "}"


@pytest.mark.parametrize("text", ["no call here", '<tool_call>{"name": "f", "arguments": {"a": 1,',
                                  '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
                                  '<tool_call>{"name": "f"}</tool_call>', '<tool_call>{"name": "f", "arguments": {"a" 1}}'])
def test_no_spans_without_a_well_formed_call(text):
    assert argument_char_spans(text) is None


def test_the_spans_are_those_of_the_call_the_parser_reads():
    # a draft call inside the reasoning block, and a first block that is not valid JSON, are skipped
    text = ('<think><tool_call>{"name": "f", "arguments": {"z": 0}}</tool_call></think>'
            '<tool_call>{"name": "f", "arguments": {"y": 1}}}</tool_call>' + CALL)
    assert parse(text, "stop").tool_calls[0].arguments == '{"a": 1, "b": "x"}'
    spans = argument_char_spans(text)
    assert {k: text[a:b] for k, (a, b) in spans.arguments.items()} == {"a": '"a": 1', "b": ', "b": "x"'}
    # a repeated key: json keeps the last; 'arguments' wins over 'parameters'
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}, "parameters": {"p": 0}, "arguments": {"b": 2}}</tool_call>'
    assert list(argument_char_spans(text).arguments) == ["b"]


def test_a_token_is_in_every_span_it_writes_a_character_of():
    pieces = ['<tool_call>{"name": "f", "arguments": {', '"a', '":', ' 1', ',', ' "b', '":', ' "x', '",',
              ' "c', '": 2', '}}', '</tool_call>']
    tok = PieceTokenizer(pieces)
    spans = argument_token_spans(tok, list(range(len(pieces))))
    # "a": tokens 1-3; "b": 4-8 (`",` ends "x" and starts c: in both); "c": 8-10; close: `}}`
    assert spans.arguments == {"a": (1, 4), "b": (4, 9), "c": (8, 11)} and spans.close == (11, 12)
    assert argument_token_spans(tok, [0, 1, 2]) is None
    # a value that is only punctuation keeps its tokens, and an empty token belongs to no span
    pieces = ['<tool_call>{"name": "f", "arguments": {', '"a": ', '[]', '', ', "b": ""', '}}', '</tool_call>']
    spans = argument_token_spans(PieceTokenizer(pieces), list(range(len(pieces))))
    assert spans.arguments == {"a": (1, 3), "b": (4, 5)} and spans.close == (5, 6)


def test_span_rewards_are_recorded_validated_stored_and_given_per_argument(tmp_path):
    pieces = ['<tool_call>{"name": "f", "arguments": {', '"a', '":', ' 1', ',', ' "b', '":', ' "x"', '}}',
              '</tool_call>']
    ids = list(range(len(pieces)))
    store = TrajectoryStore(tmp_path / "t.db")
    with fb.episode("t", recorder=fb.Recorder(store, "r")) as ep:
        with pytest.raises(ValueError, match="no step has been recorded"):
            ep.span_reward(1.0, 0, 1)
        ep.record(Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]),
                             action=Action(content=""), prompt_token_ids=[1], completion_token_ids=ids,
                             completion_logprobs=[-0.1] * len(ids)))
        for bad in ((1.0, 3, 3), (1.0, -1, 2), (1.0, 0, 11), (float("nan"), 0, 1), (True, 0, 1), (1.0, False, 1),
                    (1.0, 0, 1, -1, 7), (1.0, 0, 1, 1), (1.0, 0, 1, -2), (1.0, 0, 1, 0.0)):
            with pytest.raises(ValueError, match="span_reward"):
                ep.span_reward(*bad)
        # a step not recorded is an error, not another step (one step here: 1 would have wrapped to 0)
        with pytest.raises(ValueError, match=r"step_reward: step: expected an integer in \[-1, 1\)"):
            ep.step_reward(1.0, step=1)
        # "a" right, "b" a wrong value, and an argument missing: close -1
        assert reward_arguments(ep, PieceTokenizer(pieces), {"a": True, "b": False}, missing=True, step=0) == 3
        # verdicts on other arguments than the text shows: nothing is rewarded
        assert reward_arguments(ep, PieceTokenizer(pieces), {"a": True}, missing=False) == 0
        with pytest.raises(ValueError, match="reward_arguments: no step 1"):
            reward_arguments(ep, PieceTokenizer(pieces), {"a": True}, missing=False, step=1)
    (step,) = store.get(ep.id).transitions
    assert step.info["span_rewards"] == [[1, 4, 1.0, "argument:a"], [4, 8, -1.0, "argument:b"], [8, 9, -1.0, "close"]]
    store.close()


@pytest.mark.parametrize("which", ["embedded", "tiny"])
def test_token_spans_of_real_tokenizations_hold_exactly_their_arguments_text(which):
    # byte-level BPE merges across the JSON punctuation (`",`, `}}`), unlike the piece tokenizers above
    from forge_bridge.policies import models

    tok = models.load_tokenizer() if which == "embedded" else models.tiny_tokenizer()
    calls = [CALL, '<tool_call>\n{"name": "book", "arguments": {"city": "Zürich", "nights": 3, '
                   '"extras": {"breakfast": true, "note": "a } inside"}, "tags": ["x", "y"]}}\n</tool_call>',
             'Let me call it.\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>']
    for call in calls:
        ids = tok.encode(call, add_special_tokens=False)
        text, _ = token_ends(tok, ids)
        chars, tokens = argument_char_spans(text), argument_token_spans(tok, ids)
        assert list(tokens.arguments) == list(chars.arguments)
        for key in chars.arguments:
            (a, b), (s, e) = chars.arguments[key], tokens.arguments[key]
            decoded = tok.decode(ids[s:e])
            # every character of the argument is written by the span's tokens, and its first and
            # last tokens each write one of them (the span is no wider than it must be)
            assert text[a:b] in decoded
            assert text[a:b] not in tok.decode(ids[s + 1:e]) and text[a:b] not in tok.decode(ids[s:e - 1])
        s, e = tokens.close
        assert "}" in tok.decode(ids[s:e]) and e <= len(ids)
        assert [m[0] for m in tokens.members] == [m[0] for m in chars.members] == list(chars.arguments)
        for char_parts, token_parts in zip(chars.members, tokens.members):
            assert [p is None for p in char_parts[1:]] == [p is None for p in token_parts[1:]]
            for (a, b), (s, e) in zip([p for p in char_parts[1:] if p], [p for p in token_parts[1:] if p]):
                # separator, key, value: each in its tokens, and no token more than it needs
                assert text[a:b] in tok.decode(ids[s:e])
                assert text[a:b] not in tok.decode(ids[s + 1:e]) and text[a:b] not in tok.decode(ids[s:e - 1])


def test_each_argument_splits_into_its_separator_key_and_value():
    spans = argument_char_spans(CALL)
    parts = [(name, sep and CALL[slice(*sep)], CALL[slice(*key)], CALL[slice(*value)])
             for name, sep, key, value in spans.members]
    assert parts == [("a", None, '"a":', "1"), ("b", ", ", '"b":', '"x"')]
    spaced = '<tool_call>{"name": "f", "arguments": { "a" : [1, {"c": "}"}] ,"b":null } }</tool_call>'
    parts = [(name, sep and spaced[slice(*sep)], spaced[slice(*key)], spaced[slice(*value)])
             for name, sep, key, value in argument_char_spans(spaced).members]
    assert parts == [("a", None, '"a" :', '[1, {"c": "}"}]'), ("b", " ,", '"b":', "null")]


def test_decisions_are_rewarded_in_the_state_they_were_made_in(tmp_path):
    # asked: a and b. Written: a (right), c (not asked, while b was still missing), a again, close.
    pieces = ['<tool_call>{"name": "f", "arguments": {', '"a":', ' 1', ', ', '"c":', ' 2', ', ', '"a":', ' 3',
              '}}', '</tool_call>']
    tok = PieceTokenizer(pieces)
    ids = list(range(len(pieces)))
    store = TrajectoryStore(tmp_path / "t.db")
    with fb.episode("t", recorder=fb.Recorder(store, "r")) as ep:
        ep.record(Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]),
                             action=Action(content=""), prompt_token_ids=[1], completion_token_ids=ids,
                             completion_logprobs=[-0.1] * len(ids)))
        # json keeps the last "a" (3), judged wrong: no value of a repeated argument is rewarded (the
        # first copy's 1 was right); what a call judged on other arguments gets nothing
        assert reward_decisions(ep, tok, {"a", "b"}, {"a": False, "c": False}, step=0) == 6
        assert reward_decisions(ep, tok, {"a", "b"}, {"a": False}) == 0
        with pytest.raises(ValueError, match="reward_decisions: no step -2"):
            reward_decisions(ep, tok, {"a"}, {"a": True}, step=-2)
    (step,) = store.get(ep.id).transitions
    assert step.info["span_rewards"] == [
        [1, 2, 1.0, "key"],                               # a: asked and new; written again below
        [3, 4, 1.0, "separator"], [4, 5, -1.0, "key"],    # go on: b still missing; c is not asked
        [6, 7, 1.0, "separator"], [7, 8, -1.0, "key"],    # b still missing; a again is not new
        [9, 10, -1.0, "close"]]                           # closed with b missing
    store.close()
