from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ragtrace import semconv
from ragtrace_collector.evaluation.case_builder import build_cases
from tests.fakes.spans import make_span


def _trace() -> bytes:
    return os.urandom(16)


def test_rag_span_becomes_case_with_retrieval_in_rank_order() -> None:
    tid = _trace()
    rag = make_span(
        tid,
        "rag",
        attrs={
            semconv.INPUT_VALUE: "What is the refund window?",
            semconv.OUTPUT_VALUE: "30 days.",
            semconv.EXPECTED_OUTPUT: "Refunds within 30 days.",
            semconv.REFERENCE_CONTEXT_IDS: json.dumps(["kb-1", 2]),
        },
    )
    r1 = make_span(tid, "retriever", parent=rag, start=10, docs=[("kb-1", "a"), ("kb-2", "b")])
    r2 = make_span(tid, "retriever", parent=rag, start=20, docs=[("kb-3", "c")])
    # arrival order differs from start order: rank order must follow start time
    cases = build_cases([r2, rag, r1], service_of=lambda s: "svc")
    assert len(cases) == 1
    built = cases[0]
    assert built.service == "svc"
    assert built.case.input == "What is the refund window?"
    assert built.case.actual_output == "30 days."
    assert built.case.expected_output == "Refunds within 30 days."
    assert built.case.reference_context_ids == ["kb-1", "2"]
    assert built.case.retrieved_context_ids == ["kb-1", "kb-2", "kb-3"]
    assert [c.content for c in built.case.retrieval_context or []] == ["a", "b", "c"]
    assert built.case.retrieval_context is not None
    assert built.case.retrieval_context[1].metadata == {"i": 1}
    assert built.ground_truth_source == "span"
    assert built.span_id == rag.span_id.hex()


def test_reranker_output_order_wins_over_retriever() -> None:
    tid = _trace()
    rag = make_span(tid, "rag", attrs={semconv.INPUT_VALUE: "q"})
    ret = make_span(tid, "retriever", parent=rag, docs=[("a", "A"), ("b", "B"), ("c", "C")])
    rr = make_span(
        tid,
        "reranker",
        parent=rag,
        end=5_000,
        docs=[("c", "C"), ("a", "A")],
        doc_prefix=semconv.RERANKER_OUTPUT_DOCUMENTS,
    )
    [built] = build_cases([rag, ret, rr])
    assert built.case.retrieved_context_ids == ["c", "a"]


def test_retrievers_found_through_intermediate_spans_but_not_nested_rag() -> None:
    tid = _trace()
    outer = make_span(tid, "rag", attrs={semconv.INPUT_VALUE: "outer"})
    step = make_span(tid, "chain-step", parent=outer)
    ret = make_span(tid, "retriever", parent=step, docs=[("x", "X")])
    inner = make_span(tid, "rag", parent=outer, attrs={semconv.INPUT_VALUE: "inner"})
    inner_ret = make_span(tid, "retriever", parent=inner, docs=[("y", "Y")])
    cases = {c.case.input: c for c in build_cases([outer, step, ret, inner, inner_ret])}
    assert cases["outer"].case.retrieved_context_ids == ["x"]
    assert cases["inner"].case.retrieved_context_ids == ["y"]


def test_nested_retriever_spans_are_one_retrieval() -> None:
    """LlamaIndex ``retrieve`` > ``_retrieve`` (the inner one records no documents) and
    OpenLLMetry's nested pair (both record the same documents): the documents once,
    read from the outermost span that has them."""
    tid = _trace()
    rag = make_span(tid, "rag", attrs={semconv.INPUT_VALUE: "q"})
    outer = make_span(tid, "retriever", parent=rag, start=10, docs=[("a", "A"), ("b", "B")])
    inner = make_span(tid, "retriever", parent=outer, start=11, docs=[])
    again = make_span(tid, "retriever", parent=inner, start=12, docs=[("a", "A"), ("b", "B")])
    later = make_span(tid, "retriever", parent=rag, start=20, docs=[("c", "C")])
    [built] = build_cases([rag, again, inner, later, outer])
    assert built.case.retrieved_context_ids == ["a", "b", "c"]
    sources = built.document_sources or []
    assert [s.span_id for s in sources] == [outer.span_id.hex()] * 2 + [later.span_id.hex()]
    # an outer span that recorded nothing: the nested one's documents are the retrieval
    bare = make_span(tid, "retriever", parent=rag, start=10)
    below = make_span(tid, "retriever", parent=bare, start=11, docs=[("d", "D")])
    [built] = build_cases([rag, bare, below])
    assert built.case.retrieved_context_ids == ["d"]


