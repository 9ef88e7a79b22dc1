"""The supported matrix's harness: a small fixed corpus with its ground truth, a
keyword retriever every app ranks with (so the expected ids are computed by hand), and
the real ``ragtrace-collector serve`` of tests/e2e with that ground truth in its
reference store.

**The corpus and what a top-2 keyword retrieval returns** (words of more than three
letters the question shares with a document; ties keep corpus order):

=============================================  ==========================  ==============
question                                       top 2 (shared words)        reference ids
=============================================  ==========================  ==============
What is the capital of France?                 kb_paris (2), kb_berlin (1)  kb_paris
When was the Eiffel Tower completed?           kb_eiffel (3), kb_paris (0)  kb_eiffel
Which museum is the most visited?              kb_louvre (3), kb_paris (0)  kb_louvre
=============================================  ==========================  ==============

So every question, retrieved with the user's ids, scores id_context_recall 1/1 = 1.0
and id_context_precision 1/2 = 0.5.  The LlamaIndex apps embed with
:func:`keyword_vector` (bag of these words, cosine) and Haystack ranks with BM25: both
give the same top 2 for the first question (cosine 2/√10 and 1/√6, the rest 0; BM25
3.74 and 2.56 against 0.59).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ragtrace import semconv
from ragtrace_collector.cases import ContextItem, RAGCase
from tests.e2e._instrumented import (
    CASE_METRICS,
    KB,
    Retrieved,
    collector,
    conversation_scores,
    offline_scores,
    provider,
)
from tests.e2e._support import Serve, assert_scored, flat
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan

T = TypeVar("T")

__all__ = [
    "ANSWER_METRICS",
    "CASE_METRICS",
    "KB",
    "QUESTIONS",
    "REFERENCES",
    "TOP_2",
    "TURN_METRICS",
    "Retrieved",
    "assert_answer_metrics_scored",
    "assert_conversation_scored",
    "assert_generation_scored",
    "assert_ids_scored",
    "assert_ids_skipped",
    "assert_text_metrics_scored",
    "keyword_vector",
    "matrix_collector",
    "only_case",
    "provider",
    "rank",
    "results",
    "scored",
    "tops",
    "wait_scored",
]

QUESTIONS = (
    "What is the capital of France?",
    "When was the Eiffel Tower completed?",
    "Which museum is the most visited?",
)
#: Ground truth per question, served by the collector's reference store.
REFERENCES: dict[str, list[str]] = {
    QUESTIONS[0]: ["kb_paris"],
    QUESTIONS[1]: ["kb_eiffel"],
    QUESTIONS[2]: ["kb_louvre"],
}
#: What every app retrieves per question (see the module docstring), and the id scores
#: a correct collector writes for it: recall 1/1, precision 1/2.
TOP_2: dict[str, list[str]] = {
    QUESTIONS[0]: ["kb_paris", "kb_berlin"],
    QUESTIONS[1]: ["kb_eiffel", "kb_paris"],
    QUESTIONS[2]: ["kb_louvre", "kb_paris"],
}
EXPECTED_RECALL = 1.0
EXPECTED_PRECISION = 0.5
ID_METRICS = ("id_context_recall", "id_context_precision")
TEXT_METRICS = tuple(m for m in CASE_METRICS if m not in ID_METRICS)
#: The generation metrics of the cells that check the answer read (against the same
#: metrics offline on the app's true question and answer).
ANSWER_METRICS = ("faithfulness", "answer_relevancy")
#: The turn metric of the conversation cells.
TURN_METRICS = ("turn_contextual_relevancy",)


def _words(text: str) -> set[str]:
    return {w.strip("?.,!").lower() for w in text.split() if len(w.strip("?.,!")) > 3}


_VOCABULARY = sorted(set().union(*(_words(t) for t in KB.values())))


def rank(query: str, k: int = 2) -> list[str]:
    """The ``k`` corpus ids sharing most words with ``query`` (ties: corpus order)."""
    words = _words(query)
    return sorted(KB, key=lambda i: -len(words & _words(KB[i])))[:k]


def keyword_vector(text: str) -> list[float]:
    """A bag-of-words vector over the corpus vocabulary, unit length (a query with no
    corpus word gets a small constant vector rather than a zero one)."""
    words = _words(text)
    vec = [1.0 if w in words else 0.0 for w in _VOCABULARY]
    norm = math.sqrt(sum(vec)) or 1.0
    return [v / norm for v in vec] if any(vec) else [1e-3] * len(vec)


@contextmanager
def matrix_collector(
    sink: OtlpSink,
    tmp_path: Path,
    metrics: dict[str, dict[str, Any]] | None = None,
    **sections: Any,
) -> Iterator[Serve]:
    """tests/e2e's ``ragtrace-collector serve`` with the corpus's ground truth,
    exporting to ``sink`` (the case metrics by default)."""
    if metrics is None:
        metrics = {name: {} for name in CASE_METRICS}
    with collector(sink, tmp_path, metrics, references=REFERENCES, **sections) as serve:
        yield serve


# ------------------------------------------------------------------ read-back
def scored(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The spans that carry any evaluation result."""
    prefix = semconv.EVAL_PREFIX + "."
    return [s for s in spans if any(k.startswith(prefix) for k in s.attributes)]


