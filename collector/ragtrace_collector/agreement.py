"""How well a metric's scores agree with what users said: AUROC, its interval, Cohen's κ.

A value module (no stage, no I/O, no clock), used by offline evaluation (``eval
--feedback-column``) and, later, by the collector's live join of feedback to scores.

Input: (score, feedback) pairs for one metric and one feedback name.  A feedback is a
number in [0, 1] (a bool is 1.0 or 0.0); it is *negative* below 0.5
(:func:`ragtrace.semconv.feedback_outcome`, the SDK's rule).

* **AUROC** of the score against the feedback: the probability that a request with
  negative feedback scored lower than one with positive feedback, ties counting half.
  0.5 is chance, 1.0 a perfect separation, below 0.5 the metric is backwards.  Computed
  from rank sums (Mann-Whitney U with midranks) in O(n log n).
* **Its confidence interval**, by DeLong's method (DeLong, DeLong and Clarke-Pearson
  1988), in the O(n log n) midrank form of Sun and Xu (2014), taken on the logit scale
  so it stays inside (0, 1).  Why DeLong: it is nonparametric (Hanley-McNeil's formula
  assumes exponential-shaped score distributions and ignores ties, which are common
  with 0/1 metrics), it is exact arithmetic with no random state (a bootstrap needs a
  seed and costs hundreds of recomputations per refresh, too much for a value the
  collector refreshes continuously), and it is what pROC and most papers report.
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
import numbers
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
    if isinstance(raw, bool):
        return 1.0 if raw else 0.0
    if isinstance(raw, numbers.Real):
        number = float(raw)
    elif isinstance(raw, str):
        text = raw.strip().lower()
        if text in _TRUE:
            return 1.0
        if text in _FALSE:
            return 0.0
        try:
            number = float(text)
        except ValueError:
            return None
    else:
        return None
    if math.isfinite(number) and 0.0 <= number <= 1.0:
        return number
    return None


def is_negative(feedback: float) -> bool:
    """Negative feedback: below 0.5 (a thumbs-down is 0.0)."""
    return semconv.feedback_outcome(feedback) == semconv.FEEDBACK_NEGATIVE


def _midranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values``, tied values sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    n = len(order)
    while start < n:
        end = start
        value = values[order[start]]
        while end + 1 < n and values[order[end + 1]] == value:
            end += 1
        mean = (start + end) / 2.0 + 1.0
        for k in range(start, end + 1):
            ranks[order[k]] = mean
        start = end + 1
    return ranks


def auroc(negative_scores: Sequence[float], positive_scores: Sequence[float]) -> float | None:
    """P(a negative scored lower than a positive), ties half; None if a class is empty."""
    return _auroc_parts(negative_scores, positive_scores)[0]


def _auroc_parts(
    negatives: Sequence[float], positives: Sequence[float]
) -> tuple[float | None, float]:
    """(AUROC, DeLong variance); the variance is 0.0 when it cannot be estimated."""
    m, n = len(positives), len(negatives)
    if m == 0 or n == 0:
        return None, 0.0
    combined = [*positives, *negatives]
    ranks = _midranks(combined)
    within_pos = _midranks(positives)
    within_neg = _midranks(negatives)
    # Structural components: for each positive, the share of negatives below it (ties
    # half); for each negative, the share of positives above it.
    v10 = [(ranks[i] - within_pos[i]) / n for i in range(m)]
    v01 = [1.0 - (ranks[m + j] - within_neg[j]) / m for j in range(n)]
    area = math.fsum(ranks[:m]) - m * (m + 1) / 2.0
    value = min(1.0, max(0.0, area / (m * n)))
    if m < 2 or n < 2:
        return value, 0.0
    return value, _sample_variance(v10) / m + _sample_variance(v01) / n


def _sample_variance(values: Sequence[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)


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
