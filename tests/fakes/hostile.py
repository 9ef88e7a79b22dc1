"""Hostile requests, and a runner that probes the collector while one is in flight.

Shared by ``tests/receivers/test_hostile_load.py`` (which asserts that the probes and a
normal export complete, with the right statuses) and ``benchmarks/hostile_load.py``
(which reports their latencies).

* :func:`gzip_members_body`: a body of nothing but empty gzip members;
* :func:`big_rag_trace`: a ``@rag`` trace with ground truth (so the default sampling
  rule evaluates it) whose retrieval documents weigh ``total_bytes``;
* :func:`wide_trace`: one trace of ``spans`` spans;
* :func:`small_rag_trace`: a normal ``@rag`` trace with ground truth (for the judge);
* :func:`huge_judge_reply`: a fake-OpenAI handler answering ``size`` characters;
* :func:`under_load`: send one hostile request; meanwhile probe ``/healthz`` over and
  over and make one normal OTLP export; report every status and latency.
"""

from __future__ import annotations

import gzip
import http.client
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ragtrace import semconv
from tests.fakes.openai_server import RecordedRequest, Reply
from tests.fakes.otlp_data import make_request, make_span, new_span_id, new_trace_id

PROTOBUF = {"Content-Type": "application/x-protobuf"}


