"""Feedback spans: the collector reads what the SDK writes, and writes what it reads."""

from __future__ import annotations

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.feedback.record import Feedback, from_span, is_feedback_span, to_span
from ragtrace_collector.otlp.spanattrs import set_attribute

_TRACE = "0af7651916cd43dd8448eb211c80319c"
_SPAN = "b7ad6b7169203331"


def _feedback(**changes: object) -> Feedback:
    fields: dict[str, object] = {
        "trace_id": _TRACE,
        "span_id": _SPAN,
        "name": "user_feedback",
        "value": 0.0,
        "value_type": semconv.FEEDBACK_TYPE_BOOLEAN,
        "comment": "wrong article",
        "user_id": "u-1",
        "time_unix_nano": 1_700_000_000_000_000_000,
    }
    fields.update(changes)
    return Feedback(**fields)  # type: ignore[arg-type]


def test_a_span_built_from_feedback_reads_back_as_the_same_feedback() -> None:
    feedback = _feedback()
    span = to_span(feedback)
    assert is_feedback_span(span)
    assert span.parent_span_id.hex() == _SPAN
    assert [link.span_id.hex() for link in span.links] == [_SPAN]
    assert from_span(span) == feedback
    assert feedback.negative
    assert feedback.key == (_TRACE, "user_feedback", "u-1")


def test_without_a_span_id_the_parent_is_a_placeholder_and_there_is_no_link() -> None:
    span = to_span(_feedback(span_id=None, user_id=None))
    assert not span.links
    assert len(span.parent_span_id) == 8
    read = from_span(span)
    assert isinstance(read, Feedback)
    assert read.span_id is None
    assert read.key[2] == ""


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (semconv.FEEDBACK_VALUE, 1.5, "outside [0, 1]"),
        (semconv.FEEDBACK_VALUE, float("nan"), "outside [0, 1]"),
        (semconv.FEEDBACK_VALUE, "1", "not a number"),
        (semconv.FEEDBACK_VALUE, True, "not a number"),
        (semconv.FEEDBACK_NAME, "x" * 129, semconv.FEEDBACK_NAME),
        (semconv.FEEDBACK_USER_ID, "", semconv.FEEDBACK_USER_ID),
        (semconv.RAGTRACE_SPAN_KIND, "rag", "not a feedback span"),
    ],
)
def test_a_bad_attribute_gives_a_reason_naming_it_not_its_value(
    key: str, value: object, reason: str
) -> None:
    span = to_span(_feedback())
    set_attribute(span.attributes, key, value)
    read = from_span(span)
    assert isinstance(read, str)
    assert reason in read
    assert repr(value)[:20] not in read or key == semconv.RAGTRACE_SPAN_KIND


def test_a_long_comment_is_cut_and_a_zero_trace_id_refused() -> None:
    span = to_span(_feedback(comment="c" * 10_000))
    read = from_span(span)
    assert isinstance(read, Feedback)
    assert read.comment is not None
    assert len(read.comment) == semconv.FEEDBACK_MAX_TEXT_CHARS
    span.trace_id = bytes(16)
    assert from_span(span) == "bad trace id"
    assert not is_feedback_span(trace_pb2.Span())
