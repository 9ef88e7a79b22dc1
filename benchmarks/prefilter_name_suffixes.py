"""What recognising retrievers by span name costs the non-RAG fast path.

The OpenLLMetry LlamaIndex instrumentation writes its retriever spans as plain
``traceloop.span.kind = task`` spans named ``<class>Retriever.task``; the prefilter
(:meth:`CaseRules.may_hold_case`) finds them by their name endings
(``Convention.name_suffixes``).  This script measures that check on traces with no
retriever, against the same prefilter without the name endings, in the same run (CPU
time, best of ``--rounds``, interleaved), on two kinds of non-RAG traffic:

* ``openinference``: the traces of ``collector_throughput.py --only nonrag`` (a CHAIN
  root and LLM children);
* ``llamaindex-task``: an OpenLLMetry LlamaIndex trace without a retriever (every span
  a ``task`` with ``traceloop.entity.name/input/output``, as the instrumentation writes
  them: embeddings, splitters, a synthesizer, the LLM).

Prints the added cost per span (the budget is 0.65 us per non-RAG span).

    .venv/bin/python benchmarks/prefilter_name_suffixes.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from collector_throughput import _best_cpu_us  # this folder, on the path above


def _span(name: str, attrs: dict[str, Any], parent: Any = None) -> Any:
    from opentelemetry.proto.trace.v1 import trace_pb2

    from ragtrace_collector.otlp.spanattrs import set_attributes

    span = trace_pb2.Span(
        trace_id=os.urandom(16),
        span_id=os.urandom(8),
        parent_span_id=parent.span_id if parent is not None else b"",
        name=name,
        start_time_unix_nano=time.time_ns(),
        end_time_unix_nano=time.time_ns() + 1_000_000,
    )
    set_attributes(span.attributes, attrs.items())
    return span


def _openinference_traces(n: int, spans: int) -> list[list[Any]]:
    """The non-RAG traces of ``collector_throughput.py --only nonrag``."""
    from collector_throughput import _non_rag_traces

    return [list(t.groups[0].spans) for t in _non_rag_traces(n, spans)]


def _llamaindex_task_trace(spans: int) -> list[Any]:
    from ragtrace import semconv as sc

    names = [
        "RetrieverQueryEngine",
        "CompactAndRefine",
        "TokenTextSplitter",
        "SentenceSplitter",
        "DefaultRefineProgram",
        "MockLLM",
        "MockEmbedding",
    ]
    out: list[Any] = []
    for i in range(spans):
        kind = sc.TRACELOOP_KIND_TASK if i else sc.TRACELOOP_KIND_WORKFLOW
        name = f"{names[i % len(names)]}.{kind}"
        out.append(
            _span(
                name,
                {
                    sc.TRACELOOP_SPAN_KIND: kind,
                    "traceloop.entity.name": name,
                    sc.TRACELOOP_ENTITY_INPUT: json.dumps({"query_str": "What is the capital?"}),
                    sc.TRACELOOP_ENTITY_OUTPUT: json.dumps("text " * 12),
                },
                out[0] if out else None,
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=5000)
    parser.add_argument("--spans", type=int, default=10, help="spans per trace")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    from ragtrace_collector.evaluation.case_builder import CaseRules

    with_names = CaseRules()
    assert with_names.name_suffixes, "this version has no name endings to measure"
    without = CaseRules()
    without.name_suffixes = ()  # the same prefilter, blind to the name endings

    results: dict[str, dict[str, float]] = {}
    for kind, traces in (
        ("openinference", _openinference_traces(args.traces, args.spans)),
        ("llamaindex-task", [_llamaindex_task_trace(args.spans) for _ in range(args.traces)]),
    ):
        assert not any(with_names.may_hold_case(t) for t in traces), "a non-RAG trace held"
        spans = args.traces * args.spans
        base, named = _best_cpu_us(
            spans,
            args.rounds,
            lambda traces=traces: [without.may_hold_case(t) for t in traces],
            lambda traces=traces: [with_names.may_hold_case(t) for t in traces],
        )
        results[kind] = {"without_us": base, "with_us": named, "added_us": named - base}

    print(
        f"prefilter per non-RAG span ({args.traces:,} traces x {args.spans} spans, "
        f"CPU time, best of {args.rounds})"
    )
    print(f"{'traffic':<18}{'without names':>15}{'with names':>12}{'added':>9}")
    for kind, r in results.items():
        print(
            f"{kind:<18}{r['without_us']:>12.3f} us{r['with_us']:>9.3f} us{r['added_us']:>6.3f} us"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
