"""The ledger of outputs: what the collector makes from a logged request is logged too.

An accepted request is a log entry (``KIND_REQUEST``).  What the collector makes from
it later lives in two more kinds of record:

* ``KIND_OUTPUT``: spans the evaluation stage produced for a trace, with the sequence
  numbers of the entries the trace came from (its *sources*).  A carrier span (results
  sent after the trace: ``enrichment.attach: carrier``, ``evaluation.late_results:
  carrier``) is delivered from this record; an evaluated span (``attach: span``) is a
  copy of it with its results, kept so that a replayed trace gets its results back
  instead of being evaluated again.  An output record stays in the log while any of
  its sources does.
* ``KIND_DELIVERED``: which entries one exporter has delivered while others (or a
  pending output) still hold them, so that a replay does not send them to it again;
  and which entries were settled while an older one held the checkpoint back, so that
  a replay neither sends nor evaluates them again.

:class:`OutputLedger` is what the pipeline hands the trace processor (see
:meth:`OutputLedger.hold`, :meth:`OutputLedger.results`, :meth:`OutputLedger.logged`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ragtrace import semconv
from ragtrace_collector.otlp.codec import Span, SpanGroup

if TYPE_CHECKING:
    from ragtrace_collector.assembly.assembler import AssembledTrace

__all__ = [
    "KIND_DELIVERED",
    "KIND_OUTPUT",
    "SETTLED_MARK",
    "Hold",
    "Logged",
    "OutputLedger",
    "decode_marks",
    "decode_output",
    "encode_marks",
    "encode_output",
    "result_metrics",
]

#: Spans made from logged requests, with the requests' sequence numbers.
KIND_OUTPUT: Final = 2
#: Entries delivered to one exporter (JSON: exporter name -> sequence numbers), or
#: settled altogether (under :data:`SETTLED_MARK`).
KIND_DELIVERED: Final = 3
#: The key of settled entries in a ``KIND_DELIVERED`` record (not an exporter name:
#: those are identifiers).
SETTLED_MARK: Final = "*"

_COUNT: Final = struct.Struct("<I")
_SEQ: Final = struct.Struct("<Q")
_EVAL_LEAD: Final = semconv.EVAL_PREFIX + "."
_RESULT_FIELDS: Final = frozenset({semconv.EVAL_FIELD_SCORE, semconv.EVAL_FIELD_ERROR})


def encode_output(sources: Iterable[int], request: bytes) -> bytes:
    """A ``KIND_OUTPUT`` payload: the source sequence numbers, then the OTLP request."""
    seqs = sorted(set(sources))
    return b"".join([_COUNT.pack(len(seqs)), *(_SEQ.pack(s) for s in seqs), request])


def decode_output(payload: bytes) -> tuple[list[int], bytes]:
    """(sources, request bytes) of a ``KIND_OUTPUT`` payload.  Raises ValueError."""
    if len(payload) < _COUNT.size:
        raise ValueError("output record too short")
    (count,) = _COUNT.unpack_from(payload, 0)
    start = _COUNT.size + count * _SEQ.size
    if start > len(payload):
        raise ValueError("output record too short for its sources")
    seqs = [_SEQ.unpack_from(payload, _COUNT.size + i * _SEQ.size)[0] for i in range(count)]
    return seqs, payload[start:]


def encode_marks(marks: Mapping[str, Iterable[int]]) -> bytes:
    """A ``KIND_DELIVERED`` payload."""
    return json.dumps({name: sorted(seqs) for name, seqs in marks.items()}).encode()


def decode_marks(payload: bytes) -> dict[str, list[int]]:
    """Exporter name -> delivered sequence numbers; malformed parts are left out."""
    try:
        data = json.loads(payload)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    out: dict[str, list[int]] = {}
    for name, seqs in data.items():
        if isinstance(name, str) and isinstance(seqs, list):
            out[name] = [s for s in seqs if isinstance(s, int) and not isinstance(s, bool)]
    return out


def result_metrics(span: Span) -> set[str]:
    """The metrics with a result (a score or an error) written on ``span``."""
    found: set[str] = set()
    for kv in span.attributes:
        key = kv.key
        if key.startswith(_EVAL_LEAD):
            metric, dot, fld = key[len(_EVAL_LEAD) :].partition(".")
            if dot and fld in _RESULT_FIELDS:
                found.add(metric)
    return found


@dataclass(slots=True)
class Logged:
    """What the log holds for one evaluated span at start: a copy of the span with the
    results written on it, and the metrics of carrier spans linked to it."""

    span: Span | None = None
    carried: set[str] = field(default_factory=set)

    def metrics(self) -> set[str]:
        """Every metric with a logged result for the span."""
        done = set(self.carried)
        if self.span is not None:
            done |= result_metrics(self.span)
        return done


class Hold:
    """The trace processor will forward outputs made from a trace after the trace
    itself: its log entries stay until :meth:`release` is called and every output
    forwarded through :meth:`forward` is logged."""

    __slots__ = ("_forward", "_pending", "_released", "_unpin", "sources")

    def __init__(
        self,
        sources: list[int],
        forward: Callable[[AssembledTrace, Hold], None],
        unpin: Callable[[list[int]], None],
    ) -> None:
        self.sources = sources
        self._forward = forward
        self._unpin = unpin
        self._pending = 0
        self._released = False

    def forward(self, trace: AssembledTrace) -> None:
        """Forward an output (a carrier span's trace) made from the held trace: it is
        logged, then handed to the exporters."""
        self._forward(trace, self)

    def release(self) -> None:
        """No further output will come (idempotent)."""
        if not self._released:
            self._released = True
            self._maybe_unpin()

    # The pipeline's side: outputs being logged.
    def logging(self) -> None:
        self._pending += 1

    def logged(self) -> None:
        self._pending -= 1
        self._maybe_unpin()

    def _maybe_unpin(self) -> None:
        if self._released and self._pending <= 0 and self.sources:
            sources, self.sources = self.sources, []
            self._unpin(sources)


class OutputLedger:
    """The trace processor's view of the log (given to it by the pipeline)."""

    def __init__(
        self,
        *,
        hold: Callable[[AssembledTrace], Hold],
        results: Callable[[AssembledTrace, list[Span]], None],
        reached: Callable[[AssembledTrace], bool] | None = None,
    ) -> None:
        self._hold = hold
        self._results = results
        self._reached = reached
        #: (trace id, span id) -> what the log held for that span at start.
        self._logged: dict[tuple[bytes, bytes], Logged] = {}

    def hold(self, trace: AssembledTrace) -> Hold:
        """Keep ``trace``'s log entries until the returned hold is released."""
        return self._hold(trace)

    def results(self, trace: AssembledTrace, spans: list[Span]) -> None:
        """Log ``spans`` of ``trace`` with the results just written on them, before
        the trace is forwarded: a replay of the trace takes them from the log."""
        if spans:
            self._results(trace, spans)

    def reached(self, trace: AssembledTrace) -> bool:
        """Whether some exporter had any of ``trace``'s entries before the restart (a
        replayed delivery mark says so): what is computed for it now must follow on a
        carrier span, since a result written on the span would not reach that exporter."""
        return self._reached is not None and self._reached(trace)

    @property
    def replayed_results(self) -> bool:
        """Whether any result was found in the log at start (cheap check)."""
        return bool(self._logged)

    def logged(self, trace_id: bytes, span_id: bytes) -> Logged | None:
        """What the log held for this span at start (taken: asked once)."""
        if not self._logged:
            return None
        return self._logged.pop((trace_id, span_id), None)

    def forget(self) -> None:
        """Drop what was found at start and not asked for (its traces were settled
        before the restart, or have been evaluated since)."""
        self._logged.clear()

    # The pipeline's side, during replay.
    def found(self, groups: list[SpanGroup], is_carrier: Callable[[Span], bool]) -> list[SpanGroup]:
        """Index the spans of a replayed output record; return its carrier spans (to
        deliver), grouped as they were."""
        carriers: list[SpanGroup] = []
        for group in groups:
            kept: list[Span] = []
            for span in group.spans:
                if is_carrier(span):
                    kept.append(span)
                    target = span.links[0].span_id
                    entry = self._logged.setdefault((span.trace_id, target), Logged())
                    entry.carried |= result_metrics(span)
                else:
                    entry = self._logged.setdefault((span.trace_id, span.span_id), Logged())
                    entry.span = span
            if kept:
                carriers.append(
                    SpanGroup(
                        group.resource,
                        group.resource_schema_url,
                        group.scope,
                        group.scope_schema_url,
                        kept,
                    )
                )
        return carriers
