"""``cases.retrievers``: retriever spans of an in-house instrumentation scored with
config alone, and ``check-config`` refusing a broken rule."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.cli import main
from ragtrace_collector.config import ConfigError, parse_config
from ragtrace_collector.evaluation.case_builder import (
    CaseRules,
    CasesConfig,
    build_cases,
    may_hold_case,
)
from tests.fakes.spans import named_span

HITS = [
    {"key": "kb-1", "body": "Refunds take five days.", "sim": 0.9, "meta": {"team": "a"}},
    {"key": "kb-7", "body": "Lyon opens at nine.", "sim": 0.4, "meta": {"team": "b"}},
]


def _in_house(search_attrs: dict[str, Any], name: str = "kb.search") -> list[trace_pb2.Span]:
    """An app's own spans: a request span (no convention) > a step > the search span."""
    tid = os.urandom(16)
    root = named_span(
        "handle_request",
        {semconv.REFERENCE_CONTEXT_IDS: json.dumps(["kb-1", "kb-2"])},
        tid=tid,
    )
    step = named_span("answer", {}, tid=tid, parent=root)
    return [root, step, named_span(name, search_attrs, tid=tid, parent=step)]


RULE = {
    "match": {"span_name": "kb.search"},
    "documents": "app.hits",
    "id": "key",
    "content": "body",
    "score": "sim",
    "metadata": "meta",
    "query": "app.query",
}


def test_in_house_retriever_scored_with_config_alone() -> None:
    spans = _in_house({"app.hits": json.dumps(HITS), "app.query": "How long do refunds take?"})
    assert not may_hold_case(spans)
    assert build_cases(spans) == []
    rules = CaseRules(CasesConfig(retrievers=[RULE]))
    assert may_hold_case(spans, rules)
    [built] = build_cases(spans, rules=rules)
    assert built.span is spans[0]  # no chain span above the retriever: the trace's root
    assert built.convention is None
    case = built.case
    assert case.input == "How long do refunds take?"  # the retriever's query stands in
    assert case.retrieved_context_ids == ["kb-1", "kb-7"]
    assert case.retrieval_context is not None
    assert [(c.content, c.score, c.metadata) for c in case.retrieval_context] == [
        ("Refunds take five days.", 0.9, {"team": "a"}),
        ("Lyon opens at nine.", 0.4, {"team": "b"}),
    ]
    assert case.reference_context_ids == ["kb-1", "kb-2"]
    assert built.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"


def test_documents_as_a_list_of_json_strings_or_a_wrapping_object() -> None:
    rules = CaseRules(CasesConfig(retrievers=[RULE]))
    strings = _in_house({"app.hits": [json.dumps(h) for h in HITS]})
    [built] = build_cases(strings, rules=rules)
    assert built.case.retrieved_context_ids == ["kb-1", "kb-7"]
    wrapped = _in_house({"app.hits": json.dumps({"results": HITS, "took_ms": 3})})
    [built] = build_cases(wrapped, rules=rules)
    assert built.case.retrieved_context_ids == ["kb-1", "kb-7"]


def test_flattened_documents_with_nested_keys_and_defaults() -> None:
    attrs = {
        "app.docs.0.meta.doc_id": "kb-1",
        "app.docs.0.text": "first",
        "app.docs.1.meta.doc_id": "kb-2",
        "app.docs.1.text": "second",
        "app.docs.1.score": 0.5,
    }
    rule = {"match": {"span_name": "kb.search"}, "documents": "app.docs", "id": "meta.doc_id"}
    [built] = build_cases(_in_house(attrs), rules=CaseRules(CasesConfig(retrievers=[rule])))
    assert built.case.retrieved_context_ids == ["kb-1", "kb-2"]
    assert [c.content for c in built.case.retrieval_context or []] == ["first", "second"]
    assert [c.score for c in built.case.retrieval_context or []] == [None, 0.5]
    # no keys at all: the SDK's duck-typed reading (id, text, score, metadata)
    plain = {"match": {"span_name": "kb.search"}, "documents": "app.docs"}
    flat = {"app.docs.0.id": "kb-9", "app.docs.0.text": "x"}
    [built] = build_cases(_in_house(flat), rules=CaseRules(CasesConfig(retrievers=[plain])))
    assert built.case.retrieved_context_ids == ["kb-9"]


def test_match_by_attribute_and_unrecorded_documents() -> None:
    rule = {"match": {"equals": {"app.kind": "search"}}, "documents": "app.hits", "id": "key"}
    rules = CaseRules(CasesConfig(retrievers=[rule]))
    spans = _in_house({"app.kind": "search", "app.hits": json.dumps(HITS)}, name="whatever")
    assert may_hold_case(spans, rules)
    [built] = build_cases(spans, rules=rules)
    assert built.case.retrieved_context_ids == ["kb-1", "kb-7"]
    other = _in_house({"app.kind": "lookup", "app.hits": json.dumps(HITS)}, name="whatever")
    assert build_cases(other, rules=rules) == []
    # the span matches but did not record its documents: no ids, not "found none"
    [built] = build_cases(_in_house({"app.kind": "search"}), rules=rules)
    assert built.case.retrieved_context_ids is None


def test_a_configured_retriever_wins_over_a_convention() -> None:
    """A span another convention also claims is read with the rule's keys."""
    attrs = {semconv.OPENINFERENCE_SPAN_KIND: "RETRIEVER", "app.hits": json.dumps(HITS)}
    spans = _in_house(attrs)
    [built] = build_cases(spans, rules=CaseRules(CasesConfig(retrievers=[RULE])))
    assert built.case.retrieved_context_ids == ["kb-1", "kb-7"]


def test_retriever_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"retrievers": [{"match": {"span_name": "x"}}]}})
    assert "cases.retrievers[0].documents" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"retrievers": [{**RULE, "contnet": "body"}]}})
    assert "did you mean 'content'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"retrievers": [{"match": {}, "documents": "a"}]}})
    assert "a matcher needs" in str(info.value)


def test_check_config_validates_retrievers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "collector.yaml"
    path.write_text(
        textwrap.dedent(
            """
            cases:
              document_id: [metadata.doc_id, documnet.id]
              retrievers:
                - match: {span_name: "kb.search"}
                  documents: app.hits
                  idd: key
            """
        ),
        encoding="utf-8",
    )
    code = main(["check-config", str(path)])
    out = "".join(capsys.readouterr())
    assert code != 0
    assert "did you mean 'document.id'?" in out
    assert "did you mean 'id'?" in out
    good = "{match: {span_name: kb.search}, documents: app.hits, id: key}"
    path.write_text(f"cases:\n  retrievers:\n    - {good}\n", encoding="utf-8")
    assert main(["check-config", str(path)]) == 0