# ------------------------------------------------------------------ payloads
def gzip_members_body(total_bytes: int) -> bytes:
    """``total_bytes`` (about) of empty gzip members, one after another."""
    member = gzip.compress(b"", mtime=0)
    return member * max(1, total_bytes // len(member))


def big_rag_trace(
    total_bytes: int, *, documents: int = 15, expected_repeats: int = 2000
) -> ExportTraceServiceRequest:
    """A ``@rag`` root with ``ragtrace.expected_output`` (a sentence of 37 characters
    ``expected_repeats`` times), a retriever holding ``documents`` documents of
    ``total_bytes`` in all, and a generator."""
    trace_id = new_trace_id()
    root = make_span(
        trace_id,
        name="rag",
        attrs={
            semconv.RAGTRACE_SPAN_KIND: semconv.KIND_RAG,
            semconv.INPUT_VALUE: "What does the handbook say about the refund policy?",
            semconv.OUTPUT_VALUE: "Refunds are possible within 30 days of purchase.",
            semconv.EXPECTED_OUTPUT: "Refunds are accepted within 30 days. " * expected_repeats,
        },
    )
    doc_size = max(1, total_bytes // documents)
    attrs: dict[str, str | int | float | bool] = {
        semconv.RAGTRACE_SPAN_KIND: semconv.KIND_RETRIEVER,
        semconv.GEN_AI_RETRIEVAL_QUERY_TEXT: "refund policy",
    }
    sentence = "The refund policy of the handbook allows returns within thirty days. "
    body = (sentence * (doc_size // len(sentence) + 1))[:doc_size]
    for i in range(documents):
        prefix = semconv.RETRIEVAL_DOCUMENTS
        attrs[semconv.document_attr(prefix, i, semconv.DOCUMENT_ID)] = f"doc-{i}"
        attrs[semconv.document_attr(prefix, i, semconv.DOCUMENT_CONTENT)] = body
    retriever = make_span(trace_id, parent=root.span_id, name="retrieve", attrs=attrs)
    generator = make_span(
        trace_id,
        parent=root.span_id,
        name="generate",
        attrs={semconv.RAGTRACE_SPAN_KIND: semconv.KIND_GENERATOR},
    )
    return make_request([retriever, generator, root], service="hostile-rag")


def small_rag_trace() -> ExportTraceServiceRequest:
    """A small ``@rag`` trace with ground truth: the default rule evaluates it, and
    every input is within the default case bounds (so the judge is asked)."""
    return big_rag_trace(2_000, documents=2, expected_repeats=3)


def wide_trace(spans: int) -> ExportTraceServiceRequest:
    """One trace: a root and ``spans - 1`` children."""
    trace_id = new_trace_id()
    root = make_span(trace_id, name="root")
    request = make_request([root], service="hostile-wide")
    scope_spans = request.resource_spans[0].scope_spans[0]
    template = make_span(trace_id, parent=root.span_id, name="child", attrs={"n": 0})
    for _ in range(spans - 1):
        span = scope_spans.spans.add()
        span.CopyFrom(template)
        span.span_id = new_span_id()
    return request


def normal_export() -> bytes:
    """A small, ordinary OTLP export (one trace of two spans)."""
    trace_id = new_trace_id()
    root = make_span(trace_id, name="normal")
    child = make_span(trace_id, parent=root.span_id, name="normal-child")
    body: bytes = make_request([child, root], service="normal").SerializeToString()
    return body


def huge_judge_reply(size: int, *, after: int = 0) -> Callable[[RecordedRequest], Reply]:
    """A judge handler answering ``size`` characters of text, except for the first
    ``after`` requests (a short answer: warm-up calls)."""
    content = ('{"verdicts": [' + '{"verdict": "yes", "reason": "x"},' * (size // 34))[:size]
    answered = 0

    def handler(request: RecordedRequest) -> Reply:
        nonlocal answered
        answered += 1
        return Reply.text("{}" if answered <= after else content)

    return handler


# -------------------------------------------------------------------- runner
@dataclass
class Timed:
    status: int
    seconds: float


@dataclass
class LoadOutcome:
    """What happened while one hostile request was in flight."""

    hostile: Timed
    normal: Timed
    probes: list[Timed] = field(default_factory=list)

    @property
    def probe_latencies(self) -> list[float]:
        return [p.seconds for p in self.probes]


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = 120.0) -> Timed:
    """POST ``body``; the status (0 when the connection failed) and the time taken."""
    return _request("POST", url, body, headers, timeout)


def get(url: str, timeout: float = 30.0) -> Timed:
    """GET ``url`` on a new connection (as a liveness probe does)."""
    return _request("GET", url, None, {}, timeout)


def _request(
    method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float
) -> Timed:
    parts = urlsplit(url)
    started = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request(method, parts.path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        status = response.status
    except (OSError, http.client.HTTPException):
        status = 0
    finally:
        conn.close()
    return Timed(status, time.perf_counter() - started)


def probe_for(healthz_url: str, stop: threading.Event, interval: float = 0.01) -> list[Timed]:
    """Probe ``healthz_url`` every ``interval`` until ``stop`` is set (at least once)."""
    probes: list[Timed] = []
    while True:
        probes.append(get(healthz_url))
        if stop.wait(interval):
            return probes


def under_load(
    *,
    http_url: str,
    healthz_url: str,
    body: bytes,
    headers: dict[str, str],
    settle: Callable[[], None] | None = None,
    min_window: float = 1.0,
) -> LoadOutcome:
    """Send ``body`` to ``http_url``; meanwhile probe ``healthz_url`` and make one
    normal export.  Probing lasts until the hostile request is answered and
    ``settle()`` returns (e.g. until the trace was evaluated), and at least
    ``min_window`` seconds."""
    stop = threading.Event()
    probes: list[Timed] = []
    prober = threading.Thread(
        target=lambda: probes.extend(probe_for(healthz_url, stop)), daemon=True
    )
    hostile: list[Timed] = []
    sender = threading.Thread(
        target=lambda: hostile.append(post(http_url, body, headers)), daemon=True
    )
    started = time.monotonic()
    prober.start()
    sender.start()
    time.sleep(0.05)  # the hostile request is on its way
    normal = post(http_url, normal_export(), PROTOBUF)
    sender.join(180)
    if settle is not None:
        settle()
    remaining = min_window - (time.monotonic() - started)
    if remaining > 0:
        time.sleep(remaining)
    stop.set()
    prober.join(60)
    assert hostile, "the hostile request did not finish"
    return LoadOutcome(hostile[0], normal, probes)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]
