"""Dataset loaders: DeepEval and Ragas field names, conversations, bad rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ragtrace_collector.cases import Conversation, RAGCase
from ragtrace_collector.offline.loaders import DatasetError, load_dataset, parse_text


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_deepeval_and_ragas_names(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            {
                "input": "q1",
                "actual_output": "a1",
                "expected_output": "e1",
                "retrieval_context": ["c1", "c2"],
                "context": ["gold"],
            },
            {
                "user_input": "q2",
                "response": "a2",
                "reference": "e2",
                "retrieved_contexts": ["c3"],
                "reference_contexts": ["r1"],
                "retrieved_context_ids": ["d3"],
                "reference_context_ids": [3, "d4"],
                "id": "case-2",
            },
        ],
    )
    loaded = load_dataset(path)
    assert loaded.errors == []
    assert loaded.lines == [1, 2]
    one, two = loaded.items
    assert isinstance(one, RAGCase)
    assert isinstance(two, RAGCase)
    assert (one.input, one.actual_output, one.expected_output) == ("q1", "a1", "e1")
    assert one.context_texts() == ["c1", "c2"]
    assert one.reference_contexts == ["gold"]
    assert one.case_id == "line 1"
    assert (two.input, two.actual_output, two.expected_output) == ("q2", "a2", "e2")
    assert two.context_texts() == ["c3"]
    assert two.retrieval_context is not None
    assert two.retrieval_context[0].id == "d3"
    assert two.reference_contexts == ["r1"]
    assert two.reference_context_ids == ["3", "d4"]
    assert two.case_id == "case-2"


def test_context_items_as_objects(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            {
                "input": "q",
                "retrieval_context": [
                    {"id": 1, "content": "a", "score": 0.9, "metadata": {"src": "x"}},
                    {"id": "b", "text": "b text"},
                    {"page_content": "c text", "metadata": {}},
                    "plain",
                ],
            }
        ],
    )
    (c,) = load_dataset(path).items
    assert isinstance(c, RAGCase)
    assert c.context_texts() == ["a", "b text", "c text", "plain"]
    assert c.retrieval_context is not None
    assert c.retrieval_context[0].id == "1"
    assert c.retrieval_context[0].score == 0.9
    assert c.retrieval_context[0].metadata == {"src": "x"}
    assert c.retrieved_ids() == ["1", "b"]


def test_conversations(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "c.jsonl",
        [
            {
                "turns": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello", "retrieval_context": ["n1"]},
                    {"role": "system", "content": "ignored"},
                ],
                "expected_outcome": "greeted",
            },
            {
                "user_input": [
                    {"type": "human", "content": "q"},
                    {"type": "ai", "content": "a", "retrieved_contexts": [{"content": "n2"}]},
                ],
                "reference": "answered",
            },
        ],
    )
    loaded = load_dataset(path)
    assert loaded.errors == []
    one, two = loaded.items
    assert isinstance(one, Conversation)
    assert isinstance(two, Conversation)
    assert [t.role for t in one.turns] == ["user", "assistant"]
    assert one.turns[1].retrieval_context is not None
    assert one.turns[1].retrieval_context[0].content == "n1"
    assert one.expected_outcome == "greeted"
    assert [t.role for t in two.turns] == ["user", "assistant"]
    assert two.expected_outcome == "answered"
    assert any("system turn ignored" in w for w in loaded.warnings)


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        ({"input": 5}, "input", "expected a string"),
        ({"input": "q", "retrieval_context": "one string"}, "retrieval_context", "list"),
        ({"input": "q", "retrieval_context": ["ok", 7]}, "retrieval_context[1]", "string"),
        ({"input": "q", "retrieved_contexts": [{"id": 1}]}, "retrieved_contexts[0]", "content"),
        ({"input": "q", "reference_context_ids": [{"a": 1}]}, "reference_context_ids[0]", "id"),
        ({"input": "a", "user_input": "b"}, "user_input", "conflicts with 'input'"),
        ({"turns": [{"role": "robot", "content": "x"}]}, "turns[0].role", "unknown role"),
        ({"turns": [{"content": "x"}]}, "turns[0].role", "role"),
        ({"turns": "nope"}, "turns", "list"),
        ({"turns": [], "expected_outcome": 3}, "expected_outcome", "string"),
        ({"unrelated": 1}, None, "no case fields"),
        ([1, 2], None, "expected a JSON object"),
    ],
)
def test_bad_rows_name_line_and_field(row: Any, field: str | None, message: str) -> None:
    text = "\n".join([json.dumps({"input": "fine"}), json.dumps(row), json.dumps({"input": "ok"})])
    loaded = parse_text(text)
    assert [c.input for c in loaded.cases] == ["fine", "ok"]  # the rest still loads
    (error,) = loaded.errors
    assert error.line == 2
    assert error.field == field
    assert message in error.message
    assert str(error).startswith("line 2")


def test_invalid_json_line_and_blank_lines() -> None:
    loaded = parse_text('{"input": "a"}\n\n{not json}\n{"input": "b"}\n')
    assert [c.input for c in loaded.cases] == ["a", "b"]
    assert loaded.lines == [1, 4]
    (error,) = loaded.errors
    assert error.line == 3
    assert "invalid JSON" in error.message


def test_unknown_fields_warn_with_a_hint() -> None:
    loaded = parse_text(json.dumps({"input": "q", "expected_ouput": "x", "tags": ["t"]}))
    assert loaded.errors == []
    assert loaded.warnings == [
        "line 1: unknown field 'expected_ouput' ignored (did you mean 'expected_output'?)"
    ]


def test_json_list_keeps_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('[\n  {"input": "a"},\n  {"input": 3},\n\n  {"input": "c"}\n]\n')
    loaded = load_dataset(path)
    assert loaded.lines == [2, 5]
    assert loaded.errors[0].line == 3
    assert loaded.errors[0].field == "input"


def test_json_cases_object(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(
        '{"name": "golden",\n "meta": {"x": [1, 2]},\n "cases": [\n'
        '   {"input": "a"},\n   {"input": null, "turns": 1}\n ]}\n'
    )
    loaded = load_dataset(path)
    assert [c.input for c in loaded.cases] == ["a"]
    assert loaded.lines == [4]
    assert loaded.errors[0].line == 5
    assert loaded.errors[0].field == "turns"


def test_single_object_and_sniffing(tmp_path: Path) -> None:
    path = tmp_path / "one.data"
    path.write_text(json.dumps({"input": "solo"}, indent=2))
    assert [c.input for c in load_dataset(path).cases] == ["solo"]
    path = tmp_path / "many.data"
    path.write_text('{"input": "a"}\n{"input": "b"}\n')
    assert [c.input for c in load_dataset(path).cases] == ["a", "b"]


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="directory"):
        load_dataset(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    with pytest.raises(DatasetError, match="invalid JSON"):
        load_dataset(bad)
    scalar = tmp_path / "scalar.json"
    scalar.write_text("42")
    with pytest.raises(DatasetError, match="expected a list"):
        load_dataset(scalar)


def test_jsonl_splits_on_newline_only(tmp_path: Path) -> None:
    # json.dumps(ensure_ascii=False) leaves U+2028, U+2029 and U+0085 raw in strings;
    # they are not line breaks in JSONL.
    rows = [
        {"input": "one\u2028two", "expected_output": "a\u0085b"},
        {"input": "plain"},
        {"input": "three\u2029four\x1cfive"},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text(
        "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n", encoding="utf-8"
    )
    loaded = load_dataset(path)
    assert loaded.errors == []
    assert [c.input for c in loaded.cases] == ["one\u2028two", "plain", "three\u2029four\x1cfive"]
    assert loaded.cases[0].expected_output == "a\u0085b"
    assert loaded.lines == [1, 2, 3]
    bad = parse_text('{"input": "x\u2028y"}\n{oops}\n{"input": "z"}')
    assert [e.line for e in bad.errors] == [2]
    assert bad.lines == [1, 3]


def test_integral_float_ids_match_their_integer(tmp_path: Path) -> None:
    # A column of numbers read as floats (3.0) names the same document as 3 and "3";
    # a non-integral float and the string "3.0" are kept as written.
    loaded = parse_text(
        json.dumps(
            {
                "input": "q",
                "retrieved_context_ids": [3.0, 4.5, "3.0", 7],
                "reference_context_ids": ["3", 7.0],
            }
        )
    )
    (c,) = loaded.cases
    assert c.retrieved_context_ids == ["3", "4.5", "3.0", "7"]
    assert c.reference_context_ids == ["3", "7"]
