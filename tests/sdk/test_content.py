"""Content controls: capture_content, max_content_chars, redact."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

import ragtrace
from ragtrace import semconv
from ragtrace._capture import REDACTION_FAILED

from .conftest import Recorder

SECRET = re.compile(r"\b\d{4}-\d{4}-\d{4}-\d{4}\b")


def _redact(text: str) -> str:
    return SECRET.sub("[CARD]", text)


@ragtrace.retriever
def search(query: str) -> list[dict[str, Any]]:
    return [
        {
            "id": "kb-1",
            "content": "card 1111-2222-3333-4444 on file",
            "score": 0.9,
            "metadata": {"owner": "4444-3333-2222-1111"},
        },
        {"id": "kb-2", "content": "nothing secret", "score": 0.4},
    ]


@ragtrace.reranker
def rerank(query: str, documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return documents[::-1]


@ragtrace.rag
def answer(question: str) -> str:
    docs = rerank(question, search(question))
    ragtrace.set_reference(
        expected_output="pay with 9999-8888-7777-6666",
        reference_contexts=["ref 1234-5678-1234-5678"],
        reference_context_ids=["kb-1"],
    )
    return f"found {len(docs)} for 5555-6666-7777-8888"


def test_capture_content_false_keeps_structure_only(recorder: Recorder) -> None:
    recorder.configure(capture_content=False)
    with ragtrace.session("s-1", user_id="u-1"):
        assert answer("my card is 1111-2222-3333-4444").startswith("found 2")

    retr = recorder.attrs("search")
    assert retr[semconv.RETRIEVAL_DOCUMENT_COUNT] == 2
    assert retr["retrieval.documents.0.document.id"] == "kb-1"
    assert retr["retrieval.documents.0.document.score"] == 0.9
    rer = recorder.attrs("rerank")
    assert rer[semconv.RERANKER_INPUT_DOCUMENT_COUNT] == 2
    assert rer["reranker.output_documents.0.document.id"] == "kb-2"
    rag = recorder.attrs("answer")
    assert rag[semconv.SESSION_ID] == "s-1"
    assert rag[semconv.TURN_INDEX] == 0

    for span in recorder.spans():
        for key, value in (span.attributes or {}).items():
            assert not key.endswith((".content", ".metadata")), key
            assert key not in (
                semconv.INPUT_VALUE,
                semconv.OUTPUT_VALUE,
                semconv.GEN_AI_RETRIEVAL_QUERY_TEXT,
                semconv.RERANKER_QUERY,
            )
            if key not in semconv.GROUND_TRUTH_ATTRIBUTES:
                assert "1111" not in str(value)
    # ground truth is explicitly sent by the app: still recorded
    assert rag[semconv.REFERENCE_CONTEXT_IDS] == '["kb-1"]'


def test_capture_content_false_stream_records_no_text(recorder: Recorder) -> None:
    recorder.configure(capture_content=False)

    @ragtrace.generator
    def stream(prompt: str) -> Iterator[str]:
        yield "secret "
        yield "tokens"

    assert "".join(stream("p")) == "secret tokens"
    attrs = recorder.attrs("stream")
    assert semconv.OUTPUT_VALUE not in attrs
    assert semconv.INPUT_VALUE not in attrs


def test_redact_applies_to_every_captured_text(recorder: Recorder) -> None:
    recorder.configure(redact=_redact)
    with ragtrace.session("s", expected_outcome="card 1212-3434-5656-7878 updated"):
        result = answer("my card is 1111-2222-3333-4444")
    # the app's own value is untouched
    assert result == "found 2 for 5555-6666-7777-8888"

    everything = []
    for span in recorder.spans():
        for key, value in (span.attributes or {}).items():
            everything.append(f"{key}={value}")
            assert not SECRET.search(str(value)), f"{key} leaked: {value}"
    joined = "\n".join(everything)
    rag = recorder.attrs("answer")
    assert rag[semconv.INPUT_VALUE] == "my card is [CARD]"
    assert rag[semconv.OUTPUT_VALUE] == "found 2 for [CARD]"
    assert rag[semconv.EXPECTED_OUTPUT] == "pay with [CARD]"
    assert json.loads(rag[semconv.REFERENCE_CONTEXTS]) == ["ref [CARD]"]
    assert rag[semconv.EXPECTED_OUTCOME] == "card [CARD] updated"
    retr = recorder.attrs("search")
    assert retr[semconv.GEN_AI_RETRIEVAL_QUERY_TEXT] == "my card is [CARD]"
    assert retr["retrieval.documents.0.document.content"] == "card [CARD] on file"
    assert json.loads(retr["retrieval.documents.0.document.metadata"]) == {"owner": "[CARD]"}
    assert recorder.attrs("rerank")["reranker.output_documents.1.document.content"] == (
        "card [CARD] on file"
    )
    assert joined.count("[CARD]") >= 10


def test_redact_failure_withholds_text_and_logs_once(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def broken(text: str) -> str:
        calls.append(text)
        raise RuntimeError("redactor down")

    recorder.configure(redact=broken)
    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        assert answer("private question") == "found 2 for 5555-6666-7777-8888"
        assert answer("again") == "found 2 for 5555-6666-7777-8888"
    assert calls  # it was called
    for span in recorder.spans():
        for key, value in (span.attributes or {}).items():
            assert "private" not in str(value)
            assert "1111" not in str(value), key
    rag = recorder.named("answer")[0].attributes or {}
    assert rag[semconv.INPUT_VALUE] == REDACTION_FAILED
    records = [r for r in caplog.records if r.name == "ragtrace"]
    assert len(records) == 1
    assert "redact" in records[0].getMessage()


def test_redact_returning_non_string_is_withheld(recorder: Recorder) -> None:
    recorder.configure(redact=lambda text: None)  # type: ignore[arg-type,return-value]
    answer("q")
    assert recorder.attrs("answer")[semconv.INPUT_VALUE] == REDACTION_FAILED


def test_truncation_marker_and_flag(recorder: Recorder) -> None:
    recorder.configure(max_content_chars=10)

    @ragtrace.retriever
    def long_docs(query: str) -> list[str]:
        return ["x" * 25, "short"]

    @ragtrace.rag
    def long_answer(question: str) -> str:
        long_docs(question)
        return "y" * 30

    long_answer("q" * 12)
    rag = recorder.attrs("long_answer")
    assert rag[semconv.OUTPUT_VALUE] == "y" * 10 + "… [ragtrace: truncated 20 characters]"
    assert rag[semconv.INPUT_VALUE] == "q" * 10 + "… [ragtrace: truncated 2 characters]"
    assert rag[semconv.RAGTRACE_CONTENT_TRUNCATED] is True
    retr = recorder.attrs("long_docs")
    assert retr["retrieval.documents.0.document.content"].startswith("x" * 10 + "… [ragtrace")
    assert retr["retrieval.documents.1.document.content"] == "short"
    assert retr[semconv.RAGTRACE_CONTENT_TRUNCATED] is True


def test_no_truncation_flag_when_short_and_zero_means_unlimited(recorder: Recorder) -> None:
    answer("q")
    assert semconv.RAGTRACE_CONTENT_TRUNCATED not in recorder.attrs("answer")
    recorder.clear()
    recorder.configure(max_content_chars=0)

    @ragtrace.rag
    def huge(question: str) -> str:
        return "z" * 50_000

    huge("q")
    assert recorder.attrs("huge")[semconv.OUTPUT_VALUE] == "z" * 50_000


def test_stream_truncation_counts_everything_yielded(recorder: Recorder) -> None:
    recorder.configure(max_content_chars=5)

    @ragtrace.generator
    def stream(prompt: str) -> Iterator[str]:
        for _ in range(2000):
            yield "ab"

    assert sum(1 for _ in stream("p")) == 2000
    out = recorder.attrs("stream")[semconv.OUTPUT_VALUE]
    assert out == "ababa… [ragtrace: truncated 3995 characters]"


def test_redact_sees_secret_straddling_the_cut(recorder: Recorder) -> None:
    recorder.configure(max_content_chars=12, redact=_redact)

    @ragtrace.rag
    def card(question: str) -> str:
        return "card: 1111-2222-3333-4444"

    card("q")
    out = recorder.attrs("card")[semconv.OUTPUT_VALUE]
    assert out.startswith("card: [CARD]")
    assert "1111" not in out
