"""The agreement tracker: one pair per key, bounded pairs and series, window expiry,
figures from agreement()."""

from __future__ import annotations

from ragtrace_collector.agreement import agreement
from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.tracker import AgreementTracker

SERIES = ("shop", "faithfulness", "user_feedback", ())


class Clock:
    now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_key_replaces_its_pair() -> None:
    tracker = AgreementTracker(FeedbackConfig())
    assert tracker.add(SERIES, ("t1", "u"), 0.2, 1.0, 0.5, 1.0)
    assert tracker.add(SERIES, ("t1", "u"), 0.3, 0.0, 0.5, 2.0)
    assert tracker.pairs(SERIES) == {("t1", "u"): (0.3, 0.0)}


def test_pairs_are_bounded_per_series_oldest_first() -> None:
    tracker = AgreementTracker(FeedbackConfig(max_pairs=3))
    for i in range(5):
        tracker.add(SERIES, (f"t{i}", ""), 0.5, 1.0, 0.5, float(i))
    tracker.add(SERIES, ("t2", ""), 0.1, 0.0, 0.5, 9.0)  # refreshed: now the newest
    tracker.add(SERIES, ("t5", ""), 0.5, 1.0, 0.5, 10.0)
    assert list(tracker.pairs(SERIES)) == [("t4", ""), ("t2", ""), ("t5", "")]


def test_series_beyond_the_bound_are_refused_and_counted() -> None:
    tracker = AgreementTracker(FeedbackConfig(max_series=2))
    for metric in ("a", "b", "c"):
        tracker.add(("shop", metric, "f", ()), ("t", ""), 0.5, 1.0, None, 1.0)
    assert len(tracker) == 2
    assert tracker.refused == 1


def test_refresh_drops_old_pairs_and_recomputes_only_what_changed() -> None:
    clock = Clock()
    tracker = AgreementTracker(FeedbackConfig(agreement_window=100), clock=clock)
    rows = [(0.1, 0.0), (0.4, 0.0), (0.3, 1.0), (0.9, 1.0)]
    for i, (score, value) in enumerate(rows):
        tracker.add(SERIES, (f"t{i}", ""), score, value, 0.5, clock.now + i)
    (figures,) = tracker.refresh()
    assert figures.figures == agreement(rows, threshold=0.5)
    clock.now += 101.5  # the first two pairs are older than the window
    (figures,) = tracker.refresh()
    assert figures.figures.pairs == 2
    clock.now += 100
    assert tracker.refresh() == []
    assert len(tracker) == 0


def test_refresh_spends_at_most_its_budget() -> None:
    tracker = AgreementTracker(FeedbackConfig(), clock=Clock())
    for metric in ("a", "b", "c"):
        for i in range(10):
            tracker.add(("s", metric, "f", ()), (f"t{i}", ""), i / 10, float(i % 2), 0.5, 999.0)
    assert len(tracker.refresh(budget=15)) == 2  # two series of 10 pairs, then stop
    assert len(tracker.refresh(budget=15)) == 3  # the third waited for the next call