def tops(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The spans whose parent is not among ``spans``, in start order."""
    ids = {s.span.span_id for s in spans}
    found = [s for s in spans if s.span.parent_span_id not in ids]
    return sorted(found, key=lambda s: s.span.start_time_unix_nano)


def only_case(spans: list[ReceivedSpan]) -> ReceivedSpan:
    """The one case span of a single request: the only top span, and the only span
    that carries results."""
    roots = tops(spans)
    assert len(roots) == 1
    assert scored(spans) == roots
    return roots[0]


def wait_scored(sink: OtlpSink, count: int, timeout: float = 60.0) -> list[ReceivedSpan]:
    """The sink's spans once ``count`` of them carry results (else an error naming what
    did arrive)."""
    try:
        sink.wait_until(lambda: len(scored(sink.spans)) >= count, timeout)
    except AssertionError:
        arrived = [
            (s.span.name, s.span.trace_id.hex()[:8], sorted(k for k in s.attributes if "eval" in k))
            for s in sink.spans
        ]
        raise AssertionError(f"{count} scored spans expected; arrived: {arrived}") from None
    return sink.spans


def converse(
    sink: OtlpSink, ask: Callable[[str], T], flush: Callable[[], object] | None = None
) -> list[tuple[str, T]]:
    """Ask every question of :data:`QUESTIONS` in turn, as a user waits for each answer
    (flushed, then scored) before the next; the (question, answer) turns."""
    turns = []
    for n, question in enumerate(QUESTIONS, 1):
        turns.append((question, ask(question)))
        if flush is not None:
            flush()
        wait_scored(sink, n)
    return turns


def assert_ids_scored(
    span: ReceivedSpan,
    recall: float = EXPECTED_RECALL,
    precision: float = EXPECTED_PRECISION,
) -> None:
    """The hand-computed id scores, in all three result forms."""
    _report(span)
    for name, score in (("id_context_recall", recall), ("id_context_precision", precision)):
        got = flat(span, name, semconv.EVAL_FIELD_SCORE)
        assert got == score, f"{name}: {got}, expected {score}; {results(span, name)}"
        assert_scored(span, name, score)


def _report(span: ReceivedSpan) -> None:
    """With ``MATRIX_REPORT`` set to a file, append what the collector wrote for the
    id metrics on ``span`` (the measured side of the docs' matrix table).  Not a
    ``RAGTRACE_`` variable: the clean-SDK fixture removes those."""
    path = os.environ.get("MATRIX_REPORT")
    if not path:
        return
    line = {"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]}
    for name in ID_METRICS:
        line[name] = flat(span, name, semconv.EVAL_FIELD_SCORE)
        line[name + ".reason"] = flat(span, name, semconv.EVAL_FIELD_REASON)
    line["document_id_source"] = span.attributes.get(semconv.DOCUMENT_ID_SOURCE)
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


def results(span: ReceivedSpan, name: str) -> dict[str, Any]:
    """The flat result keys of metric ``name`` on ``span`` (for failure messages)."""
    prefix = semconv.eval_attr(name, "")
    return {k: v for k, v in span.attributes.items() if k.startswith(prefix)}


def assert_ids_skipped(span: ReceivedSpan, reason: str) -> None:
    """Both id metrics skipped (no score) with ``reason`` in their reason."""
    _report(span)
    for name in ID_METRICS:
        assert flat(span, name, semconv.EVAL_FIELD_SCORE) is None, results(span, name)
        assert flat(span, name, semconv.EVAL_FIELD_SKIPPED) is True, name
        got = flat(span, name, semconv.EVAL_FIELD_REASON)
        assert isinstance(got, str), results(span, name)
        assert reason in got, f"{name}: {results(span, name)}"


def assert_text_metrics_scored(span: ReceivedSpan, question: str, got: Retrieved) -> None:
    """The string and referenceless metrics scored as they score offline on the case
    the app itself saw (its question, documents and answer; the corpus's ground truth)."""
    ids = REFERENCES[question]
    case = RAGCase(
        input=question,
        actual_output=got.answer,
        retrieval_context=[ContextItem(content=t) for t in got.texts],
        reference_context_ids=ids,
        reference_contexts=[KB[i] for i in ids],
    )
    for name, score in offline_scores(case, TEXT_METRICS).items():
        assert_scored(span, name, score)


def assert_answer_metrics_scored(
    span: ReceivedSpan,
    question: str | None,
    answer: str,
    texts: list[str],
    names: tuple[str, ...] = ANSWER_METRICS,
) -> None:
    """The generation metrics ``names`` scored on ``span`` as offline on the app's true
    question (None: it had none to read) and answer.  With ``MATRIX_REPORT`` set, the
    pairs are appended there too."""
    case = RAGCase(
        input=question,
        actual_output=answer,
        retrieval_context=[ContextItem(content=t) for t in texts],
    )
    expected = offline_scores(case, names)
    path = os.environ.get("MATRIX_REPORT")
    if path:
        line: dict[str, Any] = {"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]}
        for name, score in expected.items():
            line[name] = {"offline": score, "online": flat(span, name, semconv.EVAL_FIELD_SCORE)}
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")
    for name, score in expected.items():
        assert_scored(span, name, score)


def assert_generation_scored(span: ReceivedSpan, question: str, got: Retrieved) -> None:
    """The span says it judged the app's own question and answer
    (``ragtrace.eval.input`` / ``.output``), and the generation metrics score as they
    score offline on that true text and the documents the app retrieved."""
    assert span.attributes.get(semconv.EVAL_INPUT) == question
    assert span.attributes.get(semconv.EVAL_OUTPUT) == got.answer
    assert_answer_metrics_scored(span, question, got.answer, got.texts)


def assert_conversation_scored(
    roots: list[ReceivedSpan], turns: list[tuple[str, Retrieved]]
) -> None:
    """Each turn: its window score and the running conversation score as offline, a
    reason naming no turn that does not exist, and its own id recall."""
    expected = conversation_scores(turns, TURN_METRICS)
    for name in TURN_METRICS:
        for n, (root, (window, running)) in enumerate(zip(roots, expected[name], strict=True), 1):
            assert flat(root, name, semconv.EVAL_FIELD_SCORE) == pytest.approx(window), n
            got = flat(root, name, semconv.EVAL_FIELD_CONVERSATION_SCORE)
            assert got == pytest.approx(running), n
            reason = flat(root, name, semconv.EVAL_FIELD_REASON)
            assert "missing" not in reason, f"turn {n}: {reason}"
    for root in roots:
        assert flat(root, "id_context_recall", semconv.EVAL_FIELD_SCORE) == 1.0
