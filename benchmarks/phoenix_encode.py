"""Time the Phoenix exporter's encoding of a batch against the OTLP/HTTP exporter's.

The Phoenix exporter encodes like the OTLP/HTTP exporter and also reads the
annotations off every span (one pass over its attributes; JSON building only for the
spans that carry results).  Batches of 1,000 traces of 4 spans: the ``@rag`` span, a
retriever with 5 documents, a generator and one more child.  Two runs: no span
evaluated (plain forwarding), and every ``@rag`` span enriched with 6 metric results
and per-document verdicts.  The baseline is ``OtlpHttpExporter._encode`` on the same
batch, in the same run; the ratio is the annotation reading's overhead.  Times are the
calling thread's CPU time (best of ``--repeat``), steadier than wall time on a busy
machine.

Run: ``.venv/bin/python benchmarks/phoenix_encode.py [--traces N] [--repeat R]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence

from ragtrace import semconv
from ragtrace_collector.evaluation.enrichment import EnrichmentConfig, EvalSummary, enrich_span
from ragtrace_collector.exporters.config import OtlpHttpExporterConfig, PhoenixExporterConfig
from ragtrace_collector.exporters.otlp_http import OtlpHttpExporter
from ragtrace_collector.exporters.phoenix import PhoenixExporter
from ragtrace_collector.otlp.codec import Span, SpanGroup
from ragtrace_collector.otlp.spanattrs import set_attributes
from ragtrace_collector.results import MetricResult

_METRICS = (
    "id_context_recall",
    "id_context_precision",
    "non_llm_context_recall",
    "non_llm_context_precision",
    "contextual_recall",
    "contextual_precision",
)


def _span(trace_id: bytes, parent: Span | None, kind: str, values: dict[str, object]) -> Span:
    span = Span(
        trace_id=trace_id,
        span_id=os.urandom(8),
        parent_span_id=parent.span_id if parent is not None else b"",
        name=kind,
        start_time_unix_nano=1,
        end_time_unix_nano=2,
    )
    set_attributes(span.attributes, [(semconv.RAGTRACE_SPAN_KIND, kind), *values.items()])
    return span


def _batch(traces: int, *, evaluated: bool) -> list[SpanGroup]:
    groups = []
    for _ in range(traces):
        trace_id = os.urandom(16)
        rag = _span(trace_id, None, "rag", {semconv.INPUT_VALUE: "q " * 20, "session.id": "s"})
        docs: dict[str, object] = {}
        for i in range(5):
            docs[semconv.document_attr(semconv.RETRIEVAL_DOCUMENTS, i, semconv.DOCUMENT_ID)] = (
                f"doc-{i}"
            )
            docs[
                semconv.document_attr(semconv.RETRIEVAL_DOCUMENTS, i, semconv.DOCUMENT_CONTENT)
            ] = "content " * 25
        retriever = _span(trace_id, rag, "retriever", docs)
        spans = [
            rag,
            retriever,
            _span(trace_id, rag, "generator", {}),
            _span(trace_id, rag, "tool", {}),
        ]
        if evaluated:
            results = [
                MetricResult(metric=m, score=0.4, passed=False, reason="r " * 30) for m in _METRICS
            ]
            verdicts = json.dumps(
                [
                    {"span_id": retriever.span_id.hex(), "position": i, "score": 1.0}
                    for i in range(5)
                ]
            )
            extra = {m: {semconv.EVAL_FIELD_DOCUMENTS: verdicts} for m in _METRICS[:2]}
            enrich_span(
                rag, results, EvalSummary("offline", 1.0, 1.0, extra=extra), EnrichmentConfig()
            )
        groups.append(SpanGroup(None, "", None, "", spans))
    return groups


async def _time(
    encode: Callable[[Sequence[SpanGroup]], Awaitable[bytes]], groups: list[SpanGroup], repeat: int
) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        await encode(groups)
        best = min(best, time.thread_time() - t0)
    return best


async def main(traces: int, repeat: int) -> None:
    endpoint = "http://127.0.0.1:6006"
    from ragtrace_collector.component.telemetry import Telemetry

    otlp = OtlpHttpExporter(
        "otlp",
        OtlpHttpExporterConfig(type="otlp_http", endpoint=endpoint, compression="none"),
        Telemetry(),
    )
    phoenix = PhoenixExporter(
        "phoenix",
        PhoenixExporterConfig(
            type="phoenix", endpoint=endpoint, compression="none", project="bench"
        ),
        Telemetry(),
    )
    spans = traces * 4
    for evaluated in (False, True):
        groups = _batch(traces, evaluated=evaluated)
        base = await _time(otlp._encode, groups, repeat)
        mine = await _time(phoenix._encode, groups, repeat)
        label = "every @rag span evaluated" if evaluated else "no span evaluated"
        print(
            f"{label:28s} otlp_http {base / spans * 1e6:6.2f} µs/span   "
            f"phoenix {mine / spans * 1e6:6.2f} µs/span   ratio {mine / base:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.traces, args.repeat))
