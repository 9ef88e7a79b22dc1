"""What choosing the id source per service costs case building.

Every case with reference ids asks :class:`DocumentIds` which id of each document to
compare (docs/ground-truth.md, "Which document id is compared").  This script builds
cases (``build_cases``, the collector's own case building) from OpenInference-shaped
traces, a CHAIN root with reference ids over a RETRIEVER with ``--docs`` documents,
each with a ``document.id`` and a ``metadata.doc_id``, spread over ``--services``
services, with ``--hit`` of the cases retrieving a reference id and the others none.

Measured in the same run (CPU time per case, best of ``--rounds``, interleaved):

* ``automatic``: no ``cases.document_id``, the collector chooses per service (the
  first round of each service decides it; the best round is a decided service);
* ``configured``: ``cases.document_id`` set to the same default order, where nothing
  is chosen (the baseline: what reading the ids costs);
* ``no reference``: the same traces without reference ids (no id choice at all).

Then the choice alone (``DocumentIds.choose`` on the same documents, already read),
automatic against configured, which is steadier than whole case building on a shared
machine.  Prints the added cost per case of the automatic choice over the baseline.

    .venv/bin/python benchmarks/id_choice.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from collector_throughput import _best_cpu_us  # this folder, on the path above


def _traces(n: int, docs: int, services: int, hit: float, reference: bool) -> list[Any]:
    from opentelemetry.proto.trace.v1 import trace_pb2

    from ragtrace import semconv as sc
    from ragtrace_collector.otlp.spanattrs import set_attributes

    rng = random.Random(7)
    out = []
    for i in range(n):
        tid = rng.randbytes(16)
        root = trace_pb2.Span(trace_id=tid, span_id=rng.randbytes(8), name="query")
        ids = [f"chunk-{i}-{k}" for k in range(docs)]
        ref = [ids[0]] if rng.random() < hit else [f"chunk-other-{i}"]
        values: list[tuple[str, Any]] = [
            (sc.OPENINFERENCE_SPAN_KIND, sc.OI_KIND_CHAIN),
            (sc.INPUT_VALUE, f"question {i}"),
            (sc.OUTPUT_VALUE, f"answer {i}"),
        ]
        if reference:
            values.append((sc.REFERENCE_CONTEXT_IDS, json.dumps(ref)))
        set_attributes(root.attributes, values)
        retriever = trace_pb2.Span(
            trace_id=tid, span_id=rng.randbytes(8), parent_span_id=root.span_id, name="retrieve"
        )
        attrs: list[tuple[str, Any]] = [(sc.OPENINFERENCE_SPAN_KIND, sc.OI_KIND_RETRIEVER)]
        for k, doc_id in enumerate(ids):
            key = sc.RETRIEVAL_DOCUMENTS
            attrs += [
                (sc.document_attr(key, k, sc.DOCUMENT_ID), doc_id),
                (sc.document_attr(key, k, sc.DOCUMENT_CONTENT), f"text of {doc_id}"),
                (
                    sc.document_attr(key, k, sc.DOCUMENT_METADATA),
                    json.dumps({"doc_id": f"doc-{i % 50}", "page": k}),
                ),
            ]
        set_attributes(retriever.attributes, attrs)
        out.append((f"svc-{i % services}", [root, retriever]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--docs", type=int, default=5)
    parser.add_argument("--services", type=int, default=20)
    parser.add_argument("--hit", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import logging

    import structlog

    # the overlap warnings of the all-miss runs are expected: not printed
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))

    from ragtrace_collector.evaluation.case_builder import CaseRules, CasesConfig, build_cases
    from ragtrace_collector.evaluation.document_ids import DEFAULT_SOURCES

    traces = _traces(args.cases, args.docs, args.services, args.hit, reference=True)
    bare = _traces(args.cases, args.docs, args.services, args.hit, reference=False)
    automatic = CaseRules(watch_ids=True)
    configured = CaseRules(CasesConfig(document_id=list(DEFAULT_SOURCES)), watch_ids=True)
    plain = CaseRules(watch_ids=True)

    def run(rules: CaseRules, items: list[Any]) -> list[Any]:
        return [
            build_cases(spans, rules=rules, service_of=lambda s, name=name: name, prefiltered=True)
            for name, spans in items
        ]

    for built in run(automatic, traces):  # the services decide; every case is one
        assert len(built) == 1
        assert built[0].case.retrieved_context_ids is not None
    auto_us, conf_us, bare_us = _best_cpu_us(
        args.cases,
        args.rounds,
        lambda: run(automatic, traces),
        lambda: run(configured, traces),
        lambda: run(plain, bare),
    )
    print(
        f"{args.cases} cases, {args.docs} documents each, {args.services} services,"
        f" {args.hit:.0%} retrieving a reference id; CPU per case, best of {args.rounds}"
    )
    print(f"  automatic (per-service choice): {auto_us:8.2f} us")
    print(f"  configured (cases.document_id): {conf_us:8.2f} us  (baseline)")
    print(f"  no reference ids:               {bare_us:8.2f} us")
    print(
        f"  added by the choice: {auto_us - conf_us:+.2f} us per case"
        f" ({auto_us / conf_us:.3f}x the baseline)"
    )
    _choice_alone(args, traces)
    return 0


def _choice_alone(args: argparse.Namespace, traces: list[Any]) -> None:
    from ragtrace_collector.evaluation.case_builder import CaseRules
    from ragtrace_collector.evaluation.document_ids import DEFAULT_SOURCES, DocumentIds

    rules = CaseRules()
    read = []
    for name, spans in traces:  # the documents as case building reads them
        [case] = build_docs(spans, rules, name)
        read.append(case)
    automatic = DocumentIds(watch=False)
    configured = DocumentIds(list(DEFAULT_SOURCES), watch=False)

    def run(ids: DocumentIds) -> None:
        for service, docs, conventions, reference in read:
            ids.choose(service, docs, conventions, reference)

    run(automatic)
    auto_us, conf_us = _best_cpu_us(
        len(read), args.rounds, lambda: run(automatic), lambda: run(configured)
    )
    print("the choice alone (DocumentIds.choose), CPU per case:")
    print(f"  automatic: {auto_us:6.2f} us   configured: {conf_us:6.2f} us (baseline)")
    print(f"  added by the choice: {auto_us - conf_us:+.2f} us per case")


def build_docs(spans: list[Any], rules: Any, service: str) -> list[Any]:
    """(service, documents, conventions, reference ids) of each case of ``spans``."""
    import json

    from ragtrace import semconv as sc
    from ragtrace_collector.evaluation import case_builder as cb

    nodes = {s.span_id: cb._Node(s, rules) for s in spans}
    out = []
    for node in nodes.values():
        if node.role is not cb.Role.ROOT:
            continue
        groups = [[n] for n in nodes.values() if n.role is cb.Role.RETRIEVER]
        found = cb._context_docs(groups, [])
        assert found is not None
        reference = json.loads(node.attrs[sc.REFERENCE_CONTEXT_IDS])
        out.append((service, found.docs, found.conventions, reference))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
