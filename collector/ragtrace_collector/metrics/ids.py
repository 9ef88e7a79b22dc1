"""``id_context_recall`` and ``id_context_precision``: retrieved document ids against
the reference ids, no judge.

Ids compare as ``str(id)`` in sets (duplicates collapse, ``1`` equals ``"1"``).

* recall    = |ref ∩ ret| / |ref|
* precision = |ret ∩ ref| / |ret|

An empty denominator, or an empty reference id list, is *skipped*; so is a case whose
retrieved ids the collector found to be of another kind than the reference ids
(``RAGCase.retrieved_ids_mismatch``: framework-generated UUIDs, file names or chunk
ids against document names), or whose documents carry no id (the reason then says
where the trace holds ids, and the setting that reads them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ragtrace_collector.cases import RAGCase
from ragtrace_collector.metrics.base import JudgeFreeMetric, Outcome

__all__ = ["IDContextPrecision", "IDContextRecall"]


class _IDMetric(JudgeFreeMetric):
    def missing_inputs(self, case: RAGCase) -> str | None:
        if case.reference_context_ids is None:
            return "no reference_context_ids"
        if not case.reference_context_ids:
            return "reference_context_ids is empty"
        if case.retrieved_ids() is None:
            # the case builder says what in the trace could give them an id
            return case.retrieved_ids_mismatch or "no retrieved document ids captured"
        if case.retrieved_ids_mismatch:
            return case.retrieved_ids_mismatch
        return None

    #: precision: the share of the distinct retrieved ids; recall: of the reference ids.
    _over_retrieved: ClassVar[bool] = False

    def _fast_scores(self, cases: Sequence[RAGCase], memos: list[Any]) -> list[float | None]:
        over_retrieved = self._over_retrieved
        out: list[float | None] = []
        append = out.append
        for case in cases:
            ref = case.reference_context_ids
            ret = case.retrieved_context_ids
            if ret is None:
                ret = case.retrieved_ids()
            if (
                not ref
                or ret is None
                or (over_retrieved and not ret)
                or case.retrieved_ids_mismatch
            ):
                append(None)  # missing_inputs() gives a reason
                continue
            base, other = (set(ret), ref) if over_retrieved else (set(ref), ret)
            append(len(base.intersection(other)) / len(base))
        return out

    @staticmethod
    def _sets(case: RAGCase) -> tuple[set[str], set[str]]:
        # The case's validators already made every id a str.
        return set(case.reference_context_ids or ()), set(case.retrieved_ids() or ())


class IDContextRecall(_IDMetric):
    name = "id_context_recall"

    def _score_now(self, case: RAGCase) -> Outcome:
        ref, ret = self._sets(case)
        found = ref & ret
        missing = sorted(ref - ret)
        reason = f"{len(found)} of {len(ref)} reference ids retrieved"
        if missing:
            reason += "; missing: " + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        return Outcome(
            len(found) / len(ref),
            reason,
            {"retrieved_ids": sorted(ret), "matched": sorted(found), "missing": missing},
        )


class IDContextPrecision(_IDMetric):
    name = "id_context_precision"
    _over_retrieved = True

    def missing_inputs(self, case: RAGCase) -> str | None:
        missing = super().missing_inputs(case)
        if missing is None and not case.retrieved_ids():
            return "no document was retrieved"
        return missing

    def _score_now(self, case: RAGCase) -> Outcome:
        ref, ret = self._sets(case)
        found = ret & ref
        return Outcome(
            len(found) / len(ret),
            f"{len(found)} of {len(ret)} distinct retrieved ids are reference ids",
            {"retrieved_ids": sorted(ret), "matched": sorted(found), "extra": sorted(ret - ref)},
        )
