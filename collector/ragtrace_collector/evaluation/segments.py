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
next rebalance (every ``_REBALANCE_EVERY`` cases; counts then halve, so the top follows
the traffic).  The value that lost its place is reported through ``on_evict`` so the
score metrics forget its series.  Memory per key: ``max_values`` kept plus at most
``max_values`` counted candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.otlp.spanattrs import any_value_to_python
from ragtrace_collector.segments import OTHER, UNSET, SegmentKey

__all__ = ["SegmentValues", "Segments"]

#: Label values are cut to this many characters (a very long attribute value would
#: otherwise make every scrape carry it).
_MAX_VALUE_CHARS = 128
#: Cases between two rebalances of a key's top values.
_REBALANCE_EVERY = 1000


class SegmentValues:
    """The raw segment values of one case, read when it is admitted; :meth:`Segments.labels`
    turns them into label values when its results are recorded."""

    __slots__ = ("values",)

    def __init__(self, values: tuple[str | None, ...]) -> None:
        self.values = values


class _Top:
    """The kept values of one key, with decaying counts (see the module doc)."""

    __slots__ = ("candidates", "kept", "limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: dict[str, float] = {}
        self.candidates: dict[str, float] = {}
        self.seen = 0

    def label(self, value: str) -> str:
        kept = self.kept
        count = kept.get(value)
        if count is not None:
            kept[value] = count + 1.0
            return value
        if len(kept) < self.limit:
            kept[value] = 1.0
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

    def rebalance(self) -> list[str]:
        """Promote candidates more frequent than kept values; halve every count.
        Returns the values that lost their place."""
        evicted: list[str] = []
        kept, candidates = self.kept, self.candidates
        for value, count in sorted(candidates.items(), key=lambda item: -item[1]):
            low = min(kept, key=kept.__getitem__)
            if count <= kept[low]:
                break
            del candidates[value]
            candidates[low] = kept.pop(low)
            kept[value] = count
            evicted.append(low)
        for table in (kept, candidates):
            for value in table:
                table[value] *= 0.5
        return evicted


class Segments:
    """The configured segment keys: reads a case's values and bounds their cardinality.

    ``on_evict(index, value)`` is called when ``value`` of the ``index``-th key is no
    longer kept (its series can be forgotten).  Not thread-safe: :meth:`read` and
    :meth:`labels` run on the event loop."""

    def __init__(
        self,
        keys: Sequence[SegmentKey],
        on_evict: Callable[[int, str], None] | None = None,
    ) -> None:
        self.keys: tuple[str, ...] = tuple(k.key for k in keys)
        #: Prometheus labels, in the order of :attr:`keys`.
        self.labels_names: tuple[str, ...] = tuple(k.label for k in keys)
        self._index = {key: i for i, key in enumerate(self.keys)}
        self._tops = [_Top(k.max_values) for k in keys]
        self._on_evict: list[Callable[[int, str], None]] = [on_evict] if on_evict else []
        self._count = 0

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
        toward its keys' top values."""
        out = tuple(
            UNSET if value is None else top.label(value)
            for top, value in zip(self._tops, values.values, strict=True)
        )
        self._count += 1
        if self._count >= _REBALANCE_EVERY:
            self._count = 0
            self._rebalance()
        return out

    def _rebalance(self) -> None:
        for i, top in enumerate(self._tops):
            for value in top.rebalance():
                for listener in self._on_evict:
                    listener(i, value)

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
