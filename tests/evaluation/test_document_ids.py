"""Which id of a retrieved document is compared with the reference ids
(``cases.document_id``, the automatic switch, generated ids, the overlap watch)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from ragtrace import semconv
from ragtrace_collector.assembly.assembler import AssembledTrace, ReleaseReason
from ragtrace_collector.component import ComponentHost
from ragtrace_collector.component.telemetry import Telemetry
from ragtrace_collector.config import ConfigError, parse_config
from ragtrace_collector.evaluation.case_builder import (
    BuiltCase,
    CaseRules,
    CasesConfig,
    build_cases,
)
from ragtrace_collector.evaluation.document_ids import (
    GENERATED,
    DocumentIds,
    IdOverlapWatch,
    id_kind,
)
from ragtrace_collector.evaluation.pool import _pack_payload, _unpack_case
from ragtrace_collector.metrics import build_metric
from ragtrace_collector.metrics.base import JudgeFreeMetric
from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.otlp.spanattrs import attributes_to_dict, set_attributes
from ragtrace_collector.service.stages import build_stage
from tests.fakes.spans import named_span


def _doc_attrs(docs: list[tuple[str | None, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {semconv.OPENINFERENCE_SPAN_KIND: "RETRIEVER"}
    for i, (doc_id, metadata) in enumerate(docs):
        key = semconv.RETRIEVAL_DOCUMENTS
        if doc_id is not None:
            out[semconv.document_attr(key, i, semconv.DOCUMENT_ID)] = doc_id
        out[semconv.document_attr(key, i, semconv.DOCUMENT_CONTENT)] = f"chunk {i}"
        if metadata:
            out[semconv.document_attr(key, i, semconv.DOCUMENT_METADATA)] = json.dumps(metadata)
    return out


def _llama_trace(
    docs: list[tuple[str | None, dict[str, Any]]], reference: list[str] | None
) -> list[trace_pb2.Span]:
    """OpenInference LlamaIndex: a CHAIN query span over a RETRIEVER whose documents
    have node UUIDs as document.id (as a splitter makes them)."""
    tid = os.urandom(16)
    attrs: dict[str, Any] = {
        semconv.OPENINFERENCE_SPAN_KIND: "CHAIN",
        semconv.INPUT_VALUE: "How long do refunds take?",
        semconv.OUTPUT_VALUE: "Five days.",
    }
    if reference is not None:
        attrs[semconv.REFERENCE_CONTEXT_IDS] = json.dumps(reference)
    root = named_span("RetrieverQueryEngine.query", attrs, tid=tid)
    return [
        root,
        named_span("VectorIndexRetriever.retrieve", _doc_attrs(docs), tid=tid, parent=root),
    ]


def _one(spans: list[trace_pb2.Span], rules: CaseRules, service: str = "svc") -> BuiltCase:
    [built] = build_cases(spans, rules=rules, service_of=lambda s: service)
    return built


def _score(metric: str, built: BuiltCase) -> tuple[float | None, str]:
    """The metric's result, checked to agree with its batch (fast) scorer."""
    scorer = build_metric(metric)
    assert isinstance(scorer, JudgeFreeMetric)
    result = scorer.measure_now(built.case)
    assert scorer.score_column([built.case]).scores == [result.score]
    return result.score, result.reason


def _uuid() -> str:
    return str(uuid.uuid4())


# ------------------------------------------------------------- the default
def test_node_uuids_switch_to_the_metadata_doc_id_that_matches() -> None:
    rules = CaseRules()
    docs = [(_uuid(), {"doc_id": "kb-02"}), (_uuid(), {}), (_uuid(), {"doc_id": "kb-03"})]
    built = _one(_llama_trace(docs, ["kb-02", "kb-01"]), rules)
    # the document without a doc_id keeps its (default) id, as a non-reference document
    assert built.case.retrieved_context_ids == ["kb-02", docs[1][0], "kb-03"]
    assert built.attributes[semconv.DOCUMENT_ID_SOURCE] == "metadata.doc_id, document.id"
    on_span = attributes_to_dict(built.span.attributes)
    assert on_span[semconv.DOCUMENT_ID_SOURCE] == "metadata.doc_id, document.id"
    assert _score("id_context_recall", built)[0] == pytest.approx(0.5)
    assert _score("id_context_precision", built)[0] == pytest.approx(1 / 3)
    assert [s.id for s in built.document_sources or []] == built.case.retrieved_context_ids


