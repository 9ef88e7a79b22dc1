"""Arize Phoenix exporter: spans over OTLP/HTTP, results as native Phoenix annotations.

Phoenix shows ``ragtrace.eval.*`` attributes only as raw attributes, and never turns
OpenInference ``evaluations.N.*`` attributes into annotations.  This exporter sends the
spans like the OTLP/HTTP exporter (same queue, batching and retries), into the
configured ``project`` (the ``openinference.project.name`` resource attribute, which
Phoenix files spans under), then posts each result through Phoenix's REST API:

* ``POST /v1/span_annotations?sync=true``: one annotation per metric on the evaluated
  span: ``name`` = metric, ``annotator_kind`` LLM or CODE (by judge), ``result`` =
  score, label (pass/fail, or error) and explanation (the reason), ``metadata`` =
  threshold, model, judge; ``identifier`` = ``ragtrace``, so a resend updates the
  annotation instead of adding another;
* ``POST /v1/document_annotations?sync=true``: the per-document verdicts
  (``ragtrace.eval.<metric>.documents``) on the retriever or reranker span, at their
  ``document_position`` (Phoenix allows only an empty identifier there; it upserts on
  name, span and position, so a resend updates too);
* ``POST /v1/session_annotations?sync=true``: the running conversation score
  (``ragtrace.eval.<metric>.conversation_score``) on the Phoenix session of the span's
  ``session.id``; a later turn replaces an earlier one, never the other way round.
* user feedback (a ``ragtrace.feedback`` span, :mod:`ragtrace_collector.feedback`) is a
  span annotation with ``annotator_kind`` HUMAN on the request span: ``name`` = the
  feedback name, ``result`` = value as score, outcome (positive/negative) as label,
  comment as explanation, ``metadata`` = value type, correction, source;
  ``identifier`` = the user id (empty without one), so a user's repeat replaces their
  earlier feedback as the join does.  The request span is the one the feedback links
  to; feedback sent with a trace id only lands on the trace's root span when this
  exporter has sent it (the last ``_MAX_ROOTS`` traces are remembered), else it is
  skipped and counted (``outcome="no_span"``).  Of several feedback with one key in
  a batch only the last is posted.  The feedback span itself is sent too.

**One source of truth.**  Annotations are read off the spans being exported, from the
flat ``ragtrace.eval.*`` attributes the evaluator wrote (names from
:mod:`ragtrace.semconv`).  A late result (``attach: carrier``, late session metrics)
arrives on an EVALUATOR carrier span: its results become annotations on the span the
carrier links to, and the carrier itself is not sent unless ``carrier_spans: true``.

**Timing.**  Phoenix stores spans asynchronously, so an annotation posted right after
the spans may find no span yet (404 with ``sync=true``).  Such answers, 429, 5xx and
connection failures are retried with exponential backoff for at most
``annotations.max_wait`` (and never past the shutdown deadline); any other answer is
final (a refused multi-item request is retried item by item, so one bad item does not
cost the others).  Once Phoenix took a batch's spans, the batch's annotations wait in
their own task while the export workers go on; at most ``_MAX_ANNOTATING`` batches wait
at once, beyond which the export queue waits (bounded memory, nothing dropped).  A
failing annotation never re-sends the spans.  Counted in
``ragtrace_annotations_total{exporter,kind,outcome}``.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ragtrace import semconv
from ragtrace_collector.component import Supervisor
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.evaluation.document_verdicts import decode_verdicts
from ragtrace_collector.evaluation.enrichment import annotator_kind, is_carrier
from ragtrace_collector.exporters.config import PhoenixExporterConfig
from ragtrace_collector.exporters.otlp_http import (
    OtlpHttpExporter,
    client_ssl_context,
    parse_retry_after,
)
from ragtrace_collector.feedback.record import Feedback, from_span, is_feedback_span
from ragtrace_collector.otlp.codec import Span, SpanGroup, build_request
from ragtrace_collector.otlp.spanattrs import any_value_to_python, set_attribute

__all__ = [
    "PhoenixAnnotations",
    "PhoenixExporter",
    "is_carrier",
    "read_annotations",
    "read_feedback",
]

#: The identifier of every span and session annotation ragtrace writes.
IDENTIFIER: Final = "ragtrace"
_EVAL_LEAD: Final = semconv.EVAL_PREFIX + "."
_EVAL_MARK: Final = _EVAL_LEAD.encode()
_SPAN_KEYS: Final = frozenset({semconv.SESSION_ID, semconv.TURN_INDEX})
_RETRYABLE: Final = frozenset({404, 408, 429, 500, 502, 503, 504})
_FIRST_DELAY: Final = 0.1
_MAX_DELAY: Final = 5.0
_MAX_ANSWER: Final = 2000
#: Sessions whose latest annotated turn is remembered (oldest forgotten first).
_MAX_SESSIONS: Final = 10_000
#: Batches whose annotations may wait for Phoenix at once.
_MAX_ANNOTATING: Final = 64
#: Connections for the annotation requests.
_REST_CONNECTIONS: Final = 4
_FEEDBACK_MARK: Final = semconv.FEEDBACK_SPAN_NAME.encode()
#: Traces whose root span id is remembered, for feedback sent with a trace id only.
_MAX_ROOTS: Final = 10_000


@dataclass
class PhoenixAnnotations:
    """The REST bodies (``data`` items) for one batch of spans."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    documents: list[dict[str, Any]] = field(default_factory=list)
    #: (session id, metric, turn index or None, item)
    sessions: list[tuple[str, str, int | None, dict[str, Any]]] = field(default_factory=list)
    #: (trace id hex, item without ``span_id``): feedback whose request span is the
    #: trace's root, to be found (:meth:`PhoenixExporter._encoded`).
    unplaced: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: trace id hex -> root span id hex, of the root spans in the batch.
    roots: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.spans or self.documents or self.sessions)


