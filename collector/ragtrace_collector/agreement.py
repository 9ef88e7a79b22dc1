"""How well a metric's scores agree with what users said: AUROC, its interval, Cohen's κ.

A value module (no stage, no I/O, no clock), used by offline evaluation (``eval
--feedback-column``) and, later, by the collector's live join of feedback to scores.

Input: (score, feedback) pairs for one metric and one feedback name.  A feedback is a
number in [0, 1] (a bool is 1.0 or 0.0); it is *negative* below 0.5
(:func:`ragtrace.semconv.feedback_outcome`, the SDK's rule).

* **AUROC** of the score against the feedback: the probability that a request with
  negative feedback scored lower than one with positive feedback, ties counting half.
  0.5 is chance, 1.0 a perfect separation, below 0.5 the metric is backwards.  Computed
  as the Mann-Whitney U (a rank sum, ties as half) in O(n log n): one sort per class
  and one walk over both.
* **Its confidence interval**, by DeLong's method (DeLong, DeLong and Clarke-Pearson
  1988), computed in the same walk (the O(n log n) approach of Sun and Xu, 2014),
  taken on the logit scale so it stays inside (0, 1).  Why DeLong: it is nonparametric
  (Hanley-McNeil's formula assumes exponential-shaped score distributions and ignores
  ties, which are common with 0/1 metrics), it is exact integer arithmetic with no
  random state (a bootstrap needs a seed and costs hundreds of recomputations per
  refresh, too much for a value the collector refreshes continuously), and it is what
  pROC and most papers report.
  DeLong's variance vanishes when the sample is perfectly separated (AUROC 0 or 1) or
  when either class has a single request; there the interval falls back to a bound
  that counts only the smaller class: for a perfect separation with k requests in the
  smaller class, the exact binomial (Clopper-Pearson) interval of k successes in k
  trials, ``[(α/2)^(1/k), 1]``; otherwise the van Dantzig bound on the variance,
  ``A(1 - A) / k``.  Both are wider than DeLong's, as they should be with so little data.
* **Cohen's κ** of pass/fail at the metric's threshold (pass is ``score >= threshold``,
  the metrics' rule) against positive/negative feedback: agreement beyond what the two
  rates alone would give by chance.  1 is full agreement, 0 no better than chance.
* **The counts**: pairs, negatives, positives.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final

from ragtrace import semconv

__all__ = [
    "DEFAULT_CONFIDENCE",
    "Agreement",
    "agreement",
    "auroc",
    "cohen_kappa",
    "feedback_value",
    "is_negative",
]

#: The interval's coverage unless told otherwise.
DEFAULT_CONFIDENCE: Final = 0.95

_TRUE: Final = frozenset({"true", "yes", "y", "up", "positive", "pos", "thumbs_up", "👍"})
_FALSE: Final = frozenset({"false", "no", "n", "down", "negative", "neg", "thumbs_down", "👎"})


@dataclass(frozen=True, slots=True)
class Agreement:
    """The agreement of one metric with one kind of feedback."""

    #: (score, feedback) pairs measured
    pairs: int
    #: pairs with negative feedback (below 0.5)
    negatives: int
    #: pairs with positive feedback
    positives: int
    #: None unless both classes are present
    auroc: float | None
    #: the interval's bounds (None with ``auroc``)
    auroc_low: float | None
    auroc_high: float | None
    #: None without a threshold, or when chance agreement is already total (one class
    #: of feedback and all scores on one side of the threshold)
    kappa: float | None
    threshold: float | None
    confidence: float


def feedback_value(raw: object) -> float | None:
    """A feedback cell (JSON, CSV, a DataFrame) as a number in [0, 1], or None if bad.

    Accepts a bool, a finite number in [0, 1], or text: such a number, ``true``/``false``
    and a few thumbs words (``yes``/``no``, ``up``/``down``, ``positive``/``negative``).
    """
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text in _TRUE:
            return 1.0
        if text in _FALSE:
            return 0.0
        try:
            raw = float(text)
        except ValueError:
            return None
    read = semconv.feedback_number(raw)
    return None if read is None else read[0]


def is_negative(feedback: float) -> bool:
    """Negative feedback: below 0.5 (a thumbs-down is 0.0)."""
    return semconv.feedback_outcome(feedback) == semconv.FEEDBACK_NEGATIVE


def auroc(negative_scores: Sequence[float], positive_scores: Sequence[float]) -> float | None:
    """P(a negative scored lower than a positive), ties half; None if a class is empty.

    Scores must be finite (:func:`agreement` checks them).
    """
    return _auroc_parts(negative_scores, positive_scores)[0]


def _auroc_parts(
    negatives: Sequence[float], positives: Sequence[float]
) -> tuple[float | None, float]:
    """(AUROC, DeLong variance); the variance is 0.0 when it cannot be estimated.

    One sort per class, then one walk over both in order, a group of tied scores at a
    time.  DeLong's structural components are, for each positive, the share of
    negatives below it (ties half) and, for each negative, the share of positives
    above it.  They are kept doubled as integers (``2 * below + tied``), so the sums
    of their squares, and the variances, are exact.
    """
    m, n = len(positives), len(negatives)
    if m == 0 or n == 0:
        return None, 0.0
    pos, neg = sorted(positives), sorted(negatives)
    i = j = 0
    sum10 = squares10 = sum01 = squares01 = 0
    while i < m or j < n:
        value = pos[i] if j >= n or (i < m and pos[i] <= neg[j]) else neg[j]
        start_i, start_j = i, j
        while i < m and pos[i] == value:
            i += 1
        while j < n and neg[j] == value:
            j += 1
        tied_pos, tied_neg = i - start_i, j - start_j
        if tied_pos:
            k = 2 * start_j + tied_neg  # 2n times each tied positive's component
            sum10 += tied_pos * k
            squares10 += tied_pos * k * k
        if tied_neg:
            k = 2 * (m - i) + tied_pos  # 2m times each tied negative's component
            sum01 += tied_neg * k
            squares01 += tied_neg * k * k
    area = sum10 / (2 * m * n)
    if m < 2 or n < 2:
        return area, 0.0
    var10 = (m * squares10 - sum10 * sum10) / (m * (m - 1) * 4 * n * n)
    var01 = (n * squares01 - sum01 * sum01) / (n * (n - 1) * 4 * m * m)
    return area, var10 / m + var01 / n


def _interval(
    value: float, variance: float, smaller: int, confidence: float
) -> tuple[float, float]:
    alpha = 1.0 - confidence
    if value >= 1.0:
        return (alpha / 2.0) ** (1.0 / smaller), 1.0
    if value <= 0.0:
        return 0.0, 1.0 - (alpha / 2.0) ** (1.0 / smaller)
    if variance <= 0.0:
        variance = value * (1.0 - value) / smaller  # van Dantzig's bound
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    centre = math.log(value / (1.0 - value))
    half = z * math.sqrt(variance) / (value * (1.0 - value))
    return _expit(centre - half), _expit(centre + half)


def _expit(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def cohen_kappa(rows: Iterable[tuple[bool, bool]]) -> float | None:
    """κ between two yes/no raters, given (a says yes, b says yes) per item.

    None with no items, or when chance agreement is 1 (both raters constant and equal).
    """
    n = both = a_yes = b_yes = 0
    for a, b in rows:
        n += 1
        a_yes += a
        b_yes += b
        both += a and b
    if n == 0:
        return None
    neither = n - a_yes - b_yes + both
    observed = (both + neither) / n
    pa, pb = a_yes / n, b_yes / n
    expected = pa * pb + (1.0 - pa) * (1.0 - pb)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1.0 - expected)


def agreement(
    pairs: Iterable[tuple[float, float]],
    *,
    threshold: float | None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Agreement:
    """The agreement of the scores with the feedback, over (score, feedback) pairs.

    Scores must be finite and feedback in [0, 1] (:func:`feedback_value` reads raw
    cells); a pair that is not raises ``ValueError``, as a caller's bug.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    negatives: list[float] = []
    positives: list[float] = []
    rows: list[tuple[bool, bool]] = []
    for score, feedback in pairs:
        if not math.isfinite(score):
            raise ValueError(f"score {score!r} is not a finite number")
        if not 0.0 <= feedback <= 1.0:
            raise ValueError(f"feedback {feedback!r} is not in [0, 1]")
        positive = not is_negative(feedback)
        (positives if positive else negatives).append(score)
        if threshold is not None:
            rows.append((score >= threshold, positive))
    value, variance = _auroc_parts(negatives, positives)
    low = high = None
    if value is not None:
        low, high = _interval(value, variance, min(len(negatives), len(positives)), confidence)
    return Agreement(
        pairs=len(negatives) + len(positives),
        negatives=len(negatives),
        positives=len(positives),
        auroc=value,
        auroc_low=low,
        auroc_high=high,
        kappa=cohen_kappa(rows) if threshold is not None else None,
        threshold=threshold,
        confidence=confidence,
    )