def test_default_ids_that_match_are_kept() -> None:
    rules = CaseRules()
    docs = [("kb-01", {"doc_id": "other-1"}), ("kb-09", {"doc_id": "other-2"})]
    built = _one(_llama_trace(docs, ["kb-01"]), rules)
    assert built.case.retrieved_context_ids == ["kb-01", "kb-09"]
    assert built.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"


def test_the_best_matching_source_wins_and_the_service_remembers_it() -> None:
    rules = CaseRules()
    docs = [(_uuid(), {"ref_doc_id": "kb-01", "chunk_id": "kb-01#3"})]
    built = _one(_llama_trace(docs, ["kb-01"]), rules, service="shop")
    assert built.case.retrieved_context_ids == ["kb-01"]
    # a later case of the same service that matches nothing keeps the kind of id
    miss = [("node-2", {"ref_doc_id": "kb-07", "chunk_id": "kb-07#1"})]
    later = _one(_llama_trace(miss, ["kb-01"]), rules, service="shop")
    assert later.case.retrieved_context_ids == ["kb-07"]
    assert _score("id_context_recall", later)[0] == 0.0
    # another service has not switched
    other = _one(_llama_trace(miss, ["kb-01"]), rules, service="blog")
    assert other.case.retrieved_context_ids == ["node-2"]


def test_a_plausible_default_is_switched_only_on_the_evidence_of_several_cases() -> None:
    """document.id "node-N" could be of the reference kind: a case where only
    metadata.ref_doc_id meets the reference is skipped (with the tally), not scored,
    until SWITCH_AFTER such cases chose ref_doc_id for the service."""
    from ragtrace_collector.evaluation.document_ids import SWITCH_AFTER

    rules = CaseRules()
    for n in range(SWITCH_AFTER - 1):
        docs = [(f"node-{n}", {"ref_doc_id": "kb-01"})]
        built = _one(_llama_trace(docs, ["kb-01"]), rules, service="shop")
        score, reason = _score("id_context_recall", built)
        assert score is None
        assert f"{n + 1} so far" in reason
        assert "cases.document_id" in reason
    assert rules.document_ids.source_of("shop") is None
    built = _one(_llama_trace([("node-9", {"ref_doc_id": "kb-01"})], ["kb-01"]), rules, "shop")
    assert rules.document_ids.source_of("shop") == "metadata.ref_doc_id"
    assert _score("id_context_recall", built)[0] == 1.0
    # a default id that meets a reference id chooses the default at once
    _one(_llama_trace([("kb-01", {"ref_doc_id": "x"})], ["kb-01"]), rules, service="blog")
    assert rules.document_ids.source_of("blog") == "default"


def test_the_per_service_state_is_bounded() -> None:
    ids = DocumentIds(max_services=3)
    assert ids.watch is not None
    docs = _one(_llama_trace([("kb-1", {})], ["kb-1"]), CaseRules()).case
    assert docs.retrieved_context_ids == ["kb-1"]
    for n in range(10):
        spans = _llama_trace([("kb-1", {})], ["kb-1"])
        rules = CaseRules()
        rules.document_ids = ids
        built = _one(spans, rules, service=f"s{n}")
        assert built.case.retrieved_context_ids == ["kb-1"]
    assert [s for s in (f"s{n}" for n in range(10)) if ids.source_of(s)] == ["s7", "s8", "s9"]
    assert sorted(ids.watch.shares()) == ["s7", "s8", "s9"]


