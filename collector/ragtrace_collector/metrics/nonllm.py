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
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, Protocol

from rapidfuzz.distance import Hamming, Indel, Jaro, JaroWinkler, Levenshtein
from rapidfuzz.process import extractOne as _extract_one

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.metrics.base import JudgeFreeMetric, Outcome, average_precision

__all__ = ["SIMILARITIES", "NonLLMContextPrecision", "NonLLMContextRecall", "best_similarities"]


class Similarity(Protocol):
    """A rapidfuzz normalised similarity (the signature ``extractOne`` takes)."""

    def __call__(
        self,
        s1: Sequence[Hashable],
        s2: Sequence[Hashable],
        /,
        *,
        score_cutoff: float | None = None,
    ) -> float: ...


SIMILARITIES: dict[str, Similarity] = {
    "levenshtein": Levenshtein.normalized_similarity,
    "jaro": Jaro.normalized_similarity,
    "jaro_winkler": JaroWinkler.normalized_similarity,
    "hamming": Hamming.normalized_similarity,
    "indel": Indel.normalized_similarity,
}


#: The similarities that extractOne computes bit for bit as a call per pair does.
_EXACT_WITH_EXTRACT_ONE = frozenset(
    SIMILARITIES[name] for name in ("levenshtein", "hamming", "indel")
)


def best_similarities(
    queries: Sequence[str], choices: Sequence[str], sim: Similarity
) -> list[float]:
    """For each query, its maximum similarity over ``choices`` (0.0 when none).

    ``max(sim(q, c) for c in choices)``; for the similarities computed from an integer
    distance, through rapidfuzz's ``extractOne``, which prepares each query once for
    all the choices (the same values, faster; for jaro and jaro_winkler it can differ
    in the last bit, so those do not use it)."""
    if not choices:
        return [0.0] * len(queries)
    if sim not in _EXACT_WITH_EXTRACT_ONE:
        return [max([sim(q, c) for c in choices]) for q in queries]
    out: list[float] = []
    for q in queries:
        best = _extract_one(q, choices, scorer=sim, processor=None)
        out.append(max([sim(q, c) for c in choices]) if best is None else best[1])
    return out


def _recalled(sims: Sequence[float], cut: float) -> int:
    """Reference contexts recalled: best similarity strictly over the cut-off."""
    return sum(1 for s in sims if s > cut)


def _relevant(sims: Sequence[float], cut: float) -> list[int]:
    """Retrieved nodes relevant (1): best similarity at or over the cut-off."""
    return [1 if s >= cut else 0 for s in sims]


class _NonLLM(JudgeFreeMetric):
    #: precision needs a retrieved node to rank (see missing_inputs()).
    _needs_retrieved: ClassVar[bool] = False

    def _fast_scores(self, cases: Sequence[RAGCase], memos: list[Any]) -> list[float | None]:
        # The similarities, kept for the results; the score from them, with no reason
        # or details built.
        sim = SIMILARITIES[self.options.distance]
        needs_retrieved = self._needs_retrieved
        cut = self.similarity_threshold
        out: list[float | None] = []
        for case in cases:
            reference = case.reference_contexts
            retrieval = case.retrieval_context
            if not reference or retrieval is None or (needs_retrieved and not retrieval):
                out.append(None)  # missing_inputs() gives a reason
                memos.append(None)
                continue
            sims = self._similarities([c.content for c in retrieval], reference, sim)
            memos.append(sims)
            out.append(self._score_of(sims, cut))
        return out

    @abc.abstractmethod
    def _similarities(
        self, retrieved: Sequence[str], reference: Sequence[str], sim: Similarity
    ) -> list[float]:
        """The best similarities the score is computed from."""

    @abc.abstractmethod
    def _score_of(self, sims: list[float], cut: float) -> float:
        """The score from the similarities."""

    @abc.abstractmethod
    def _outcome(self, retrieved: Sequence[str], sims: list[float]) -> Outcome:
        """The outcome from the similarities."""

    def score_texts(self, retrieved: Sequence[str], reference: Sequence[str]) -> Outcome:
        sim = SIMILARITIES[self.options.distance]
        return self._outcome(retrieved, self._similarities(retrieved, reference, sim))

    def _score_now(self, case: RAGCase) -> Outcome:
        return self.score_texts(case.context_texts(), case.reference_contexts or [])

    def _score_memo(self, case: RAGCase, memo: Any) -> Outcome:
        return self._outcome(case.context_texts(), memo)

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

    def _similarities(
        self, retrieved: Sequence[str], reference: Sequence[str], sim: Similarity
    ) -> list[float]:
        return best_similarities(reference, retrieved, sim)

    def _score_of(self, sims: list[float], cut: float) -> float:
        return _recalled(sims, cut) / len(sims)

    def _outcome(self, retrieved: Sequence[str], sims: list[float]) -> Outcome:
        cut = self.similarity_threshold
        recalled = _recalled(sims, cut)
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

    def missing_inputs(self, case: RAGCase) -> str | None:
        missing = super().missing_inputs(case)
        if missing is None and not case.retrieval_context:
            return "nothing was retrieved: no ranking to score"
        return missing

    def _similarities(
        self, retrieved: Sequence[str], reference: Sequence[str], sim: Similarity
    ) -> list[float]:
        return best_similarities(retrieved, reference, sim)

    def _score_of(self, sims: list[float], cut: float) -> float:
        return average_precision(_relevant(sims, cut))

    def _outcome(self, retrieved: Sequence[str], sims: list[float]) -> Outcome:
        cut = self.similarity_threshold
        relevant = _relevant(sims, cut)
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
