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

import abc
from collections.abc import Sequence
from typing import ClassVar, Protocol

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


def _matches(
    query: str, choices: Sequence[str], sim: Similarity, cut: float, *, inclusive: bool
) -> bool:
    """Whether some choice is over (``inclusive``: at or over) the cut-off; stops at the
    first, and lets rapidfuzz stop computing a similarity that cannot reach it."""
    floor = max(0.0, cut - _CUTOFF_MARGIN)
    for choice in choices:
        s = sim(query, choice, score_cutoff=floor)
        if s > cut or (inclusive and s >= cut):
            return True
    return False


class _NonLLM(JudgeFreeMetric):
    #: precision needs a retrieved node to rank (see missing_inputs()).
    _needs_retrieved: ClassVar[bool] = False

    def _fast_scores(self, cases: Sequence[RAGCase]) -> list[float | None]:
        # score_texts() without computing every similarity.
        cut = self.similarity_threshold
        sim = SIMILARITIES[self.options.distance]
        needs_retrieved = self._needs_retrieved
        out: list[float | None] = []
        for case in cases:
            reference = case.reference_contexts
            retrieval = case.retrieval_context
            if not reference or retrieval is None or (needs_retrieved and not retrieval):
                out.append(None)  # missing_inputs() gives a reason
                continue
            retrieved = [c.content for c in retrieval]
            out.append(self._fast_score(retrieved, reference, sim, cut))
        return out

    @abc.abstractmethod
    def _fast_score(
        self, retrieved: list[str], reference: list[str], sim: Similarity, cut: float
    ) -> float:
        """The score of a case whose inputs are present, as score_texts() gives it."""

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

    def _fast_score(
        self, retrieved: list[str], reference: list[str], sim: Similarity, cut: float
    ) -> float:
        recalled = [_matches(r, retrieved, sim, cut, inclusive=False) for r in reference]
        return sum(recalled) / len(reference)

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
    _needs_retrieved = True

    def _fast_score(
        self, retrieved: list[str], reference: list[str], sim: Similarity, cut: float
    ) -> float:
        return average_precision(
            [_matches(r, reference, sim, cut, inclusive=True) for r in retrieved]
        )

    def missing_inputs(self, case: RAGCase) -> str | None:
        missing = super().missing_inputs(case)
        if missing is None and not case.retrieval_context:
            return "nothing was retrieved: no ranking to score"
        return missing

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
