"""Sliding windows of joined (score, feedback) pairs, and their agreement figures.

A *series* is (service, metric, feedback name, segment values).  Each holds the pairs
of the last ``agreement_window``, at most ``max_pairs`` (the oldest go first), one per
(trace id, user): a later feedback from the same user on the same request, or a
re-evaluated score, replaces the pair instead of adding one.  At most ``max_series``
series are kept; pairs of a new series beyond that are counted and dropped.

**Cost.**  :meth:`AgreementTracker.add` is O(1).  The figures of a series come from
:func:`ragtrace_collector.agreement.agreement`: two sorts and a walk, O(n log n) in its
pairs.  :meth:`AgreementTracker.refresh` recomputes only the series changed since the
last refresh, and at most ``budget`` pairs' worth of them per call (the rest wait for
the next call), so one call is bounded whatever the number of series; the stage runs
it on a worker thread.  ``benchmarks/agreement.py --quick`` measures ``agreement()``:
about 0.8 µs per pair with continuous scores (a 10,000-pair series in 8 ms), so a
refresh at the default budget (50,000 pairs) costs about 40 ms of one core, off
the event loop.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from ragtrace_collector.agreement import Agreement, agreement
from ragtrace_collector.feedback.config import FeedbackConfig

__all__ = ["DEFAULT_BUDGET", "AgreementTracker", "PairKey", "SeriesFigures", "SeriesKey"]

#: (service, metric, feedback name, segment values)
SeriesKey = tuple[str, str, str, tuple[str, ...]]
#: (trace id, user id or ""): one pair per request and user in a series.
PairKey = tuple[str, str]
#: Pairs recomputed per :meth:`AgreementTracker.refresh` call at most.
DEFAULT_BUDGET: Final = 50_000


@dataclass(slots=True)
class _Series:
    #: pair key -> (score, feedback value, when joined), oldest first
    pairs: OrderedDict[PairKey, tuple[float, float, float]] = field(default_factory=OrderedDict)
    threshold: float | None = None
    dirty: bool = True


@dataclass(frozen=True, slots=True)
class SeriesFigures:
    """The agreement of one series, as last computed."""

    key: SeriesKey
    figures: Agreement

    def as_dict(self, label_names: tuple[str, ...]) -> dict[str, Any]:
        service, metric, name, values = self.key
        a = self.figures
        return {
            "service": service,
            "metric": metric,
            "name": name,
            "segments": dict(zip(label_names, values, strict=False)),
            "pairs": a.pairs,
            "negatives": a.negatives,
            "positives": a.positives,
            "auroc": a.auroc,
            "interval": None if a.auroc_low is None else [a.auroc_low, a.auroc_high],
            "confidence": a.confidence,
            "kappa": a.kappa,
            "threshold": a.threshold,
        }


class AgreementTracker:
    """The pairs of every series and their figures.  :meth:`add` is called on the event
    loop; :meth:`refresh` may run on a thread (a lock guards the pairs)."""

    def __init__(self, config: FeedbackConfig, *, clock: Callable[[], float] = time.time) -> None:
        self._window = config.agreement_window
        self._max_pairs = config.max_pairs
        self._max_series = config.max_series
        self._clock = clock
        self._series: dict[SeriesKey, _Series] = {}
        self._figures: dict[SeriesKey, SeriesFigures] = {}
        self._lock = threading.Lock()
        #: Pairs dropped because the tracker held max_series series.
        self.refused = 0

    def __len__(self) -> int:
        return len(self._series)

    def add(
        self,
        series: SeriesKey,
        pair: PairKey,
        score: float,
        feedback: float,
        threshold: float | None,
        at: float,
    ) -> bool:
        """One joined pair (replacing the series' pair with the same key); False when
        the series is new and the tracker is full."""
        with self._lock:
            held = self._series.get(series)
            if held is None:
                if len(self._series) >= self._max_series:
                    self.refused += 1
                    return False
                held = self._series[series] = _Series()
            pairs = held.pairs
            pairs.pop(pair, None)
            pairs[pair] = (score, feedback, at)
            while len(pairs) > self._max_pairs:
                pairs.popitem(last=False)
            held.threshold = threshold
            held.dirty = True
            return True

    def pairs(self, series: SeriesKey) -> dict[PairKey, tuple[float, float]]:
        """The (score, feedback) pairs a series holds now, by key."""
        with self._lock:
            held = self._series.get(series)
            if held is None:
                return {}
            return {k: (s, f) for k, (s, f, _) in held.pairs.items()}

    def refresh(self, budget: int = DEFAULT_BUDGET) -> list[SeriesFigures]:
        """Drop pairs older than the window, recompute the changed series (at most
        ``budget`` pairs' worth; the others stay dirty), and return every series'
        figures.  A series left with no pairs is forgotten."""
        cutoff = self._clock() - self._window
        todo: list[tuple[SeriesKey, list[tuple[float, float]], float | None]] = []
        gone: list[SeriesKey] = []
        with self._lock:
            keys = list(self._series)
        spent = 0
        for key in keys:
            # The lock is taken per series (at most max_pairs copied under it), so add()
            # on the event loop waits at most for one series' copy.
            with self._lock:
                held = self._series.get(key)
                if held is None:
                    continue
                pairs = held.pairs
                while pairs and next(iter(pairs.values()))[2] <= cutoff:
                    pairs.popitem(last=False)
                    held.dirty = True
                if not pairs:
                    del self._series[key]
                    gone.append(key)
                    continue
                if held.dirty and spent < budget:
                    spent += len(pairs)
                    held.dirty = False
                    todo.append((key, [(s, f) for s, f, _ in pairs.values()], held.threshold))
        # The figures are computed outside the lock: add() never waits for a sort.
        computed = {
            key: SeriesFigures(key, agreement(rows, threshold=threshold))
            for key, rows, threshold in todo
        }
        with self._lock:
            for key in gone:
                if key not in self._series:
                    self._figures.pop(key, None)
            self._figures.update(computed)
            return list(self._figures.values())

    def figures(self) -> list[SeriesFigures]:
        """The figures as last computed by :meth:`refresh`."""
        with self._lock:
            return list(self._figures.values())
