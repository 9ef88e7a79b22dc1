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

from ragtrace import semconv
from ragtrace_collector.case_builder import DocumentSource
from ragtrace_collector.cases import RAGCase
from ragtrace_collector.results import MetricResult, trusted

__all__ = ["DocumentVerdict", "decode_verdicts", "document_verdicts", "encode_verdicts"]

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


def _label(relevant: bool) -> str:
    return semconv.LABEL_RELEVANT if relevant else semconv.LABEL_IRRELEVANT


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_EXPLANATION else text[: _MAX_EXPLANATION - 1] + "…"


def _by_rank(
    items: Any, sources: Sequence[DocumentSource], verdict: Callable[[dict[str, Any]], Any]
) -> list[DocumentVerdict]:
    """Items carrying a 1-based ``node`` rank, mapped to their documents."""
    out: list[DocumentVerdict] = []
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
        verdict_ = _verdict(sources[rank - 1], *made)
        if verdict_ is not None:
            out.append(verdict_)
    return out


def _verdict(
    source: DocumentSource, score: float, label: str | None, explanation: str
) -> DocumentVerdict | None:
    """A verdict built without validation: the span id is the hex of an id the receiver
    checked (8 bytes), the position an index, and the score is checked here (a judge's
    counts can give a share outside [0, 1]: that item says nothing, and is dropped)."""
    if not 0.0 <= score <= 1.0:  # NaN too
        return None
    return trusted(
        DocumentVerdict,
        {
            "span_id": source.span_id,
            "position": source.position,
            "score": float(score),
            "label": label,
            "explanation": _cut(explanation),
        },
    )


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


def _similarity(result: MetricResult, sources: Sequence[DocumentSource]) -> list[DocumentVerdict]:
    sims, cut = result.details.get("similarities"), result.details.get("similarity_threshold")
    if not isinstance(sims, list) or not isinstance(cut, (int, float)):
        return []
    nodes = [
        {"node": rank, "similarity": s}
        for rank, s in enumerate(sims, start=1)
        if isinstance(s, (int, float)) and 0.0 <= s <= 1.0
    ]

    def verdict(item: dict[str, Any]) -> tuple[float, str, str]:
        sim = float(item["similarity"])
        relevant = sim >= cut
        sign = ">=" if relevant else "<"
        return (
            sim,
            _label(relevant),
            f"best similarity to a reference context {sim:.3f} {sign} {cut:g}",
        )

    return _by_rank(nodes, sources, verdict)


def _ids(case: RAGCase, sources: Sequence[DocumentSource]) -> list[DocumentVerdict]:
    reference = {str(i) for i in case.reference_context_ids or ()}
    out: list[DocumentVerdict] = []
    for source in sources:
        if source.id is None:
            continue
        hit = source.id in reference
        made = _verdict(
            source,
            1.0 if hit else 0.0,
            _label(hit),
            f"id {source.id} is {'a' if hit else 'not a'} reference context id",
        )
        assert made is not None  # a score of 0 or 1
        out.append(made)
    return out


def document_verdicts(
    result: MetricResult, case: RAGCase, sources: Sequence[DocumentSource]
) -> list[DocumentVerdict]:
    """The per-document verdicts of ``result`` (empty when the metric has none, or was
    skipped or errored).  ``sources`` are the case's documents in rank order."""
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


def encode_verdicts(verdicts: Sequence[DocumentVerdict]) -> str:
    """The JSON text written as ``ragtrace.eval.<metric>.documents``."""
    # One call into pydantic-core: compact JSON, non-ASCII kept, as json.dumps wrote it.
    return _LIST.dump_json(list(verdicts), exclude_none=True).decode()


def decode_verdicts(value: object) -> list[DocumentVerdict]:
    """Parse an attribute value back; anything malformed yields ``[]`` (the attribute
    may have been written or altered by anyone upstream)."""
    if not isinstance(value, str):
        return []
    try:
        return _LIST.validate_json(value)
    except ValidationError:
        return []
