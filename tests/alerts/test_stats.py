"""Streaming summaries and one-sided tests, checked against numpy and scipy on raw data.

scipy.stats is imported in the tests that use it, not when the suite is collected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragtrace_collector.alerts.stats import Summary, one_sample_less, welch_less

#: Scores as metrics produce them: ratios on a grid (no denormal noise).
score = st.integers(min_value=0, max_value=1000).map(lambda k: k / 1000)
scores = st.lists(score, min_size=2, max_size=200)
any_floats = st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=200)


@given(any_floats, st.integers(min_value=1, max_value=8))
@settings(max_examples=200, deadline=None)
def test_merged_summaries_equal_the_summary_of_all_values(values: list[float], parts: int) -> None:
    chunks = [values[i::parts] for i in range(parts)]
    merged = Summary.merged(Summary.of(c) for c in chunks)
    assert merged.n == len(values)
    assert merged.mean == pytest.approx(float(np.mean(values)), abs=1e-12)
    assert merged.variance == pytest.approx(float(np.var(values, ddof=1)), abs=1e-12)


def test_variance_needs_two_values() -> None:
    assert math.isnan(Summary.of([0.5]).variance)
    assert Summary().n == 0


_SCIPY_NEAR_CONSTANT = "ignore:Precision loss occurred:RuntimeWarning"


@pytest.mark.filterwarnings(_SCIPY_NEAR_CONSTANT)
@given(scores, scores)
@settings(max_examples=200, deadline=None)
def test_welch_matches_scipy(window: list[float], baseline: list[float]) -> None:
    from scipy import stats as sps

    res = welch_less(Summary.of(window), Summary.of(baseline))
    if len(set(window)) == 1 and len(set(baseline)) == 1:
        # Both samples constant: the t statistic is undefined (see test_zero_variance).
        # Test "is it constant" on the values, not with np.var: numpy's two-pass mean
        # of e.g. [0.003] * 3 is off by one ulp, so its variance is ~1e-37 instead of 0
        # and scipy turns that rounding noise into an arbitrary t and p.
        return
    ref = sps.ttest_ind(window, baseline, equal_var=False, alternative="less")
    assert res.p_value == pytest.approx(float(ref.pvalue), abs=1e-9)
    assert res.statistic == pytest.approx(float(ref.statistic), rel=1e-9, abs=1e-9)


@pytest.mark.filterwarnings(_SCIPY_NEAR_CONSTANT)
@given(scores, score)
@settings(max_examples=200, deadline=None)
def test_one_sample_matches_scipy(window: list[float], value: float) -> None:
    from scipy import stats as sps

    if len(set(window)) == 1:
        return  # zero variance: see test_zero_variance
    res = one_sample_less(Summary.of(window), value)
    ref = sps.ttest_1samp(window, value, alternative="less")
    assert res.p_value == pytest.approx(float(ref.pvalue), abs=1e-9)
    assert res.df == len(window) - 1


def test_the_margin_shifts_the_null_hypothesis() -> None:
    from scipy import stats as sps

    rng = np.random.default_rng(7)
    window = rng.normal(0.6, 0.1, 200).clip(0, 1)
    baseline = rng.normal(0.8, 0.1, 2000).clip(0, 1)
    w, b = Summary.of(window.tolist()), Summary.of(baseline.tolist())
    # H1: mean(w) < mean(b) - 0.1  <=>  mean(w + 0.1) < mean(b)
    ref = sps.ttest_ind(window + 0.1, baseline, equal_var=False, alternative="less")
    assert welch_less(w, b, 0.1).p_value == pytest.approx(float(ref.pvalue), rel=1e-9)
    ref1 = sps.ttest_1samp(window, 0.8 - 0.1, alternative="less")
    assert one_sample_less(w, 0.8, 0.1).p_value == pytest.approx(float(ref1.pvalue), rel=1e-9)
    # a 0.2 drop is certain against 0, still clear against a 0.1 margin, not against 0.25
    assert welch_less(w, b).p_value < 1e-12
    assert welch_less(w, b, 0.1).p_value < 1e-12
    assert welch_less(w, b, 0.25).p_value > 0.99


@pytest.mark.filterwarnings(_SCIPY_NEAR_CONSTANT)
def test_zero_variance() -> None:
    from scipy import stats as sps

    low, high = Summary.of([0.5] * 10), Summary.of([0.9] * 10)
    assert welch_less(low, high).p_value == 0.0
    assert welch_less(high, low).p_value == 1.0
    assert welch_less(low, low).p_value == 1.0
    # constant samples whose numpy variance is rounding noise, not 0 (hypothesis found
    # these): exact here, where scipy reports p=0.146 and t=-9.8e15
    tiny = Summary.of([0.003] * 3)
    assert tiny.m2 == 0.0
    assert welch_less(Summary.of([0.003] * 2), tiny).p_value == 1.0
    below = welch_less(Summary.of([0.0] * 2), tiny)
    assert (below.statistic, below.p_value) == (-math.inf, 0.0)
    assert one_sample_less(low, 0.9).p_value == 0.0
    assert one_sample_less(low, 0.5).p_value == 1.0
    # one side constant, the other not: a proper test with Welch's df
    mixed = Summary.of([0.8, 1.0] * 5)
    ref = sps.ttest_ind([0.5] * 10, [0.8, 1.0] * 5, equal_var=False, alternative="less")
    assert welch_less(low, mixed).p_value == pytest.approx(float(ref.pvalue))


def test_too_few_values_is_an_error() -> None:
    with pytest.raises(ValueError, match="two values"):
        welch_less(Summary.of([0.1]), Summary.of([0.2, 0.3]))
    with pytest.raises(ValueError, match="two values"):
        one_sample_less(Summary.of([0.1]), 0.5)