def test_no_reference_ids_no_switch() -> None:
    built = _one(_llama_trace([("n-1", {"doc_id": "kb-1"})], None), CaseRules())
    assert built.case.retrieved_context_ids == ["n-1"]
    assert semconv.DOCUMENT_ID_SOURCE not in built.attributes


# ------------------------------------------------------------ generated ids
def test_generated_ids_against_document_names_are_skipped_with_the_reason() -> None:
    rules = CaseRules()
    docs = [(_uuid(), {}), ("a" * 64, {})]  # a LlamaIndex node UUID, a Haystack SHA-256
    built = _one(_llama_trace(docs, ["kb-01", "kb-02"]), rules)
    for metric in ("id_context_recall", "id_context_precision"):
        score, reason = _score(metric, built)
        assert score is None
        assert "framework generated" in reason
        assert "cases.document_id" in reason
    # the same kind on both sides is compared (a real 0)
    refs = [_uuid()]
    same = _one(_llama_trace(docs, refs), rules)
    assert _score("id_context_recall", same)[0] == 0.0


def test_a_user_id_beats_a_generated_one_even_with_no_overlap() -> None:
    built = _one(_llama_trace([(_uuid(), {"doc_id": "kb-05"})], ["kb-01"]), CaseRules())
    assert built.case.retrieved_context_ids == ["kb-05"]
    assert built.case.retrieved_ids_mismatch is None
    assert _score("id_context_recall", built)[0] == 0.0


def test_looks_generated() -> None:
    assert id_kind(_uuid()) == GENERATED
    assert id_kind(_uuid().upper()) == GENERATED
    assert id_kind("0123456789abcdef" * 4) == GENERATED
    assert id_kind("kb-01") != GENERATED
    assert id_kind("deadbeef") != GENERATED


def test_the_mismatch_crosses_to_the_worker_processes() -> None:
    built = _one(_llama_trace([(_uuid(), {})], ["kb-01"]), CaseRules())
    unpacked = _unpack_case(_pack_payload("case", built.case))
    assert unpacked.retrieved_ids_mismatch == built.case.retrieved_ids_mismatch is not None


# ------------------------------------------------------------ configuration
def test_configured_sources_are_used_in_order_without_switching() -> None:
    rules = CaseRules(CasesConfig(document_id=["metadata.doc_id", "document.id"]))
    docs = [("n-1", {"doc_id": "kb-1"}), ("n-2", {})]
    built = _one(_llama_trace(docs, ["n-1"]), rules)  # n-1 would match: not switched back
    assert built.case.retrieved_context_ids == ["kb-1", "n-2"]
    assert built.attributes[semconv.DOCUMENT_ID_SOURCE] == "metadata.doc_id, document.id"
    nested = CaseRules(CasesConfig(document_id=["metadata.source.id"]))
    built = _one(_llama_trace([("n-1", {"source": {"id": 7}})], ["7"]), nested)
    assert built.case.retrieved_context_ids == ["7"]


def test_sources_per_convention() -> None:
    rules = CaseRules(CasesConfig(document_id={"genai": ["metadata.doc_id"]}))
    built = _one(_llama_trace([("n-1", {"doc_id": "kb-1"})], None), rules)
    assert built.case.retrieved_context_ids == ["n-1"]  # openinference: the default
    rules = CaseRules(CasesConfig(document_id={"openinference": ["metadata.doc_id"]}))
    built = _one(_llama_trace([("n-1", {"doc_id": "kb-1"})], None), rules)
    assert built.case.retrieved_context_ids == ["kb-1"]


