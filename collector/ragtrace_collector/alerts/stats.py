"""Streaming summaries and the one-sided tests the drop detector uses.

A :class:`Summary` holds ``(n, mean, M2)`` (Welford), so a time bucket costs three
numbers however many scores fall into it, and buckets merge exactly (Chan et al.).
The tests work from summaries alone:

* :func:`welch_less`: Welch's unequal-variance t-test, H1: mean(window) < mean(baseline);
* :func:`one_sample_less`: one-sample t-test, H1: mean(window) < a fixed value.

Both return the one-sided p-value.  Zero variance is handled explicitly (the t
statistic is then undefined): a mean below the reference is certain (p = 0), any
other mean is not a drop (p = 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scipy.special import stdtr

__all__ = ["Summary", "TestResult", "one_sample_less", "welch_less"]


@dataclass(slots=True)
class Summary:
    """Count, mean and sum of squared deviations of a set of scores."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    def merge(self, other: Summary) -> None:
        """Fold ``other`` into this summary (exact, order-independent up to rounding)."""
        if other.n == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2 = other.n, other.mean, other.m2
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.mean += delta * other.n / n
        self.m2 += other.m2 + delta * delta * self.n * other.n / n
        self.n = n

    @classmethod
    def of(cls, values: Iterable[float]) -> Summary:
        summary = cls()
        for value in values:
            summary.add(value)
        return summary

    @classmethod
    def merged(cls, parts: Iterable[Summary]) -> Summary:
        total = cls()
        for part in parts:
            total.merge(part)
        return total

    @property
    def variance(self) -> float:
        """Sample variance (ddof=1); NaN below two values."""
        if self.n < 2:
            return math.nan
        return max(self.m2, 0.0) / (self.n - 1)


@dataclass(frozen=True, slots=True)
class TestResult:
    """A one-sided test's outcome.  ``statistic`` is t (±inf with zero variance)."""

    statistic: float
    df: float
    p_value: float


def _p_less(diff: float, se: float, df: float) -> TestResult:
    if se <= 0.0 or not math.isfinite(se):
        if diff < 0:
            return TestResult(statistic=-math.inf, df=df, p_value=0.0)
        return TestResult(statistic=math.inf if diff > 0 else 0.0, df=df, p_value=1.0)
    t = diff / se
    return TestResult(statistic=t, df=df, p_value=float(stdtr(df, t)))


def one_sample_less(window: Summary, value: float, margin: float = 0.0) -> TestResult:
    """One-sample one-sided t-test of H1: mean(window) < value - margin."""
    if window.n < 2:
        raise ValueError("a t-test needs at least two values")
    se = math.sqrt(window.variance / window.n)
    return _p_less(window.mean - value + margin, se, float(window.n - 1))


def welch_less(window: Summary, baseline: Summary, margin: float = 0.0) -> TestResult:
    """Welch's one-sided t-test of H1: mean(window) < mean(baseline) - margin."""
    if window.n < 2 or baseline.n < 2:
        raise ValueError("a t-test needs at least two values on each side")
    a = window.variance / window.n
    b = baseline.variance / baseline.n
    se2 = a + b
    if se2 > 0:  # Welch-Satterthwaite, scaled so tiny variances cannot underflow
        fa, fb = a / se2, b / se2
        df = 1.0 / (fa * fa / (window.n - 1) + fb * fb / (baseline.n - 1))
    else:
        df = float(window.n + baseline.n - 2)
    return _p_less(window.mean - baseline.mean + margin, math.sqrt(se2), df)
