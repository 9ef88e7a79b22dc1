"""``ragtrace.current_request()`` and ``ragtrace.feedback()``."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

import ragtrace
from ragtrace import semconv
from ragtrace._feedback import MAX_TEXT_CHARS
from tests.fakes.otlp_sink import OtlpSink
from tests.sdk.conftest import Recorder


@ragtrace.rag
def answer(question: str) -> ragtrace.RequestHandle | None:
    return ragtrace.current_request()


def _feedback_spans(recorder: Recorder) -> list[ReadableSpan]:
    return recorder.named(semconv.FEEDBACK_SPAN_NAME)


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_current_request_names_the_rag_span(recorder: Recorder) -> None:
    handle = answer("q")
    assert handle is not None
    rag = recorder.one("answer")
    assert handle.trace_id == f"{rag.context.trace_id:032x}"
    assert handle.span_id == f"{rag.context.span_id:016x}"
    assert len(handle.trace_id) == 32
    assert len(handle.span_id) == 16


def test_current_request_is_the_innermost_rag_call(recorder: Recorder) -> None:
    @ragtrace.rag
    def inner(question: str) -> ragtrace.RequestHandle | None:
        return ragtrace.current_request()

    @ragtrace.rag
    def outer(question: str) -> tuple[Any, Any]:
        return inner(question), ragtrace.current_request()

    inner_handle, outer_handle = outer("q")
    assert inner_handle.span_id == f"{recorder.one('inner').context.span_id:016x}"
    assert outer_handle.span_id == f"{recorder.one('outer').context.span_id:016x}"


def test_current_request_outside_a_request_is_none(recorder: Recorder) -> None:
    assert ragtrace.current_request() is None

    @ragtrace.retriever
    def search(query: str) -> Any:
        return ragtrace.current_request()

    assert search("q") is None


def test_current_request_when_disabled_is_none() -> None:
    Recorder().configure(enabled=False)
    assert answer("q") is None


def test_feedback_with_a_handle_is_a_child_of_the_request_and_linked(
    recorder: Recorder,
) -> None:
    handle = answer("q")
    assert handle is not None
    assert ragtrace.feedback(handle, False, comment="Wrong article", user_id="u-7") is True
    rag = recorder.one("answer")
    (span,) = _feedback_spans(recorder)
    assert span.context.trace_id == rag.context.trace_id
    assert span.parent is not None
    assert span.parent.span_id == rag.context.span_id
    assert [link.context.span_id for link in span.links] == [rag.context.span_id]
    assert [link.context.trace_id for link in span.links] == [rag.context.trace_id]
    assert _attrs(span) == {
        semconv.OPENINFERENCE_SPAN_KIND: semconv.OI_KIND_EVALUATOR,
        semconv.RAGTRACE_SPAN_KIND: semconv.KIND_FEEDBACK,
        semconv.FEEDBACK_NAME: "user_feedback",
        semconv.FEEDBACK_VALUE: 0.0,
        semconv.FEEDBACK_VALUE_TYPE: semconv.FEEDBACK_TYPE_BOOLEAN,
        semconv.FEEDBACK_OUTCOME: semconv.FEEDBACK_NEGATIVE,
        semconv.FEEDBACK_COMMENT: "Wrong article",
        semconv.FEEDBACK_USER_ID: "u-7",
    }


def test_feedback_inside_a_request_about_that_request(recorder: Recorder) -> None:
    @ragtrace.rag
    def self_rating(question: str) -> bool:
        handle = ragtrace.current_request()
        assert handle is not None
        return ragtrace.feedback(handle, 0.9, name="self_check")

    assert self_rating("q") is True
    rag = recorder.one("self_rating")
    (span,) = _feedback_spans(recorder)
    assert span.parent is not None
    assert span.parent.span_id == rag.context.span_id
    attrs = _attrs(span)
    assert attrs[semconv.FEEDBACK_NAME] == "self_check"
    assert attrs[semconv.FEEDBACK_VALUE] == pytest.approx(0.9)
    assert attrs[semconv.FEEDBACK_VALUE_TYPE] == semconv.FEEDBACK_TYPE_NUMERIC
    assert attrs[semconv.FEEDBACK_OUTCOME] == semconv.FEEDBACK_POSITIVE


def test_feedback_inside_another_request_stays_in_its_target_trace(recorder: Recorder) -> None:
    first = answer("first")
    assert first is not None

    @ragtrace.rag
    def second(question: str) -> None:
        ragtrace.feedback(first, True)

    second("q")
    (span,) = _feedback_spans(recorder)
    assert f"{span.context.trace_id:032x}" == first.trace_id
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == first.span_id
    assert f"{recorder.one('second').context.trace_id:032x}" != first.trace_id


def test_feedback_hours_later_from_a_stored_trace_id(recorder: Recorder) -> None:
    """No live context at all: only the hex string the front end kept, in a fresh
    provider (another process, after a restart)."""
    handle = answer("q")
    assert handle is not None
    stored = handle.trace_id.upper()  # as some front ends spell it
    later = Recorder()
    later.configure()
    assert ragtrace.feedback(stored, 0.25, name="stars") is True
    (span,) = _feedback_spans(later)
    assert f"{span.context.trace_id:032x}" == handle.trace_id
    assert span.parent is not None
    assert span.parent.is_remote
    assert f"{span.parent.span_id:016x}" != handle.span_id  # a placeholder parent
    assert not span.links  # no span id known: nothing to link
    assert _attrs(span)[semconv.FEEDBACK_OUTCOME] == semconv.FEEDBACK_NEGATIVE


def test_feedback_from_a_rebuilt_handle(recorder: Recorder) -> None:
    handle = answer("q")
    assert handle is not None
    rebuilt = ragtrace.RequestHandle(trace_id=handle.trace_id, span_id=handle.span_id)
    assert ragtrace.feedback(rebuilt, True)
    (span,) = _feedback_spans(recorder)
    assert [f"{link.context.span_id:016x}" for link in span.links] == [handle.span_id]


def test_feedback_from_another_thread(recorder: Recorder) -> None:
    handle = answer("q")
    assert handle is not None
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(ragtrace.feedback(handle, True)))
    worker.start()
    worker.join(timeout=10)
    assert results == [True]
    (span,) = _feedback_spans(recorder)
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == handle.span_id


def test_feedback_is_not_sampled_out_with_its_request() -> None:
    """sample_rate drops the request, never the feedback (the parent is marked sampled)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ragtrace.configure(tracer_provider=provider)
    handle = answer("q")
    assert handle is not None  # the request has ids even though it is not recorded
    assert ragtrace.feedback(handle, False) is True
    assert [s.name for s in exporter.get_finished_spans()] == [semconv.FEEDBACK_SPAN_NAME]