def test_document_id_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"document_id": ["documnet.id"]}})
    assert "did you mean 'document.id'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"document_id": ["metadata."]}})
    assert "unknown document id source 'metadata.'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"document_id": {"openinferance": ["document.id"]}}})
    assert "did you mean 'openinference'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"cases": {"document_id": []}})
    assert "at least one id source" in str(info.value)
    with pytest.raises(ConfigError):
        parse_config({"cases": {"id_overlap_window": 0}})
    ok = parse_config({"cases": {"document_id": ["metadata.doc_id", "output.id"]}})
    assert ok.cases.document_id == ["metadata.doc_id", "output.id"]


# ----------------------------------------------------------- overlap watch
class _Gauge:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def labels(self, service: str) -> Any:
        values = self.values

        class _Child:
            def set(self, value: float) -> None:
                values[service] = value

        return _Child()


def test_watch_warns_after_a_full_window_without_overlap_and_recovers() -> None:
    gauge = _Gauge()
    watch = IdOverlapWatch(3, gauge)
    watch.observe("shop", ["a"], ["a"], "document.id")
    watch.observe("shop", ["n-1", "n-2"], ["kb-1", "kb-2"], "document.id")
    watch.observe("shop", ["n-3"], ["kb-3"], "document.id")
    assert gauge.values["shop"] == pytest.approx(1 / 3)
    assert watch.warning() is None  # the window still holds an overlapping case
    watch.observe("shop", ["n-4"], ["kb-4"], "document.id")
    assert gauge.values["shop"] == 0.0
    warning = watch.warning()
    assert warning is not None
    for part in ("'shop'", "last 3", "n-4", "kb-4", "cases.document_id", "retriever"):
        assert part in warning
    watch.observe("other", ["x"], ["y"], None)
    assert "'other'" not in (watch.warning() or "")  # one case is not a full window
    watch.observe("shop", ["kb-5"], ["kb-5"], "document.id")
    assert watch.warning() is None
    assert watch.shares()["shop"] == pytest.approx(1 / 3)


def test_watch_off_has_no_warning() -> None:
    ids = DocumentIds(window=1, watch=False)
    ids.observe("svc", ["a"], ["b"], None)
    assert ids.warning() is None


def _assembled(spans: list[trace_pb2.Span], service: str) -> AssembledTrace:
    res = resource_pb2.Resource()
    kv = res.attributes.add(key="service.name")
    kv.value.string_value = service
    group = SpanGroup(res, "", common_pb2.InstrumentationScope(), "", spans)
    now = time.monotonic()
    return AssembledTrace(spans[0].trace_id, [group], ReleaseReason.READY, now, now, True)


async def test_the_stage_exports_the_overlap_and_warns_on_healthz() -> None:
    config = parse_config(
        {
            "evaluation": {"processes": 0},
            "metrics": {"id_context_recall": {}},
            "cases": {"id_overlap_window": 2},
        }
    )
    telemetry = Telemetry()
    stage = build_stage(config, telemetry)
    host = ComponentHost(telemetry)
    host.register(stage.evaluator)
    stage.start()
    forwarded: list[AssembledTrace] = []
    both = asyncio.Event()

    def forward(trace: AssembledTrace) -> None:
        forwarded.append(trace)
        if len(forwarded) == 2:
            both.set()

    try:
        for n in range(2):  # same kind of id, but the retriever never finds the reference
            trace = _llama_trace([(f"kb-0{n + 5}", {})], [f"kb-0{n + 1}"])
            stage.processor.submit(_assembled(trace, "shop"), forward)
        await asyncio.wait_for(both.wait(), 10)
    finally:
        await stage.evaluator.drain()
        await stage.aclose()
    assert len(forwarded) == 2
    for trace in forwarded:  # where the ids were read, next to the scores
        root = attributes_to_dict(trace.groups[0].spans[0].attributes)
        assert root[semconv.DOCUMENT_ID_SOURCE] == "document.id"
        assert root[semconv.eval_attr("id_context_recall", semconv.EVAL_FIELD_SCORE)] == 0.0
    assert 'ragtrace_reference_id_overlap{service="shop"} 0.0' in telemetry.render().decode()
    body = host.snapshot()["evaluation"]
    assert "kb-06" in body["detail"]
    assert "cases.document_id" in body["detail"]
    assert host.health(recoverable_grace=60).ok  # a warning, not a failure


