"""``POST /v1/feedback`` bodies from Hypothesis: whatever is sent, the endpoint's parser
either returns feedback within every bound, or refuses it naming a field it knows,
without quoting anything sent; it never raises anything else."""

from __future__ import annotations

import json
import math
import string
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ragtrace import semconv
from ragtrace_collector.feedback.ingest import FIELDS, BadFeedback, feedback_request, parse_feedback
from ragtrace_collector.feedback.record import Feedback, from_span

#: Every string value the strategies make carries this, so an echo is found by search.
#: (Unknown field *names* are quoted when they look like names: that is the point.)
MARK = "Zq9"

_marked = st.one_of(
    st.text(min_size=0, max_size=300).map(lambda t: MARK + t),
    st.integers(min_value=100, max_value=5000).map(lambda n: MARK + "c" * n),  # long ones
)
_other_keys = st.text(min_size=0, max_size=60).filter(lambda t: MARK not in t)
_hex = st.text(alphabet="0123456789abcdefABCDEF", min_size=0, max_size=40)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=0.0, max_value=1.0),
    _marked,
    _hex,
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_other_keys, inner, max_size=3)
    ),
    max_leaves=6,
)
_keys = st.one_of(
    st.sampled_from(FIELDS), _other_keys, st.text(string.ascii_lowercase, max_size=12)
)
_bodies = st.dictionaries(_keys, _values, max_size=9)


def _parse(body: bytes) -> Feedback | BadFeedback:
    try:
        return parse_feedback(body, now_ns=7)
    except BadFeedback as refused:
        return refused


def _check(body: bytes) -> None:
    feedback = _parse(body)
    if isinstance(feedback, BadFeedback):
        answer = json.dumps(feedback.answer())
        assert feedback.field in (*FIELDS, "body")
        assert MARK not in answer, answer
        return
    assert len(feedback.trace_id) == 32
    assert feedback.span_id is None or len(feedback.span_id) == 16
    assert 0.0 <= feedback.value <= 1.0
    assert math.isfinite(feedback.value)
    assert 0 < len(feedback.name) <= semconv.FEEDBACK_MAX_NAME_CHARS
    for text in (feedback.comment, feedback.correction):
        assert text is None or len(text) <= semconv.FEEDBACK_MAX_TEXT_CHARS
    # What the endpoint logs is read back the same by the pipeline.
    _, payload = feedback_request(feedback)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    (rs,) = ExportTraceServiceRequest.FromString(payload).resource_spans
    (span,) = rs.scope_spans[0].spans
    assert from_span(span, rs.resource) == feedback


@settings(max_examples=400, deadline=None)
@given(_bodies)
def test_any_json_object(body: dict[str, Any]) -> None:
    _check(json.dumps(body).encode())


_VALID_TRACE = "0af7651916cd43dd8448eb211c80319c"
#: Strings around each bound: names (128), user ids (256), texts (4000).
_texts_near_bounds = (
    st.sampled_from(
        [
            semconv.FEEDBACK_MAX_NAME_CHARS,
            semconv.FEEDBACK_MAX_USER_ID_CHARS,
            semconv.FEEDBACK_MAX_TEXT_CHARS,
        ]
    )
    .flatmap(lambda n: st.integers(n - 4, n + 4))
    .map(lambda n: (MARK + "c" * n)[:n])
)


_OPTIONAL = [k for k in FIELDS if k not in ("trace_id", "value")]


@settings(max_examples=400, deadline=None)
@given(
    trace_id=st.one_of(st.just(_VALID_TRACE), st.just(_VALID_TRACE.upper()), _hex),
    value=st.one_of(st.booleans(), st.floats(min_value=0.0, max_value=1.0), _values),
    field=st.sampled_from(_OPTIONAL),
    content=st.one_of(_values, _texts_near_bounds),
)
def test_one_field_at_a_time_beside_a_valid_body(
    trace_id: str, value: Any, field: str, content: Any
) -> None:
    """A valid body with one optional field from anything, its bounds included: each
    field's check is reached (a mostly-invalid body stops at the first bad field)."""
    _check(json.dumps({"trace_id": trace_id, "value": value, field: content}).encode())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes(body: bytes) -> None:
    _check(body)