def read_feedback(
    span: Span, resource: Resource | None = None, into: PhoenixAnnotations | None = None
) -> PhoenixAnnotations:
    """The HUMAN span annotation for the feedback ``span`` carries (none when it
    carries no valid feedback), added to ``into`` when given."""
    out = into if into is not None else PhoenixAnnotations()
    feedback = from_span(span, resource)
    if not isinstance(feedback, Feedback):
        return out
    metadata: dict[str, Any] = {"source": "user", "value_type": feedback.value_type}
    if feedback.correction is not None:
        metadata["correction"] = feedback.correction
    item: dict[str, Any] = {
        "name": feedback.name,
        "annotator_kind": "HUMAN",
        "result": _result(feedback.value, feedback.outcome, feedback.comment),
        "metadata": metadata,
        "identifier": feedback.user_id or "",
    }
    if feedback.span_id is not None:
        out.spans.append({"span_id": feedback.span_id, **item})
    else:
        out.unplaced.append((feedback.trace_id, item))
    return out


def _metric_fields(span: Span) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(span-level values: ``ragtrace.eval.*`` without a metric, ``session.id`` and the
    turn index; metric -> field -> value), in one pass over the attributes."""
    summary: dict[str, Any] = {}
    metrics: dict[str, dict[str, Any]] = {}
    for kv in span.attributes:
        key = kv.key
        if not key.startswith(_EVAL_LEAD):
            if key in _SPAN_KEYS:
                summary[key] = any_value_to_python(kv.value)
            continue
        rest = key[len(_EVAL_LEAD) :]
        metric, dot, fld = rest.partition(".")
        value = any_value_to_python(kv.value)
        if dot:
            metrics.setdefault(metric, {})[fld] = value
        else:
            summary[key] = value
    return summary, metrics


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _result(score: float | None, label: str | None, explanation: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if score is not None:
        out["score"] = score
    if label is not None:
        out["label"] = label
    if explanation:
        out["explanation"] = explanation
    return out


def read_annotations(span: Span, into: PhoenixAnnotations | None = None) -> PhoenixAnnotations:
    """The Phoenix annotations for the results written on ``span`` (none when the span
    carries no ``ragtrace.eval.<metric>.*`` result), added to ``into`` when given.
    Values are checked, not trusted: a malformed attribute is left out rather than
    failing the batch."""
    out = into if into is not None else PhoenixAnnotations()
    summary, metrics = _metric_fields(span)
    if not metrics:
        return out
    target = span.links[0].span_id if is_carrier(span) else span.span_id
    if len(target) != 8:
        return out
    span_id = target.hex()
    model = _text(summary.get(semconv.EVAL_MODEL))
    session_id = _text(summary.get(semconv.SESSION_ID)) or None
    raw_turn = summary.get(semconv.TURN_INDEX)
    turn = raw_turn if isinstance(raw_turn, int) and not isinstance(raw_turn, bool) else None
    for metric, fields in sorted(metrics.items()):
        score = _number(fields.get(semconv.EVAL_FIELD_SCORE))
        error = _text(fields.get(semconv.EVAL_FIELD_ERROR))
        if score is None and error is None:
            continue  # skipped: nothing to score is not a result to show
        threshold = _number(fields.get(semconv.EVAL_FIELD_THRESHOLD))
        judge = _text(fields.get(semconv.EVAL_FIELD_JUDGE)) or "none"
        kind = annotator_kind(judge)
        metadata: dict[str, Any] = {"source": IDENTIFIER, "judge": judge}
        if threshold is not None:
            metadata["threshold"] = threshold
        if model is not None:
            metadata["model"] = model
        reference = _text(fields.get(semconv.EVAL_FIELD_REFERENCE))
        if reference is not None:
            metadata["reference"] = reference
        passed = fields.get(semconv.EVAL_FIELD_PASSED)
        if error is not None:
            label, explanation = "error", f"error: {error}"
        else:
            label = semconv.LABEL_PASS if passed is True else semconv.LABEL_FAIL
            explanation = _text(fields.get(semconv.EVAL_FIELD_REASON)) or ""
        out.spans.append(
            {
                "span_id": span_id,
                "name": metric,
                "annotator_kind": kind,
                "result": _result(score, label, explanation),
                "metadata": metadata,
                "identifier": IDENTIFIER,
            }
        )
        for verdict in decode_verdicts(fields.get(semconv.EVAL_FIELD_DOCUMENTS)):
            out.documents.append(
                {
                    "span_id": verdict.span_id,
                    "document_position": verdict.position,
                    "name": metric,
                    "annotator_kind": kind,
                    "result": _result(verdict.score, verdict.label, verdict.explanation),
                    "metadata": {"source": IDENTIFIER, "judge": judge},
                    # Phoenix refuses a non-empty identifier on document annotations.
                    "identifier": "",
                }
            )
        conversation = _number(fields.get(semconv.EVAL_FIELD_CONVERSATION_SCORE))
        if conversation is not None and session_id is not None:
            session_meta: dict[str, Any] = {"source": IDENTIFIER, "judge": judge}
            if threshold is not None:
                session_meta["threshold"] = threshold
            if turn is not None:
                session_meta["turn_index"] = turn
            conv_label = None
            if threshold is not None:
                conv_label = semconv.LABEL_PASS if conversation >= threshold else semconv.LABEL_FAIL
            upto = f" up to turn {turn}" if turn is not None else ""
            out.sessions.append(
                (
                    session_id,
                    metric,
                    turn,
                    {
                        "session_id": session_id,
                        "name": metric,
                        "annotator_kind": kind,
                        "result": _result(
                            conversation,
                            conv_label,
                            f"conversation score: the mean of the window scores{upto}",
                        ),
                        "metadata": session_meta,
                        "identifier": IDENTIFIER,
                    },
                )
            )
    return out


class _Body(bytes):
    """The encoded OTLP request, carrying the annotations read off its spans (the base
    machinery passes it from :meth:`PhoenixExporter._encode` to ``_send``, retries
    included)."""

    annotations: PhoenixAnnotations
    #: No span to send (only carrier spans, which are not forwarded).
    empty: bool


class PhoenixExporter(OtlpHttpExporter):
    """The OTLP/HTTP exporter's queue, batching and retries for the spans, plus the
    annotations of each delivered batch (see the module docstring)."""

    kind = "phoenix"

    def __init__(
        self,
        name: str,
        config: PhoenixExporterConfig,
        telemetry: Telemetry,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        super().__init__(name, config, telemetry, supervisor=supervisor)
        self._phoenix = config
        self._base = config.base_url()
        self._rest_headers = {"User-Agent": "ragtrace-collector", **config.headers}
        if config.api_key is not None:
            auth = f"Bearer {config.api_key.get_secret_value()}"
            self._headers["Authorization"] = auth
            self._rest_headers["Authorization"] = auth
        self._session_turns: OrderedDict[tuple[str, str], int] = OrderedDict()
        #: trace id hex -> root span id hex of the latest traces sent.
        self._roots: OrderedDict[str, str] = OrderedDict()
        self._annotating: set[asyncio.Task[None]] = set()
        self._rest: aiohttp.ClientSession | None = None
        self._session_posts = asyncio.Lock()
        self._slots = asyncio.Semaphore(_MAX_ANNOTATING)

    # ------------------------------------------------------------- encoding
    def _encode(self, groups: Sequence[SpanGroup]) -> bytes:
        """The request body, carrying every annotation its spans hold (in a thread)."""
        keep_carriers = self._phoenix.carrier_spans
        kept: list[SpanGroup] = []
        dropped = False
        for group in groups:
            spans = [s for s in group.spans if keep_carriers or not is_carrier(s)]
            if len(spans) == len(group.spans):
                kept.append(group)
                continue
            dropped = True
            if spans:
                kept.append(
                    SpanGroup(
                        group.resource,
                        group.resource_schema_url,
                        group.scope,
                        group.scope_schema_url,
                        spans,
                    )
                )
        request = build_request(kept)
        if self._phoenix.project is not None:
            for resource_spans in request.resource_spans:
                set_attribute(
                    resource_spans.resource.attributes,
                    semconv.OPENINFERENCE_PROJECT_NAME,
                    self._phoenix.project,
                )
        raw = request.SerializeToString()
        annotations = PhoenixAnnotations()
        # Most spans carry no result: a byte search on the encoded batch (and then on
        # each encoded span) is far cheaper than walking every span's attributes.
        if dropped or _EVAL_MARK in raw:
            for group in groups:
                for span in group.spans:
                    if _EVAL_MARK in span.SerializeToString():
                        read_annotations(span, into=annotations)
        # Root spans are remembered for feedback that names a trace only.
        feedback = _FEEDBACK_MARK in raw
        for group in groups:
            for span in group.spans:
                if not span.parent_span_id:
                    annotations.roots[span.trace_id.hex()] = span.span_id.hex()
                elif feedback and is_feedback_span(span):
                    read_feedback(span, group.resource, into=annotations)
        body = _Body(self._compress(raw))
        body.annotations = annotations
        body.empty = not kept
        return body

    def _encoded(self, payload: bytes) -> bytes:
        # Choosing among the annotations reads this exporter's state: on the loop.
        assert isinstance(payload, _Body)
        self._place(payload.annotations)
        payload.annotations = self._select(payload.annotations)
        return payload

    def _place(self, annotations: PhoenixAnnotations) -> None:
        """Remember the batch's root spans; put feedback sent with a trace id only on
        its trace's root span, or count it skipped when that span is not known.  Of
        several feedback with one key (span, name, user) in a batch, the last is sent:
        it replaces the others anyway."""
        roots = self._roots
        for trace_id, span_id in annotations.roots.items():
            roots[trace_id] = span_id
            roots.move_to_end(trace_id)
        while len(roots) > _MAX_ROOTS:
            roots.popitem(last=False)
        for trace_id, item in annotations.unplaced:
            root = roots.get(trace_id)
            if root is None:
                self._count("span", "no_span", 1)
                continue
            annotations.spans.append({"span_id": root, **item})
        annotations.unplaced = []
        human: dict[tuple[str, str, str], int] = {}
        for index, item in enumerate(annotations.spans):
            if item["annotator_kind"] == "HUMAN":
                human[(item["span_id"], item["name"], item["identifier"])] = index
        if len(human) < sum(1 for i in annotations.spans if i["annotator_kind"] == "HUMAN"):
            kept = set(human.values())
            annotations.spans = [
                item
                for index, item in enumerate(annotations.spans)
                if item["annotator_kind"] != "HUMAN" or index in kept
            ]

    def _select(self, annotations: PhoenixAnnotations) -> PhoenixAnnotations:
        """Apply the config switches; keep only the latest turn's conversation score."""
        cfg = self._phoenix.annotations
        chosen = PhoenixAnnotations(
            spans=annotations.spans if cfg.spans else [],
            documents=annotations.documents if cfg.documents else [],
        )
        if not cfg.sessions:
            return chosen
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for session_id, metric, turn, item in annotations.sessions:
            key = (session_id, metric)
            seen = self._session_turns.get(key)
            if turn is not None and seen is not None and turn < seen:
                continue  # an earlier turn's running mean must not replace a later one
            if turn is not None:
                self._session_turns[key] = turn
                self._session_turns.move_to_end(key)
                while len(self._session_turns) > _MAX_SESSIONS:
                    self._session_turns.popitem(last=False)
            latest[key] = item
        chosen.sessions = [
            (s, m, item["metadata"].get("turn_index"), item) for (s, m), item in latest.items()
        ]
        return chosen

    def _current(self, sessions: list[tuple[str, str, int | None, dict[str, Any]]]) -> list[Any]:
        """The session items no later turn has superseded since they were encoded."""
        return [
            item
            for s, m, turn, item in sessions
            if turn is None or turn >= self._session_turns.get((s, m), turn)
        ]

    # -------------------------------------------------------------- sending
    async def _send(self, payload: bytes, spans: int) -> int:
        if not isinstance(payload, _Body):
            return await super()._send(payload, spans)
        rejected = 0 if payload.empty else await super()._send(payload, spans)
        if payload.annotations:
            # Phoenix took the spans; their annotations wait (for Phoenix to store
            # them) beside the export workers, which go on with the next batch.  At
            # most _MAX_ANNOTATING batches wait: past that, the export queue waits.
            await self._slots.acquire()
            # A bug in there is logged, counted and reported on this exporter's status.
            done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            task = self._supervisor.run_once(
                self,
                self._annotate_batch(payload.annotations, done),
                name=f"exporter-{self.name}-annotate",
            )
            self._annotating.add(task)
            task.add_done_callback(self._annotated)
            # The batch counts as delivered (its log entries released) only once its
            # annotations are posted or given up for good: not when a shutdown cut them
            # short, nor after a bug.
            self.settle_after(done)
        return rejected

    async def _open(self) -> None:
        await super()._open()
        # Its own few connections: annotations waiting for Phoenix never hold up the
        # span exports, and Phoenix (whose sync inserts are heavy) gets a bounded load.
        # The timeout counts from the request, not from the wait for a connection.
        tls: ssl.SSLContext | bool = True
        if self._base.startswith("https://"):
            tls = client_ssl_context(self._phoenix.tls)
        self._rest = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=_REST_CONNECTIONS, ssl=tls),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self._phoenix.timeout, sock_read=self._phoenix.timeout
            ),
        )

    def _annotated(self, task: asyncio.Task[None]) -> None:
        self._annotating.discard(task)
        self._slots.release()

    async def _close_client(self) -> None:
        """At shutdown: annotations still waiting get until the deadline, then count
        as given up; then the HTTP client closes."""
        if self._annotating:
            loop = asyncio.get_running_loop()
            deadline = self._deadline if self._deadline is not None else loop.time()
            _, late = await asyncio.wait(
                set(self._annotating), timeout=max(0.0, deadline - loop.time())
            )
            for task in late:
                task.cancel()
            if late:
                await asyncio.gather(*late, return_exceptions=True)
        if self._rest is not None:
            await self._rest.close()
            self._rest = None
        await super()._close_client()

    async def _annotate_batch(
        self, annotations: PhoenixAnnotations, done: asyncio.Future[bool]
    ) -> None:
        complete = False
        try:
            complete = await self._annotate(annotations)
        finally:
            done.set_result(complete)

    async def _annotate(self, annotations: PhoenixAnnotations) -> bool:
        """Post every annotation of a batch.  False when the shutdown deadline cut some
        (the batch then stays unsettled); True once each was posted, refused for good or
        given up after ``annotations.max_wait``."""
        # Spans first: once they are annotated Phoenix has stored them (and their
        # sessions), so documents and sessions seldom wait.
        todo = [
            ("span", "span_annotations", annotations.spans),
            ("document", "document_annotations", annotations.documents),
            ("session", "session_annotations", [i for *_, i in annotations.sessions]),
        ]
        complete = True
        try:
            while todo:
                kind, path, items = todo[0]
                if kind == "session":
                    # Batches finish in any order: one at a time, and only what no
                    # later turn superseded, so an older running mean never wins.
                    async with self._session_posts:
                        posted = await self._post(kind, path, self._current(annotations.sessions))
                else:
                    posted = await self._post(kind, path, items)
                complete = complete and posted
                todo.pop(0)
            return complete
        except asyncio.CancelledError:
            left = {kind: len(items) for kind, _, items in todo if items}
            for kind, n in left.items():
                self._count(kind, "gave_up", n)
            self._log.warning("phoenix_annotations_cut_at_shutdown", annotations=left)
            raise

    async def _post(self, kind: str, path: str, items: list[dict[str, Any]]) -> bool:
        """Post ``items``, with retries.  False only when the shutdown deadline cut the
        retries short (the items may be posted again after a restart)."""
        if not items:
            return True
        loop = asyncio.get_running_loop()
        url = f"{self._base}/v1/{path}?sync=true"
        body = json.dumps({"data": items}, ensure_ascii=False, allow_nan=False).encode()
        headers = {**self._rest_headers, "Content-Type": "application/json"}
        started = loop.time()
        delay = _FIRST_DELAY
        attempt = 0
        while True:
            attempt += 1
            status, answer, retry_after = await self._request(url, body, headers)
            if status is not None and 200 <= status < 300:
                self._count(kind, "posted", len(items))
                return True
            if status is not None and status not in _RETRYABLE:
                if len(items) > 1:
                    # One bad item (say, a document position Phoenix does not have)
                    # must not cost the others theirs.
                    results = [await self._post(kind, path, [item]) for item in items]
                    return all(results)
                self._count(kind, "rejected", len(items))
                self._log.error(
                    "phoenix_annotation_rejected", kind=kind, status=status, answer=answer
                )
                return True
            wait = delay if retry_after is None else min(retry_after, _MAX_DELAY)
            now = loop.time()
            over_budget = now + wait - started > self._phoenix.annotations.max_wait
            deadline = self._deadline
            if over_budget or (deadline is not None and now + wait > deadline):
                self._count(kind, "gave_up", len(items))
                self._log.warning(
                    "phoenix_annotation_gave_up",
                    kind=kind,
                    annotations=len(items),
                    attempts=attempt,
                    status=status,
                    answer=answer,
                )
                return over_budget
            await asyncio.sleep(wait)
            delay = min(delay * 2.0, _MAX_DELAY)

    async def _request(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int | None, str, float | None]:
        """(status or None when Phoenix could not be reached, the start of its answer,
        its Retry-After)."""
        assert self._rest is not None, "exporter not started"
        try:
            async with self._rest.post(url, data=body, headers=headers) as resp:
                raw = await resp.content.read(_MAX_ANSWER)
                return (
                    resp.status,
                    raw.decode("utf-8", "replace").strip(),
                    parse_retry_after(resp.headers.get("Retry-After")),
                )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return None, f"{type(exc).__name__}: {exc}", None

    def _count(self, kind: str, outcome: str, n: int) -> None:
        self._telemetry.annotations.labels(self.name, kind, outcome).inc(n)