def test_a_switch_is_logged_once_per_service() -> None:
    from structlog.testing import capture_logs

    rules = CaseRules()
    docs = [(_uuid(), {"doc_id": "kb-1"})]
    with capture_logs() as logs:
        for service in ("shop", "shop", "blog"):
            _one(_llama_trace(docs, ["kb-1"]), rules, service=service)
    switched = [e for e in logs if e["event"] == "document_id_source_switched"]
    assert [(e["service"], e["source"]) for e in switched] == [
        ("shop", "metadata.doc_id"),
        ("blog", "metadata.doc_id"),
    ]
    assert "cases.document_id" in switched[0]["detail"]


def test_ids_from_the_retriever_output_are_their_own_source() -> None:
    """OpenInference LangChain: no document.id, the ids in output.value's documents."""
    spans = _llama_trace([(None, {"doc_id": "kb-1"}), (None, {})], ["lc-1"])
    output = {"documents": [{"id": "lc-1", "page_content": "chunk 0"}, {"id": "lc-2"}]}
    set_attributes(
        spans[1].attributes,
        [
            (semconv.OUTPUT_VALUE, json.dumps(output)),
            (semconv.OUTPUT_MIME_TYPE, "application/json"),
        ],
    )
    built = _one(spans, CaseRules())
    # the default takes metadata.doc_id first; only output.id matches the reference
    assert built.case.retrieved_context_ids == ["lc-1", "lc-2"]
    assert built.attributes[semconv.DOCUMENT_ID_SOURCE] == "output.id"
    rules = CaseRules(CasesConfig(document_id=["output.id"]))
    assert _one(spans, rules).case.retrieved_context_ids == ["lc-1", "lc-2"]
    rules = CaseRules(CasesConfig(document_id=["document.id"]))  # none of its own
    assert _one(spans, rules).case.retrieved_context_ids is None


# ------------------------------------------- one kind of id per service (issue 29)
def _scores(built: BuiltCase) -> tuple[float | None, float | None]:
    return _score("id_context_recall", built)[0], _score("id_context_precision", built)[0]


def test_numeric_chunk_ids_are_not_switched_to_the_document_ids_they_collide_with() -> None:
    """Reference = chunks 7 and 12.  The retriever found chunks 3 and 5, whose documents
    are numbered 7 and 12: comparing the documents' numbers would score a retrieval
    that found neither as perfect."""
    rules = CaseRules()
    miss = [("3", {"doc_id": 7}), ("5", {"doc_id": 12})]
    # alone, the case cannot tell which kind the reference ids are: never 1.00
    first = _one(_llama_trace(miss, ["7", "12"]), rules, service="num")
    recall, precision = _scores(first)
    assert recall != 1.0
    assert precision != 1.0
    if recall is None:
        reason = _score("id_context_recall", first)[1]
        assert "cases.document_id" in reason
    # the service's cases whose chunk ids met the reference ids say it: chunk ids
    for n in range(3):
        hit = [(str(20 + n), {"doc_id": 1}), ("4", {"doc_id": 2})]
        built = _one(_llama_trace(hit, [str(20 + n)]), rules, service="num")
        assert built.case.retrieved_context_ids == [str(20 + n), "4"]
    again = _one(_llama_trace(miss, ["7", "12"]), rules, service="num")
    assert again.case.retrieved_context_ids == ["3", "5"]
    assert again.attributes[semconv.DOCUMENT_ID_SOURCE] == "document.id"
    assert _scores(again) == (0.0, 0.0)


