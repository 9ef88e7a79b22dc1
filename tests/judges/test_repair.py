"""Local repair of judge answers: what is fixed, and what stays invalid."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragtrace_collector.judges.repair import parse_json_object


@pytest.mark.parametrize(
    ("text", "expected", "repaired"),
    [
        ('{"a": 1}', {"a": 1}, False),
        ('  {"a": [1, 2]}\n', {"a": [1, 2]}, False),
        ('```json\n{"a": 1}\n```', {"a": 1}, True),
        ('```\n{"a": 1}\n```', {"a": 1}, True),
        ('Here you go: {"a": "b"} Hope it helps!', {"a": "b"}, True),
        ('{"a": [1, 2,], "b": {"c": 3,},}', {"a": [1, 2], "b": {"c": 3}}, True),
        ("{'a': 'it\\'s', 'b': \"x\"}", {"a": "it's", "b": "x"}, True),
        ("{'q': 'say \"hi\"'}", {"q": 'say "hi"'}, True),
        ("{'a': True, 'b': False, 'c': None}", {"a": True, "b": False, "c": None}, True),
        ('{"a": "a } brace", "b": "{"}', {"a": "a } brace", "b": "{"}, False),
        ('{"reason": "line one\nline two"}', {"reason": "line one\nline two"}, True),
        ('Answer:\n```json\n{"a": 1,}\n```\nand {"b": 2}', {"a": 1}, True),
        ('{"word": "Trueish", "n": None}', {"word": "Trueish", "n": None}, True),
    ],
)
def test_repairs(text: str, expected: dict[str, object], repaired: bool) -> None:
    assert parse_json_object(text) == (expected, repaired)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "yes",
        "Yes, all nodes are relevant.",
        "[1, 2, 3]",
        '"yes"',
        "42",
        '{"a": 1',  # truncated
        "{'a': 'unterminated}",
        "{not json at all}",
    ],
)
def test_unrepairable_answers_raise(text: str) -> None:
    with pytest.raises(ValueError):
        parse_json_object(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5), st.text(max_size=30))
def test_valid_json_objects_round_trip_even_with_prose(obj: dict[str, object], prose: str) -> None:
    text = json.dumps(obj)
    assert parse_json_object(text) == (obj, False)
    if "{" not in prose and "}" not in prose and "`" not in prose and prose.strip() != "":
        value, _ = parse_json_object(f"{prose}\n```json\n{text}\n```\n")
        assert value == obj
