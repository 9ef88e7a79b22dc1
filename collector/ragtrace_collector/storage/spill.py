"""Without a write-ahead log: know what a shutdown could not deliver, and write it out.

:class:`Outstanding` counts, for every span group handed to the exporters, how many
exporters have not settled it yet (delivered, or given up for good).  What is left
when the exporters' shutdown deadline has passed is what the process would lose.
:func:`write_spill` writes those spans to ``shutdown.spill_path`` as OTLP/JSON lines,
one ``ExportTraceServiceRequest`` per line: the file exporter's format, which
``ragtrace-collector replay FILE --endpoint URL`` sends to a collector again.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Final

from ragtrace_collector.otlp.codec import SpanGroup, build_request, encode_json

__all__ = ["Outstanding", "write_spill"]

#: Spans per line of the spill file.
_SPANS_PER_LINE: Final = 1000


class Outstanding:
    """Span groups not yet settled by every exporter."""

    def __init__(self, exporters: int) -> None:
        self._exporters = exporters
        self._groups: dict[int, tuple[SpanGroup, int]] = {}

    def forwarded(self, groups: Iterable[SpanGroup]) -> None:
        for group in groups:
            if group.spans:
                self._groups[id(group)] = (group, self._exporters)

    def settle(self, groups: Iterable[SpanGroup]) -> None:
        for group in groups:
            entry = self._groups.get(id(group))
            if entry is None or entry[0] is not group:
                continue
            if entry[1] <= 1:
                del self._groups[id(group)]
            else:
                self._groups[id(group)] = (group, entry[1] - 1)

    def groups(self) -> list[SpanGroup]:
        return [group for group, _ in self._groups.values()]


def write_spill(path: Path, groups: list[SpanGroup]) -> int:
    """Append the spans of ``groups`` to ``path`` as OTLP/JSON lines; returns the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(path, "ab") as fh:
        batch: list[SpanGroup] = []
        spans = 0
        for group in groups:
            batch.append(group)
            spans += len(group.spans)
            if spans >= _SPANS_PER_LINE:
                fh.write(encode_json(build_request(batch)) + b"\n")
                written += spans
                batch, spans = [], 0
        if batch:
            fh.write(encode_json(build_request(batch)) + b"\n")
            written += spans
        fh.flush()
    return written