@pytest.mark.parametrize("order", ["right-first", "wrong-first"])
def test_chunk_ids_keep_one_granularity_across_the_cases_of_a_service(order: str) -> None:
    """Chunk ids where the first chunk's id is the document's name ("refunds"); the
    reference names the right chunk.  The case that retrieved it must not score lower
    than the one that retrieved another chunk of the same document."""
    rules = CaseRules()
    right = [
        ("refunds", {"doc_id": "refunds"}),
        ("shipping#1", {"doc_id": "shipping"}),
        ("returns#2", {"doc_id": "returns"}),
    ]
    wrong = [("refunds#2", {"doc_id": "refunds"}), ("shipping", {"doc_id": "shipping"})]
    seq = [right, wrong, wrong, right] if order == "right-first" else [wrong, right, wrong]
    scored: list[tuple[str, float | None]] = []
    sources = set()
    for docs in seq:
        built = _one(_llama_trace(docs, ["refunds"]), rules, service="chunks")
        precision = _score("id_context_precision", built)[0]
        if precision is not None:
            sources.add(built.attributes[semconv.DOCUMENT_ID_SOURCE])
        scored.append(("right" if docs is right else "wrong", precision))
    assert sources == {"document.id"}  # one kind for the whole service
    assert all(p == pytest.approx(1 / 3) for kind, p in scored if kind == "right")
    assert all(p in (None, 0.0) for kind, p in scored if kind == "wrong")
    assert scored[-1][1] is not None  # decided once a case showed the kind


def test_file_names_are_not_scored_against_document_ids() -> None:
    """LlamaIndex SimpleDirectoryReader: node UUIDs, ref_doc_id UUIDs and the file's
    name, against the user's ids: ids of different kinds, skipped, never 0.00."""
    rules = CaseRules()

    def reader_doc(name: str) -> tuple[str, dict[str, Any]]:
        return _uuid(), {
            "ref_doc_id": _uuid(),
            "file_name": f"{name}.md",
            "file_path": f"/srv/kb/{name}.md",
            "file_type": "text/markdown",
        }

    docs = [reader_doc("refunds"), reader_doc("shipping")]
    built = _one(_llama_trace(docs, ["kb-refunds", "kb-shipping"]), rules)
    for metric in ("id_context_recall", "id_context_precision"):
        score, reason = _score(metric, built)
        assert score is None, reason
        assert "file name" in reason  # both kinds named
        assert "kb-refunds" in reason
        assert "cases.document_id" in reason  # and the fix
    # the same file names as the reference ids are the same kind: compared
    named = _one(_llama_trace(docs, ["refunds.md"]), rules, service="files")
    assert named.case.retrieved_context_ids == ["refunds.md", "shipping.md"]
    assert _scores(named) == (1.0, 0.5)


def test_chunk_ids_against_document_ids_are_not_scored() -> None:
    rules = CaseRules()
    docs = [("kb-refunds#3", {}), ("kb-shipping#1", {})]
    built = _one(_llama_trace(docs, ["kb-refunds"]), rules)
    score, reason = _score("id_context_recall", built)
    assert score is None
    assert "chunk" in reason
    assert "kb-refunds#3" in reason
    assert "cases.document_id" in reason