def test_nested_retriever_gives_ids_to_the_outer_documents_by_rank() -> None:
    """DSPy: ``Retrieve.forward`` records contents only, the ``ColBERTv2`` call below it
    the same passages with their ids."""
    tid = _trace()
    rag = make_span(tid, "rag", attrs={semconv.INPUT_VALUE: "q"})
    outer = make_span(tid, "retriever", parent=rag, docs=[(None, "P1"), (None, "P2"), (None, "P3")])
    inner = make_span(
        tid, "retriever", parent=outer, start=1_001, docs=[("7", "P1"), ("9", "other"), ("4", "P3")]
    )
    [built] = build_cases([rag, outer, inner])
    assert built.case.retrieved_context_ids == ["7", "4"]  # P2's content differs: no id
    assert [c.content for c in built.case.retrieval_context or []] == ["P1", "P2", "P3"]


def test_missing_content_keeps_ids_but_no_text_context() -> None:
    tid = _trace()
    rag = make_span(tid, "rag", attrs={semconv.INPUT_VALUE: "q"})
    ret = make_span(tid, "retriever", parent=rag, docs=[("a", None), ("b", None)])
    [built] = build_cases([rag, ret])
    assert built.case.retrieved_context_ids == ["a", "b"]
    assert built.case.retrieval_context is None


def test_empty_retrieval_is_an_empty_list_and_no_retriever_is_none() -> None:
    tid = _trace()
    rag = make_span(tid, "rag", attrs={semconv.INPUT_VALUE: "q"})
    ret = make_span(tid, "retriever", parent=rag, docs=[])
    [built] = build_cases([rag, ret])
    assert built.case.retrieved_context_ids == []
    assert built.case.retrieval_context == []
    [no_ret] = build_cases([make_span(tid, "rag")])
    assert no_ret.case.retrieval_context is None
    assert no_ret.case.retrieved_context_ids is None


@dataclass
class _Ref:
    expected_output: str | None = "from store"
    reference_contexts: list[str] | None = None
    reference_context_ids: list[str] | None = None
    expected_outcome: str | None = "resolved"


def test_reference_store_fills_only_missing_fields() -> None:
    tid = _trace()
    rag = make_span(
        tid,
        "rag",
        attrs={
            semconv.INPUT_VALUE: "q",
            semconv.REFERENCE_CONTEXT_IDS: json.dumps(["on-span"]),
        },
    )
    seen: list[str] = []

    def lookup(text: str) -> _Ref:
        seen.append(text)
        return _Ref(reference_context_ids=["from-store"])

    [built] = build_cases([rag], reference_lookup=lookup)
    assert seen == ["q"]
    assert built.case.expected_output == "from store"
    assert built.case.reference_context_ids == ["on-span"]
    assert built.expected_outcome == "resolved"
    assert built.ground_truth_source == "span"

    plain = make_span(tid, "rag", attrs={semconv.INPUT_VALUE: "q2"})
    [from_store] = build_cases([plain], reference_lookup=lookup)
    assert from_store.ground_truth_source == "reference_store"
    assert from_store.case.reference_context_ids == ["from-store"]


def test_session_fields() -> None:
    tid = _trace()
    rag = make_span(
        tid,
        "rag",
        attrs={semconv.SESSION_ID: "s-1", semconv.USER_ID: "u-1", semconv.TURN_INDEX: 3},
    )
    [built] = build_cases([rag])
    assert (built.session_id, built.user_id, built.turn_index) == ("s-1", "u-1", 3)


def test_trace_without_rag_span_has_no_case() -> None:
    tid = _trace()
    assert build_cases([make_span(tid, "retriever", docs=[("a", "A")])]) == []
