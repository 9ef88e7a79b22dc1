"""Per-document verdicts: what a metric concluded about each retrieved document, and
where that document sits (its retriever or reranker span and its index there).

Backends that annotate documents (Phoenix document annotations) show them under each
document of the retriever span.  They are read from the details the metrics already
compute, nothing is judged twice:

* ``contextual_precision``: the judge's yes/no per node (score 1 or 0, its reason);
* ``non_llm_context_precision``: each node's best similarity to a reference context,
  relevant when it reaches the similarity threshold;
* ``id_context_precision``: whether each retrieved document's id is a reference id;
* ``contextual_relevancy``: the share of each node's statements relevant to the input.

The evaluator writes them as ``ragtrace.eval.<metric>.documents`` (a JSON list), so
they travel on the span like every other result, late carrier spans included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import to_json

from ragtrace import semconv
from ragtrace_collector.cases import RAGCase
from ragtrace_collector.evaluation.case_builder import DocumentSource
from ragtrace_collector.results import MetricResult, trusted

__all__ = ["DocumentVerdict", "decode_verdicts", "document_verdicts", "verdicts_json"]

_MAX_EXPLANATION = 500


class DocumentVerdict(BaseModel):
    """One document's verdict under one metric."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    position: int = Field(ge=0)
    score: float = Field(ge=0.0, le=1.0)
    label: str | None = None
    explanation: str = ""


_LIST = TypeAdapter(list[DocumentVerdict])

#: A verdict as written: DocumentVerdict's fields, ``label`` left out when None.
_Row = dict[str, Any]


def _label(relevant: bool) -> str:
    return semconv.LABEL_RELEVANT if relevant else semconv.LABEL_IRRELEVANT


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_EXPLANATION else text[: _MAX_EXPLANATION - 1] + "…"


def _row(source: DocumentSource, score: float, label: str | None, explanation: str) -> _Row | None:
    """A verdict of a valid DocumentVerdict's shape: the span id is the hex of an id the
    receiver checked (8 bytes), the position an index, and the score is checked here (a
    judge's counts can give a share outside [0, 1]: that item says nothing, and is
    dropped)."""
    if not 0.0 <= score <= 1.0:  # NaN too
        return None
    row: _Row = {"span_id": source.span_id, "position": source.position, "score": float(score)}
    if label is not None:
        row["label"] = label
    row["explanation"] = _cut(explanation)
    return row


def _by_rank(
    items: Any, sources: Sequence[DocumentSource], verdict: Callable[[dict[str, Any]], Any]
) -> list[_Row]:
    """Items carrying a 1-based ``node`` rank, mapped to their documents."""
    out: list[_Row] = []
    if not isinstance(items, list):
        return out
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("node"), int):
            continue
        rank = item["node"]
        if not 1 <= rank <= len(sources):
            continue
        made = verdict(item)
        if made is None:
            continue
        row = _row(sources[rank - 1], *made)
        if row is not None:
            out.append(row)
    return out


def _precision(item: dict[str, Any]) -> tuple[float, str, str] | None:
    word = item.get("verdict")
    if word not in ("yes", "no"):
        return None  # an unclear verdict says nothing about the document
    reason = item.get("reason")
    text = f"useful: {word}" + (f"; {reason}" if isinstance(reason, str) and reason else "")
    return (1.0 if word == "yes" else 0.0), _label(word == "yes"), text


def _relevancy(item: dict[str, Any]) -> tuple[float, str | None, str] | None:
    relevant, total = item.get("relevant"), item.get("statements")
    if not isinstance(relevant, int) or not isinstance(total, int) or total <= 0:
        return None
    return relevant / total, None, f"{relevant} of {total} statements relevant to the input"


def _similarity(result: MetricResult, sources: Sequence[DocumentSource]) -> list[_Row]:
    sims, cut = result.details.get("similarities"), result.details.get("similarity_threshold")
    if not isinstance(sims, list) or not isinstance(cut, (int, float)):
        return []
    out: list[_Row] = []
    for source, sim in zip(sources, sims, strict=False):  # ranks past the sources: none
        if not isinstance(sim, (int, float)) or not 0.0 <= sim <= 1.0:
            continue
        relevant = sim >= cut
        sign = ">=" if relevant else "<"
        text = f"best similarity to a reference context {float(sim):.3f} {sign} {cut:g}"
        row = _row(source, sim, _label(relevant), text)
        if row is not None:
            out.append(row)
    return out


def _ids(case: RAGCase, sources: Sequence[DocumentSource]) -> list[_Row]:
    reference = {str(i) for i in case.reference_context_ids or ()}
    out: list[_Row] = []
    for source in sources:
        if source.id is None:
            continue
        hit = source.id in reference
        text = f"id {source.id} is {'a' if hit else 'not a'} reference context id"
        row = _row(source, 1.0 if hit else 0.0, _label(hit), text)
        assert row is not None  # a score of 0 or 1
        out.append(row)
    return out


def _rows(result: MetricResult, case: RAGCase, sources: Sequence[DocumentSource]) -> list[_Row]:
    if result.score is None or not sources:
        return []
    name = result.metric
    if name == "id_context_precision":
        return _ids(case, sources)
    # The node-ranked metrics judged the retrieval context: one node per document.
    if case.retrieval_context is None or len(case.retrieval_context) != len(sources):
        return []
    if name == "contextual_precision":
        return _by_rank(result.details.get("verdicts"), sources, _precision)
    if name == "non_llm_context_precision":
        return _similarity(result, sources)
    if name == "contextual_relevancy":
        return _by_rank(result.details.get("nodes"), sources, _relevancy)
    return []


def document_verdicts(
    result: MetricResult, case: RAGCase, sources: Sequence[DocumentSource]
) -> list[DocumentVerdict]:
    """The per-document verdicts of ``result`` (empty when the metric has none, or was
    skipped or errored).  ``sources`` are the case's documents in rank order."""
    return [
        trusted(
            DocumentVerdict,
            {
                "span_id": row["span_id"],
                "position": row["position"],
                "score": row["score"],
                "label": row.get("label"),
                "explanation": row["explanation"],
            },
        )
        for row in _rows(result, case, sources)
    ]


def verdicts_json(
    result: MetricResult, case: RAGCase, sources: Sequence[DocumentSource]
) -> str | None:
    """The JSON text written as ``ragtrace.eval.<metric>.documents`` for ``result``
    (:func:`document_verdicts`, written without building models), or None when it has
    none."""
    rows = _rows(result, case, sources)
    # pydantic-core: compact, non-ASCII kept, floats as it writes a model's (and 4-5x
    # faster than the json module, which formats each float in Python).
    return to_json(rows).decode() if rows else None


def decode_verdicts(value: object) -> list[DocumentVerdict]:
    """Parse an attribute value back; anything malformed yields ``[]`` (the attribute
    may have been written or altered by anyone upstream)."""
    if not isinstance(value, str):
        return []
    try:
        return _LIST.validate_json(value)
    except ValidationError:
        return []