def _traceloop_task_trace(with_task: bool) -> list[trace_pb2.Span]:
    """traceloop-sdk: a ``@workflow`` over a ``@task`` that calls a LangChain retriever.
    The LangChain instrumentation writes the documents without ``Document.id``; the
    SDK's task span writes its return value with its JSONEncoder (``to_json()``)."""
    from langchain_core.documents import Document

    docs = [
        Document(id="kb-refunds", page_content="Refunds take 5 days.", metadata={"source": "kb"}),
        Document(id="kb-card", page_content="Card refunds are issued.", metadata={"source": "kb"}),
    ]
    tid = os.urandom(16)
    root = named_span(
        "answer.workflow",
        {
            semconv.TRACELOOP_SPAN_KIND: "workflow",
            semconv.TRACELOOP_ENTITY_INPUT: json.dumps(
                {"args": ["How long do refunds take?"], "kwargs": {}}
            ),
            semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps("Five days."),
            semconv.REFERENCE_CONTEXT_IDS: json.dumps(["kb-refunds"]),
        },
        tid=tid,
    )
    parent = root
    spans = [root]
    if with_task:
        parent = named_span(
            "retrieve.task",
            {
                semconv.TRACELOOP_SPAN_KIND: "task",
                "traceloop.entity.name": "retrieve",
                semconv.TRACELOOP_ENTITY_INPUT: json.dumps(
                    {"args": ["How long do refunds take?"], "kwargs": {}}
                ),
                semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps([d.to_json() for d in docs]),
            },
            tid=tid,
            parent=root,
        )
        spans.append(parent)
    out = {
        "documents": [{"page_content": d.page_content, "metadata": d.metadata} for d in docs],
        "count": len(docs),
    }
    spans.append(
        named_span(
            "vector_db_retrieve KeywordRetriever",
            {
                semconv.GEN_AI_OPERATION_NAME: "vector_db_retrieve",
                semconv.TRACELOOP_SPAN_KIND: "task",
                semconv.TRACELOOP_ENTITY_INPUT: json.dumps({"query": "How long?"}),
                semconv.TRACELOOP_ENTITY_OUTPUT: json.dumps(out),
            },
            tid=tid,
            parent=parent,
        )
    )
    return spans


def test_traceloop_task_output_gives_the_ids_the_retriever_span_lacks() -> None:
    built = _one(_traceloop_task_trace(with_task=True), CaseRules())
    assert built.case.retrieved_context_ids == ["kb-refunds", "kb-card"]
    assert _scores(built) == (1.0, 0.5)


def test_no_ids_reason_names_the_config_when_the_trace_holds_ids_elsewhere() -> None:
    """The documents carry no id where the collector reads them, but their metadata
    has keys that may be one: the reason says how to name it."""
    spans = _traceloop_task_trace(with_task=False)
    built = _one(spans, CaseRules())
    score, reason = _score("id_context_recall", built)
    assert score is None
    assert "no retrieved document ids" in reason
    assert "cases.document_id" in reason
    assert "metadata.source" in reason


def test_the_reason_names_a_retrievers_rule_when_a_task_holds_ids_it_cannot_match() -> None:
    """The task returned its documents with ids, but not the retriever's (here: other
    texts): the ids are not guessed by rank; the reason names the rule that reads
    them, and that rule gives the ids."""
    from ragtrace_collector.evaluation.case_builder import CaseMatch, RetrieverRule

    spans = _traceloop_task_trace(with_task=True)
    task = spans[1]
    [kv] = [kv for kv in task.attributes if kv.key == semconv.TRACELOOP_ENTITY_OUTPUT]
    kv.value.string_value = kv.value.string_value.replace(
        '"page_content": "', '"page_content": "(v2) '
    )
    built = _one(spans, CaseRules())
    score, reason = _score("id_context_recall", built)
    assert score is None
    assert "'retrieve.task'" in reason
    assert "cases.retrievers" in reason
    assert "kwargs.id" in reason
    rule = RetrieverRule(
        match=CaseMatch(span_name="retrieve.task"),
        documents=semconv.TRACELOOP_ENTITY_OUTPUT,
        id="kwargs.id",
        content="kwargs.page_content",
    )
    fixed = _one(spans, CaseRules(CasesConfig(retrievers=[rule])))
    assert fixed.case.retrieved_context_ids == ["kb-refunds", "kb-card"]
    assert _scores(fixed) == (1.0, 0.5)


