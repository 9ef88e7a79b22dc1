"""Score segments at run time: the values that label each case's scores (the
``segments:`` section and its labels are :mod:`ragtrace_collector.segments`).

Where a value is read, for each case: the case span's attributes, then its resource's,
then the retriever spans under it (the spans its retrieved documents were read from,
in rank order: the first that has the key).  ``retriever.name`` falls back to the name
of the first of those spans (the retriever's, or the reranker's when one reordered the
documents).  A case without the attribute has the value ``unset``; a value that is not
one of the key's ``max_values`` most frequent ones is ``other``.

**Top values.**  Each key keeps at most ``max_values`` values.  While there is room, a
new value is kept on sight; after that it is counted (with the values kept) and a value
that has become more frequent than the least frequent kept one takes its place at the
next rebalance: every ``_REBALANCE_EVERY`` cases or ``_REBALANCE_SECONDS``, whichever
comes first.  A kept value that has labelled no case for ``_IDLE_SECONDS`` counts as 0
there, so a new release with real traffic gets its own label within seconds of the
old one going quiet (and at once while there is room).
Counts decay (halve per ``_REBALANCE_EVERY`` cases, or per ``_HALF_LIFE_SECONDS``
when traffic is slower), so the top follows the traffic.  A rebalance runs before the
case that triggers it is labelled, so a value that lost its place is never handed out
again (its series, forgotten through ``on_evict``, never come back).  Each case
counted as ``other`` and each eviction is reported to ``telemetry``
(``ragtrace_segment_overflow_total``, ``ragtrace_segment_evictions_total``) and logged
once per value (``segment_value_overflow``, ``segment_value_evicted``; the last
``_LOGGED_PER_KEY`` values of a key are remembered, and a key logs at most
``_LOGS_PER_MINUTE`` lines a minute).  Memory per key: ``max_values``
kept plus at most ``max_values`` counted candidates, and the remembered values.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.component.logs import get_logger
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.otlp.spanattrs import any_value_to_python
from ragtrace_collector.segments import OTHER, UNSET, SegmentKey

__all__ = ["SegmentValues", "Segments"]

#: Label values are cut to this many characters (a very long attribute value would
#: otherwise make every scrape carry it).
_MAX_VALUE_CHARS = 128
#: Cases between two rebalances of a key's top values (at most).
_REBALANCE_EVERY = 1000
#: Seconds between two rebalances (at most), whatever the traffic.
_REBALANCE_SECONDS = 5.0
#: A kept value without a case for this long gives its place to any counted candidate.
_IDLE_SECONDS = 10.0
#: Counts halve per _REBALANCE_EVERY cases, or per this many seconds if that is faster.
_HALF_LIFE_SECONDS = 60.0
#: Values whose overflow or eviction was logged, remembered per key.
_LOGGED_PER_KEY = 1000
#: Log lines per key and minute at most (a key with a long tail of values, say a
#: user id, must not log every case); the metrics count every one.
_LOGS_PER_MINUTE = 10

_log = get_logger("segments")


class SegmentValues:
    """The raw segment values of one case, read when it is admitted; :meth:`Segments.labels`
    turns them into label values when its results are recorded."""

    __slots__ = ("values",)

    def __init__(self, values: tuple[str | None, ...]) -> None:
        self.values = values


class _Top:
    """The kept values of one key, with decaying counts (see the module doc)."""

    __slots__ = ("candidates", "kept", "last_seen", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: dict[str, float] = {}
        self.candidates: dict[str, float] = {}
        #: kept value -> when it last labelled a case
        self.last_seen: dict[str, float] = {}

    def label(self, value: str, now: float) -> str:
        kept = self.kept
        count = kept.get(value)
        if count is not None:
            kept[value] = count + 1.0
            self.last_seen[value] = now
            return value
        if len(kept) < self.limit:
            kept[value] = 1.0
            self.last_seen[value] = now
            return value
        candidates = self.candidates
        count = candidates.get(value)
        if count is not None:
            candidates[value] = count + 1.0
        elif len(candidates) < self.limit:
            candidates[value] = 1.0
        else:  # space-saving: the new value takes the least counted one's place
            low = min(candidates, key=candidates.__getitem__)
            candidates[value] = candidates.pop(low) + 1.0
        return OTHER

    def rebalance(self, now: float, decay: float = 0.5) -> list[str]:
        """Promote candidates more frequent than kept values (a kept value idle for
        ``_IDLE_SECONDS`` counts as 0); multiply every count by ``decay``.  Returns the
        values that lost their place."""
        evicted: list[str] = []
        kept, candidates, last_seen = self.kept, self.candidates, self.last_seen

        def weight(value: str) -> float:
            return kept[value] if now - last_seen[value] < _IDLE_SECONDS else 0.0

        for value, count in sorted(candidates.items(), key=lambda item: -item[1]):
            low = min(kept, key=weight)
            if count <= weight(low) or count < 1.0:
                break
            del candidates[value]
            candidates[low] = kept.pop(low)
            del last_seen[low]
            kept[value] = count
            last_seen[value] = now
            evicted.append(low)
        for table in (kept, candidates):
            for value in table:
                table[value] *= decay
        return evicted


class Segments:
    """The configured segment keys: reads a case's values and bounds their cardinality.

    ``on_evict(index, value)`` is called when ``value`` of the ``index``-th key is no
    longer kept (its series can be forgotten).  ``clock`` (monotonic seconds) times the
    rebalances; tests inject a fake one.  Not thread-safe: :meth:`read` and
    :meth:`labels` run on the event loop."""

    def __init__(
        self,
        keys: Sequence[SegmentKey],
        on_evict: Callable[[int, str], None] | None = None,
        *,
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys: tuple[str, ...] = tuple(k.key for k in keys)
        #: Prometheus labels, in the order of :attr:`keys`.
        self.labels_names: tuple[str, ...] = tuple(k.label for k in keys)
        self._index = {key: i for i, key in enumerate(self.keys)}
        self._tops = [_Top(k.max_values) for k in keys]
        self._on_evict: list[Callable[[int, str], None]] = [on_evict] if on_evict else []
        self._count = 0
        self._clock = clock
        self._rebalanced_at = clock()
        self._logged: list[OrderedDict[tuple[str, str], None]] = [OrderedDict() for _ in keys]
        #: Per key: the minute of the last log lines, and their number in it.
        self._log_minute = [0.0 for _ in keys]
        self._log_lines = [0 for _ in keys]
        self._overflow = (
            [telemetry.segment_overflow.labels(key=k) for k in self.keys]
            if telemetry is not None
            else None
        )
        self._evictions = (
            [telemetry.segment_evictions.labels(key=k) for k in self.keys]
            if telemetry is not None
            else None
        )

    def __bool__(self) -> bool:
        return bool(self.keys)

    def index(self, key: str) -> int:
        """Position of ``key`` in the label tuples (KeyError if not configured)."""
        return self._index[key]

    def add_evict_listener(self, listener: Callable[[int, str], None]) -> None:
        self._on_evict.append(listener)

    def read(
        self,
        span_attributes: Mapping[str, Any],
        resource_attributes: Iterable[Any] | None,
        retrievers: Sequence[trace_pb2.Span] = (),
    ) -> SegmentValues:
        """The raw values of a case: from ``span_attributes`` (the case span's decoded
        attributes), the resource's ``KeyValue`` s, then the ``retrievers``' attributes."""
        found: list[str | None] = [_text(span_attributes.get(key)) for key in self.keys]
        if None in found and resource_attributes is not None:
            self._fill(found, resource_attributes)
        if None in found and retrievers:
            for span in retrievers:
                self._fill(found, span.attributes)
            i = self._index.get(semconv.SEGMENT_RETRIEVER_NAME)
            if i is not None and found[i] is None:
                found[i] = _text(retrievers[0].name)
        return SegmentValues(tuple(found))

    def _fill(self, found: list[str | None], attributes: Iterable[Any]) -> None:
        """The values still missing from ``found``, read from ``KeyValue`` s."""
        for kv in attributes:
            i = self._index.get(kv.key)
            if i is not None and found[i] is None:
                found[i] = _text(any_value_to_python(kv.value))

    def missing_on_span(
        self, values: SegmentValues, span_attributes: Mapping[str, Any]
    ) -> list[tuple[str, str]]:
        """The ``(key, value)`` pairs to write onto the case span: the values found
        elsewhere (resource, retrievers) that the span does not carry."""
        return [
            (key, value)
            for key, value in zip(self.keys, values.values, strict=True)
            if value is not None and key not in span_attributes
        ]

    def labels(self, values: SegmentValues) -> tuple[str, ...]:
        """The label values of a case (``unset``, ``other`` or the value), counting it
        toward its keys' top values.  A due rebalance runs first."""
        self._count += 1
        now = self._clock()
        elapsed = now - self._rebalanced_at
        if self._count >= _REBALANCE_EVERY or elapsed >= _REBALANCE_SECONDS:
            halvings = max(self._count / _REBALANCE_EVERY, elapsed / _HALF_LIFE_SECONDS)
            self._count = 0
            self._rebalanced_at = now
            self._rebalance(now, 0.5**halvings)
        out = tuple(
            UNSET if value is None else top.label(value, now)
            for top, value in zip(self._tops, values.values, strict=True)
        )
        if OTHER in out:
            for i, (label, value) in enumerate(zip(out, values.values, strict=True)):
                if label == OTHER and value is not None:
                    self._overflowed(i, value, now)
        return out

    def _rebalance(self, now: float, decay: float) -> None:
        for i, top in enumerate(self._tops):
            for value in top.rebalance(now, decay):
                if self._evictions is not None:
                    self._evictions[i].inc()
                if self._first_log(i, ("evicted", value), now):
                    _log.info(
                        "segment_value_evicted",
                        key=self.keys[i],
                        value=value,
                        detail="no longer among the key's most frequent values: its cases now"
                        " count as `other` and its series leave /metrics",
                    )
                for listener in self._on_evict:
                    listener(i, value)

    def _overflowed(self, i: int, value: str, now: float) -> None:
        if self._overflow is not None:
            self._overflow[i].inc()
        if self._first_log(i, ("other", value), now):
            _log.info(
                "segment_value_overflow",
                key=self.keys[i],
                value=value,
                max_values=self._tops[i].limit,
                detail="counted as `other` until it is more frequent than a kept value",
            )

    def _first_log(self, i: int, item: tuple[str, str], now: float) -> bool:
        """Whether to log ``item`` for key ``i``: not logged yet (then remembered), and
        the key's lines this minute within ``_LOGS_PER_MINUTE``."""
        seen = self._logged[i]
        if item in seen:
            seen.move_to_end(item)
            return False
        if now - self._log_minute[i] >= 60.0:
            self._log_minute[i], self._log_lines[i] = now, 0
        if self._log_lines[i] >= _LOGS_PER_MINUTE:
            return False  # not remembered: logged once the rate allows
        self._log_lines[i] += 1
        seen[item] = None
        if len(seen) > _LOGGED_PER_KEY:
            seen.popitem(last=False)
        return True

    def kept(self, key: str) -> list[str]:
        """The values of ``key`` currently kept (most frequent first)."""
        top = self._tops[self._index[key]]
        return sorted(top.kept, key=lambda v: -top.kept[v])


def _text(value: Any) -> str | None:
    """An attribute value as a label value; None for a missing or empty one."""
    if value is None:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list | tuple):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    text = text.strip()
    return text[:_MAX_VALUE_CHARS] if text else None
