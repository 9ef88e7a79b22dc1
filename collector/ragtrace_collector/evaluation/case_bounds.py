"""Per-case bounds on evaluation inputs (``evaluation.max_*_chars``).

A metric's work grows with its inputs, and some grow faster than linearly (the
offline judge compares every reference sentence with every node).  One 6 MB trace
must not cost a worker a minute, so every case is measured against the bounds before
any metric sees it:

* ``oversize: skip`` (the default): every metric of the case is skipped, and the
  reason on the span names the input, its size and the setting to raise;
* ``oversize: truncate``: the inputs are cut to the bounds (documents are kept in
  rank order until the budget is spent, the last one cut) and scored; every result's
  reason starts with what was cut, so no score is ever silently based on a truncated
  input.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragtrace_collector.cases import ContextItem, RAGCase
from ragtrace_collector.evaluation.config import EvaluationConfig

__all__ = ["BoundsCheck", "case_chars", "check_case"]


@dataclass(frozen=True, slots=True)
class BoundsCheck:
    """What :func:`check_case` found: the case to score (None: skip) and the note."""

    case: RAGCase | None
    #: Why the case is skipped, or what was truncated ("" when within bounds).
    note: str = ""

    @property
    def skipped(self) -> bool:
        return self.case is None


def case_chars(case: RAGCase) -> int:
    """Total characters of a case's texts (what shipping or scoring it costs)."""
    total = len(case.input or "") + len(case.actual_output or "")
    total += len(case.expected_output or "")
    for item in case.retrieval_context or ():
        total += len(item.content)
    for text in case.reference_contexts or ():
        total += len(text)
    return total


def check_case(case: RAGCase, config: EvaluationConfig) -> BoundsCheck:
    """``case`` within the bounds of ``config``: unchanged, truncated or skipped."""
    over: list[str] = []
    context = sum(len(c.content) for c in case.retrieval_context or ())
    references = sum(len(t) for t in case.reference_contexts or ())
    checks = (
        ("retrieval context", context, config.max_context_chars, "max_context_chars"),
        ("reference contexts", references, config.max_context_chars, "max_context_chars"),
        (
            "expected output",
            len(case.expected_output or ""),
            config.max_expected_output_chars,
            "max_expected_output_chars",
        ),
        ("input", len(case.input or ""), config.max_output_chars, "max_output_chars"),
        (
            "actual output",
            len(case.actual_output or ""),
            config.max_output_chars,
            "max_output_chars",
        ),
    )
    for label, size, limit, key in checks:
        if size > limit:
            over.append(f"{label} {size:,} chars > evaluation.{key} {limit:,}")
    if not over:
        return BoundsCheck(case)
    if config.oversize == "skip":
        return BoundsCheck(None, "input too large: " + "; ".join(over))
    return BoundsCheck(_truncated(case, config), "[truncated: " + "; ".join(over) + "] ")


def _cut(text: str | None, limit: int) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit]


def _cut_items(items: list[ContextItem], budget: int) -> list[ContextItem]:
    kept: list[ContextItem] = []
    for item in items:
        if budget <= 0:
            break
        if len(item.content) > budget:
            item = item.model_copy(update={"content": item.content[:budget]})
        kept.append(item)
        budget -= len(item.content)
    return kept


def _cut_texts(texts: list[str], budget: int) -> list[str]:
    kept: list[str] = []
    for text in texts:
        if budget <= 0:
            break
        kept.append(text[:budget])
        budget -= len(kept[-1])
    return kept


def _truncated(case: RAGCase, config: EvaluationConfig) -> RAGCase:
    update: dict[str, object] = {
        "input": _cut(case.input, config.max_output_chars),
        "actual_output": _cut(case.actual_output, config.max_output_chars),
        "expected_output": _cut(case.expected_output, config.max_expected_output_chars),
    }
    if case.retrieval_context is not None:
        # Ids are small and the ID metrics cheap: they keep every retrieved id.
        update["retrieved_context_ids"] = case.retrieved_ids()
        update["retrieval_context"] = _cut_items(case.retrieval_context, config.max_context_chars)
    if case.reference_contexts is not None:
        update["reference_contexts"] = _cut_texts(case.reference_contexts, config.max_context_chars)
    return case.model_copy(update=update)
