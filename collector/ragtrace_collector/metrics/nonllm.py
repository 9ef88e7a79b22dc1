"""``non_llm_context_recall`` and ``non_llm_context_precision``: string similarity
between the retrieved and the reference contexts, no judge.

``sim(a, b) = 1 - normalised distance`` (rapidfuzz), case-sensitive; the ``distance``
option picks levenshtein (default), jaro, jaro_winkler, hamming or indel.

* recall: a reference context is recalled when its best sim over the retrieved
  contexts is **>** the similarity threshold; ``score = recalled / |reference|``.
* precision: a retrieved node is relevant when its best sim over the reference
  contexts is **>=** the similarity threshold; ``score = AP``.

The similarity threshold is ``similarity_threshold`` when set, else ``threshold``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rapidfuzz.distance import Hamming, Indel, Jaro, JaroWinkler, Levenshtein

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.metrics.base import JudgeFreeMetric, Outcome, average_precision

__all__ = ["SIMILARITIES", "NonLLMContextPrecision", "NonLLMContextRecall", "best_similarities"]


class Similarity(Protocol):
    """A rapidfuzz normalised similarity: 0.0 when under ``score_cutoff``."""

    def __call__(self, s1: str, s2: str, *, score_cutoff: float | None = None) -> float: ...


SIMILARITIES: dict[str, Similarity] = {
    "levenshtein": Levenshtein.normalized_similarity,
    "jaro": Jaro.normalized_similarity,
    "jaro_winkler": JaroWinkler.normalized_similarity,
    "hamming": Hamming.normalized_similarity,
    "indel": Indel.normalized_similarity,
}


#: The fast scorers ask rapidfuzz for similarities at least this much under the cut-off
#: (so that no rounding in its pruning can drop a pair exactly at it), then compare the
#: exact values it returns with the cut-off itself.
_CUTOFF_MARGIN = 1e-6


def best_similarities(
    queries: Sequence[str], choices: Sequence[str], sim: Similarity
) -> list[float]:
    """For each query, its maximum similarity over ``choices`` (0.0 when none)."""
    if not choices:
        return [0.0] * len(queries)
    return [max([sim(q, c) for c in choices]) for q in queries]


class _NonLLM(JudgeFreeMetric):
    @property
    def similarity_threshold(self) -> float:
        o = self.options
        return o.threshold if o.similarity_threshold is None else o.similarity_threshold

    def missing_inputs(self, case: RAGCase) -> str | None:
        if case.reference_contexts is None:
            return "no reference_contexts"
        if not case.reference_contexts:
            return "reference_contexts is empty"
        if case.retrieval_context is None:
            return "no retrieval_context captured"
        return None


class NonLLMContextRecall(_NonLLM):
    name = "non_llm_context_recall"

    def _fast_scores(self, cases: Sequence[RAGCase]) -> list[float | None]:
        # score_texts() without the similarities: a reference context is recalled at
        # its first retrieved context over the cut-off, and rapidfuzz may stop computing
        # a similarity that cannot reach it.
        cut = self.similarity_threshold
        floor = max(0.0, cut - _CUTOFF_MARGIN)
        sim = SIMILARITIES[self.options.distance]
        out: list[float | None] = []
        for case in cases:
            reference = case.reference_contexts
            retrieval = case.retrieval_context
            if not reference or retrieval is None:  # missing_inputs() gives a reason
                out.append(None)
                continue
            retrieved = [c.content for c in retrieval]
            recalled = 0
            for wanted in reference:
                for text in retrieved:
                    if sim(wanted, text, score_cutoff=floor) > cut:
                        recalled += 1
                        break
            out.append(recalled / len(reference))
        return out

    def _score_now(self, case: RAGCase) -> Outcome:
        return self.score_texts(case.context_texts(), case.reference_contexts or [])

    def score_texts(self, retrieved: Sequence[str], reference: Sequence[str]) -> Outcome:
        cut = self.similarity_threshold
        sims = best_similarities(reference, retrieved, SIMILARITIES[self.options.distance])
        recalled = sum(1 for s in sims if s > cut)
        if not retrieved:
            reason = "nothing was retrieved"
        else:
            reason = (
                f"{recalled} of {len(sims)} reference contexts recalled "
                f"({self.options.distance} similarity > {cut:g})"
            )
        return Outcome(
            recalled / len(sims),
            reason,
            {"similarities": sims, "similarity_threshold": cut, "distance": self.options.distance},
        )


class NonLLMContextPrecision(_NonLLM):
    name = "non_llm_context_precision"

    def missing_inputs(self, case: RAGCase) -> str | None:
        missing = super().missing_inputs(case)
        if missing is None and not case.retrieval_context:
            return "nothing was retrieved: no ranking to score"
        return missing

    def _fast_scores(self, cases: Sequence[RAGCase]) -> list[float | None]:
        # score_texts() without the similarities: a retrieved node is relevant at its
        # first reference context at or over the cut-off (see NonLLMContextRecall).
        cut = self.similarity_threshold
        floor = max(0.0, cut - _CUTOFF_MARGIN)
        sim = SIMILARITIES[self.options.distance]
        out: list[float | None] = []
        for case in cases:
            reference = case.reference_contexts
            retrieval = case.retrieval_context
            if not reference or not retrieval:  # missing_inputs() gives a reason
                out.append(None)
                continue
            relevant: list[int] = []
            for node in retrieval:
                text = node.content
                hit = 0
                for wanted in reference:
                    if sim(text, wanted, score_cutoff=floor) >= cut:
                        hit = 1
                        break
                relevant.append(hit)
            out.append(average_precision(relevant))
        return out

    def _score_now(self, case: RAGCase) -> Outcome:
        return self.score_texts(case.context_texts(), case.reference_contexts or [])

    def score_texts(self, retrieved: Sequence[str], reference: Sequence[str]) -> Outcome:
        cut = self.similarity_threshold
        sims = best_similarities(retrieved, reference, SIMILARITIES[self.options.distance])
        relevant = [1 if s >= cut else 0 for s in sims]
        return Outcome(
            average_precision(relevant),
            f"{sum(relevant)} of {len(relevant)} retrieved nodes match a reference context "
            f"({self.options.distance} similarity >= {cut:g}); score is their average precision",
            {
                "similarities": sims,
                "relevant": relevant,
                "similarity_threshold": cut,
                "distance": self.options.distance,
            },
        )