def test_feedback_when_disabled_records_nothing() -> None:
    rec = Recorder()
    rec.configure(enabled=False)
    assert ragtrace.feedback("0af7651916cd43dd8448eb211c80319c", True) is False
    assert rec.spans() == []


def test_feedback_before_configure_goes_nowhere_quietly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        assert ragtrace.feedback("0af7651916cd43dd8448eb211c80319c", True) is False
    assert caplog.records == []


_TRACE = "0af7651916cd43dd8448eb211c80319c"


@pytest.mark.parametrize(
    ("target", "value", "options", "logged"),
    [
        ("not-a-trace-id", True, {}, "trace id"),
        ("0af7651916cd43dd8448eb211c8031", True, {}, "trace id"),  # 30 digits
        ("0" * 32, True, {}, "trace id"),
        ("g" * 32, True, {}, "trace id"),
        (12345, True, {}, "target"),
        (None, True, {}, "target"),
        (ragtrace.RequestHandle(_TRACE, "xyz"), True, {}, "RequestHandle"),
        (ragtrace.RequestHandle(_TRACE, "0" * 16), True, {}, "RequestHandle"),
        (_TRACE, 1.5, {}, "value"),
        (_TRACE, -0.1, {}, "value"),
        (_TRACE, 4, {}, "value"),  # a star rating: refused, not clamped to 1.0
        (_TRACE, float("nan"), {}, "value"),
        (_TRACE, float("inf"), {}, "value"),
        (_TRACE, 10**400, {}, "value"),  # past float's range
        (_TRACE, "yes", {}, "value"),
        (_TRACE, None, {}, "value"),
        (_TRACE, True, {"name": ""}, "name"),
        (_TRACE, True, {"name": "x" * 129}, "name"),
        (_TRACE, True, {"name": 3}, "name"),
        (_TRACE, True, {"user_id": ""}, "user_id"),
        (_TRACE, True, {"user_id": "u" * 257}, "user_id"),
        (_TRACE, True, {"user_id": 7}, "user_id"),
    ],
)
def test_bad_feedback_is_dropped_and_logged_once(
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
    target: Any,
    value: Any,
    options: dict[str, Any],
    logged: str,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        for _ in range(3):
            assert ragtrace.feedback(target, value, **options) is False
    assert _feedback_spans(recorder) == []
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    message = caplog.records[0].getMessage()
    assert logged in message
    assert "dropped" in message
    if isinstance(target, str) and target != _TRACE:
        assert target not in message  # the value is never echoed


def test_numbers_of_every_kind_and_the_boundaries(recorder: Recorder) -> None:
    for value in (0, 1, 0.0, 1.0, 0.5, 0.4999):
        assert ragtrace.feedback(_TRACE, value) is True
    outcomes = [_attrs(s)[semconv.FEEDBACK_OUTCOME] for s in _feedback_spans(recorder)]
    neg, pos = semconv.FEEDBACK_NEGATIVE, semconv.FEEDBACK_POSITIVE
    assert outcomes == [neg, pos, neg, pos, pos, neg]
    values = [_attrs(s)[semconv.FEEDBACK_VALUE] for s in _feedback_spans(recorder)]
    assert all(isinstance(v, float) for v in values)
    types = {_attrs(s)[semconv.FEEDBACK_VALUE_TYPE] for s in _feedback_spans(recorder)}
    assert types == {semconv.FEEDBACK_TYPE_NUMERIC}


def test_a_huge_comment_is_cut(recorder: Recorder) -> None:
    assert ragtrace.feedback(_TRACE, False, comment="x" * 1_000_000, correction="y" * 10)
    attrs = _attrs(_feedback_spans(recorder)[0])
    comment = attrs[semconv.FEEDBACK_COMMENT]
    assert comment.startswith("x" * MAX_TEXT_CHARS)
    assert len(comment) < MAX_TEXT_CHARS + 100  # the cut plus its marker
    assert attrs[semconv.RAGTRACE_CONTENT_TRUNCATED] is True
    assert attrs[semconv.FEEDBACK_CORRECTION] == "y" * 10


def test_a_smaller_max_content_chars_cuts_the_comment_sooner() -> None:
    rec = Recorder()
    rec.configure(max_content_chars=10)
    assert ragtrace.feedback(_TRACE, False, comment="abcdefghijklmnop")
    comment = _attrs(_feedback_spans(rec)[0])[semconv.FEEDBACK_COMMENT]
    assert comment.startswith("abcdefghij")
    assert "klm" not in comment


def test_redact_applies_to_free_text_even_without_content_capture() -> None:
    rec = Recorder()
    rec.configure(capture_content=False, redact=lambda text: text.replace("555-1234", "[phone]"))
    assert ragtrace.feedback(
        _TRACE, False, comment="call me 555-1234", correction="see 555-1234", user_id="u"
    )
    attrs = _attrs(_feedback_spans(rec)[0])
    assert attrs[semconv.FEEDBACK_COMMENT] == "call me [phone]"
    assert attrs[semconv.FEEDBACK_CORRECTION] == "see [phone]"
    assert attrs[semconv.FEEDBACK_USER_ID] == "u"


def test_a_comment_that_is_not_text_is_left_out(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        assert ragtrace.feedback(_TRACE, True, comment={"a": 1}) is True  # type: ignore[arg-type]
    attrs = _attrs(_feedback_spans(recorder)[0])
    assert semconv.FEEDBACK_COMMENT not in attrs
    assert attrs[semconv.FEEDBACK_VALUE] == 1.0
    assert len(caplog.records) == 1
    assert "comment" in caplog.records[0].getMessage()


def test_a_failing_tracer_never_reaches_the_app(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(TracerProvider):
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            tracer = super().get_tracer(*args, **kwargs)

            def boom(*a: Any, **k: Any) -> Any:
                raise RuntimeError("exporter on fire")

            tracer.start_span = boom  # type: ignore[method-assign]
            return tracer

    ragtrace.configure(tracer_provider=Broken())
    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        assert ragtrace.feedback(_TRACE, True) is False
    assert any("recording feedback" in r.getMessage() for r in caplog.records)


def test_feedback_over_otlp_http_reaches_the_backend_in_the_request_trace() -> None:
    with OtlpSink() as sink:
        ragtrace.configure(service_name="svc-feedback", endpoint=sink.http_url)
        handle = answer("q")
        assert handle is not None
        assert ragtrace.feedback(handle, 0.2, comment="meh", user_id="u-1")
        assert ragtrace.flush(timeout=30) is True
        sink.wait_for_spans(2)
        ragtrace.shutdown()
    by_name = {received.span.name: received for received in sink.spans}
    rag = by_name["answer"].span
    received = by_name[semconv.FEEDBACK_SPAN_NAME]
    span = received.span
    assert received.service_name == "svc-feedback"
    assert span.trace_id == rag.trace_id
    assert span.parent_span_id == rag.span_id
    assert [(link.trace_id, link.span_id) for link in span.links] == [(rag.trace_id, rag.span_id)]
    attrs = received.attributes
    assert attrs[semconv.FEEDBACK_VALUE] == pytest.approx(0.2)  # double_value on the wire
    assert attrs[semconv.FEEDBACK_OUTCOME] == semconv.FEEDBACK_NEGATIVE
    assert attrs[semconv.FEEDBACK_COMMENT] == "meh"
    assert attrs[semconv.FEEDBACK_USER_ID] == "u-1"
    assert attrs[semconv.RAGTRACE_SPAN_KIND] == semconv.KIND_FEEDBACK


# ------------------------------------------------------------------- generated input

_HEX32 = st.text("0123456789abcdefABCDEF", min_size=32, max_size=32)
_HEX16 = st.text("0123456789abcdef", min_size=16, max_size=16)
_anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=40),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _valid_target(target: Any) -> bool:
    def ok(text: Any, digits: int) -> bool:
        return (
            isinstance(text, str)
            and len(text) == digits
            and all(c in "0123456789abcdefABCDEF" for c in text)
            and int(text, 16) != 0
        )

    if isinstance(target, ragtrace.RequestHandle):
        return ok(target.trace_id, 32) and ok(target.span_id, 16)
    return ok(target, 32)


def _valid_value(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, (int, float)) and 0 <= value <= 1  # False for NaN


# Mostly valid fields, so that one bad field at a time is common; the bounds also as
# explicit examples, which always run.
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    target=st.one_of(
        _HEX32,
        st.builds(ragtrace.RequestHandle, _HEX32, _HEX16),
        st.builds(ragtrace.RequestHandle, _HEX32, st.one_of(_HEX16, st.text(max_size=20))),
        _anything,
    ),
    value=st.one_of(
        st.booleans(),
        st.floats(0, 1),
        st.floats(),
        st.integers(-2, 3),
        st.just(10**400),
        _anything,
    ),
    name=st.one_of(
        st.just("user_feedback"),
        st.text(max_size=20),
        st.text(min_size=125, max_size=131),
        _anything,
    ),
    comment=st.one_of(
        st.none(), st.text(max_size=50), st.text(min_size=4001, max_size=4100), _anything
    ),
    user_id=st.one_of(
        st.none(), st.text(max_size=20), st.text(min_size=253, max_size=259), _anything
    ),
)
@example(target=_TRACE, value=True, name="n" * 128, comment=None, user_id="u" * 256)
@example(target=_TRACE, value=True, name="n" * 129, comment=None, user_id=None)
@example(target=_TRACE, value=True, name="n", comment=None, user_id="u" * 257)
@example(target=_TRACE, value=0.5, name="n", comment="c" * 5000, user_id=None)
def test_feedback_never_raises_and_records_exactly_the_valid_input(
    target: Any, value: Any, name: Any, comment: Any, user_id: Any
) -> None:
    rec = Recorder()
    rec.configure()
    recorded = ragtrace.feedback(target, value, name=name, comment=comment, user_id=user_id)
    valid = (
        _valid_target(target)
        and _valid_value(value)
        and isinstance(name, str)
        and 0 < len(name) <= 128
        and (user_id is None or (isinstance(user_id, str) and 0 < len(user_id) <= 256))
    )
    assert recorded is valid
    spans = _feedback_spans(rec)
    assert len(spans) == (1 if valid else 0)
    if not valid:
        return
    attrs = _attrs(spans[0])
    number = attrs[semconv.FEEDBACK_VALUE]
    assert number == float(value)
    assert attrs[semconv.FEEDBACK_OUTCOME] == (
        semconv.FEEDBACK_NEGATIVE if number < 0.5 else semconv.FEEDBACK_POSITIVE
    )
    trace_id = target.trace_id if isinstance(target, ragtrace.RequestHandle) else target
    assert f"{spans[0].context.trace_id:032x}" == trace_id.lower()
    if isinstance(comment, str):
        assert len(attrs[semconv.FEEDBACK_COMMENT]) <= MAX_TEXT_CHARS + 100
    else:
        assert semconv.FEEDBACK_COMMENT not in attrs