def test_the_watch_reports_what_the_chosen_source_matched_over_its_window() -> None:
    """The window restarts when the service's source is chosen: it then holds only
    cases read from that source, and its warning says which and how it was chosen."""
    rules = CaseRules(CasesConfig(id_overlap_window=3))
    watch = rules.document_ids.watch
    assert watch is not None
    for n in range(2):  # undecided: read from the default, no overlap
        _one(_llama_trace([(f"node-{n}", {})], [f"kb-{n}"]), rules, service="shop")
    assert watch.report()["shop"] == ("document.id", 2, 0)
    # a case whose generated ids cannot be of the reference kind chooses doc_id
    _one(_llama_trace([(_uuid(), {"doc_id": "kb-1"})], ["kb-1"]), rules, service="shop")
    assert rules.document_ids.source_of("shop") == "metadata.doc_id"
    assert watch.report()["shop"] == ("metadata.doc_id", 1, 1)  # only the chosen source
    for n in range(3):
        _one(_llama_trace([(_uuid(), {"doc_id": f"kb-9{n}"})], ["kb-1"]), rules, service="shop")
    assert watch.report()["shop"] == ("metadata.doc_id", 3, 0)
    warning = watch.warning()
    assert warning is not None
    assert "(read from metadata.doc_id; chosen from the service's cases)" in warning
    assert "kb-92" in warning


# ------------------------------------------------- the guarantee, on generated traffic
#: Layouts a service's documents may have: (own id, metadata) per chunk number n of
#: document d.  Each service keeps one layout, as an app does.
_LAYOUTS: dict[str, Any] = {
    "numbered chunks": lambda d, n: (str(10 * d + n), {"doc_id": d}),
    "named chunks": lambda d, n: (f"doc{d}" if n == 0 else f"doc{d}#{n}", {"doc_id": f"doc{d}"}),
    "node uuids": lambda d, n: (
        str(uuid.UUID(int=(d << 8) + n)),
        {"ref_doc_id": str(uuid.UUID(int=(d << 20) + 1)), "file_name": f"doc{d}.md"},
    ),
    "node uuids + doc_id": lambda d, n: (str(uuid.UUID(int=(d << 8) + n)), {"doc_id": f"doc{d}"}),
}
#: Which of a chunk's ids the service's reference ids name.
_REFERENCE: dict[str, Any] = {
    "numbered chunks": lambda d, n: str(10 * d + n),
    "named chunks": lambda d, n: f"doc{d}" if n == 0 else f"doc{d}#{n}",
    "node uuids": lambda d, n: f"kb-{d}",
    "node uuids + doc_id": lambda d, n: f"doc{d}",
}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(_LAYOUTS)),  # the service (one layout each)
            st.lists(  # retrieved (document, chunk)
                st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=4
            ),
            st.tuples(st.integers(0, 3), st.integers(0, 2)),  # the reference chunk
        ),
        min_size=1,
        max_size=25,
    )
)
@settings(max_examples=150, deadline=None)
@pytest.mark.slow  # about 20 s
def test_every_scored_case_of_a_service_compares_one_kind(cases: list[Any]) -> None:
    """On any sequence of cases: (1) no case is scored on ids of another kind than the
    reference ids; (2) the cases of a service whose ids met a reference id all read
    them from the same source (one granularity per service)."""
    rules = CaseRules()
    hit_sources: dict[str, set[str]] = {}
    for service, retrieved, (ref_doc, ref_chunk) in cases:
        layout, reference = _LAYOUTS[service], _REFERENCE[service]
        docs = [layout(d, n) for d, n in dict.fromkeys(retrieved)]
        ref = [reference(ref_doc, ref_chunk)]
        built = _one(_llama_trace(docs, ref), rules, service=service)
        recall = _score("id_context_recall", built)[0]
        if recall is None:
            continue
        kinds = {id_kind(i) for i in built.case.retrieved_context_ids or ()}
        assert id_kind(ref[0]) in kinds, (service, built.case.retrieved_context_ids, ref)
        if recall > 0:
            source = built.attributes[semconv.DOCUMENT_ID_SOURCE].split(", ")[0]
            hit_sources.setdefault(service, set()).add(source)
    for service, sources in hit_sources.items():
        assert len(sources) == 1, (service, sources)
