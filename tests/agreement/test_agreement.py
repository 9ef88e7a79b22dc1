"""``ragtrace_collector.agreement``: AUROC, its DeLong interval, Cohen's κ."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragtrace_collector import agreement as agr
from ragtrace_collector.agreement import agreement, auroc, cohen_kappa, feedback_value


def _brute_auroc(negatives: list[float], positives: list[float]) -> float:
    """The definition, O(n²): P(negative < positive), ties half."""
    total = 0.0
    for y in negatives:
        for x in positives:
            total += 1.0 if y < x else 0.5 if y == x else 0.0
    return total / (len(negatives) * len(positives))


def _brute_delong_variance(negatives: list[float], positives: list[float]) -> float:
    """DeLong's variance from its definition, O(n²) structural components."""

    def psi(x: float, y: float) -> float:
        return 1.0 if y < x else 0.5 if y == x else 0.0

    m, n = len(positives), len(negatives)
    v10 = [sum(psi(x, y) for y in negatives) / n for x in positives]
    v01 = [sum(psi(x, y) for x in positives) / m for y in negatives]

    def var(v: list[float]) -> float:
        mean = sum(v) / len(v)
        return sum((a - mean) ** 2 for a in v) / (len(v) - 1)

    return var(v10) / m + var(v01) / n


# ------------------------------------------------------------ hand-computed examples


def test_auroc_by_hand() -> None:
    # pairs (neg, pos): (.1,.35) yes, (.1,.8) yes, (.4,.35) no, (.4,.8) yes -> 3/4
    assert auroc([0.1, 0.4], [0.35, 0.8]) == 0.75


def test_ties_count_half() -> None:
    # (.5,.5) half twice, (.5,1) yes twice -> 3/4
    assert auroc([0.5, 0.5], [0.5, 1.0]) == 0.75
    assert auroc([0.3, 0.3, 0.3], [0.3]) == 0.5


def test_perfect_and_backwards() -> None:
    assert auroc([0.0, 0.1], [0.9, 1.0]) == 1.0
    assert auroc([0.9, 1.0], [0.0, 0.1]) == 0.0


def test_an_empty_class_has_no_auroc() -> None:
    assert auroc([], [0.3]) is None
    assert auroc([0.3], []) is None
    result = agreement([(0.9, 1.0), (0.2, 1.0)], threshold=0.5)
    assert result.auroc is None
    assert result.auroc_low is None
    assert result.auroc_high is None
    assert result.pairs == 2
    assert result.positives == 2


def test_delong_variance_by_hand() -> None:
    # V10 = [1/2, 1] and V01 = [1, 1/2]: sample variances 1/8 each -> 1/16 + 1/16.
    value, variance = agr._auroc_parts([0.1, 0.4], [0.35, 0.8])
    assert value == 0.75
    assert variance == pytest.approx(0.125)


def test_interval_by_hand() -> None:
    result = agreement(
        [(0.1, 0.0), (0.4, 0.0), (0.35, 1.0), (0.8, 1.0)], threshold=None, confidence=0.95
    )
    z = NormalDist().inv_cdf(0.975)
    half = z * math.sqrt(0.125) / (0.75 * 0.25)
    logit = math.log(3.0)
    assert result.auroc_low == pytest.approx(1 / (1 + math.exp(-(logit - half))))
    assert result.auroc_high == pytest.approx(1 / (1 + math.exp(-(logit + half))))


def test_a_perfect_separation_gets_the_exact_binomial_interval() -> None:
    result = agreement(
        [(0.0, 0.0), (0.1, 0.0), (0.9, 1.0), (1.0, 1.0), (0.95, 1.0)], threshold=None
    )
    assert result.auroc == 1.0
    assert result.auroc_low == pytest.approx(0.025**0.5)  # 2 negatives: the smaller class
    assert result.auroc_high == 1.0
    backwards = agreement([(1.0, 0.0), (0.0, 1.0)], threshold=None)
    assert backwards.auroc == 0.0
    assert backwards.auroc_low == 0.0
    assert backwards.auroc_high == pytest.approx(0.975)


def test_one_request_in_a_class_uses_the_van_dantzig_bound() -> None:
    result = agreement([(0.5, 0.0), (0.2, 1.0), (0.9, 1.0)], threshold=None)
    assert result.auroc == 0.5
    z = NormalDist().inv_cdf(0.975)
    half = z * math.sqrt(0.25 / 1) / 0.25
    assert result.auroc_low == pytest.approx(1 / (1 + math.exp(half)))
    assert result.auroc_high == pytest.approx(1 / (1 + math.exp(-half)))


def test_few_pairs_give_a_wide_interval_and_many_a_narrow_one() -> None:
    rng = random.Random(7)

    def sample(n: int) -> list[tuple[float, float]]:
        pairs = []
        for _ in range(n):
            positive = rng.random() < 0.5
            pairs.append((rng.gauss(1.0 if positive else 0.0, 1.0), 1.0 if positive else 0.0))
        return pairs

    def width(n: int) -> float:
        result = agreement(sample(n), threshold=None)
        assert result.auroc_low is not None
        assert result.auroc_high is not None
        return result.auroc_high - result.auroc_low

    assert width(12) > 0.3
    assert width(2000) < 0.1


def test_the_interval_covers_the_true_auroc_about_as_often_as_it_says() -> None:
    """200 seeded samples of 30 + 30 normal scores, shift 1: true AUROC Φ(1/√2)."""
    rng = random.Random(20261127)
    truth = NormalDist().cdf(1 / math.sqrt(2))
    covered = 0
    reps = 200
    for _ in range(reps):
        pairs = [(rng.gauss(0.0, 1.0), 0.0) for _ in range(30)]
        pairs += [(rng.gauss(1.0, 1.0), 1.0) for _ in range(30)]
        result = agreement(pairs, threshold=None)
        assert result.auroc_low is not None
        assert result.auroc_high is not None
        covered += result.auroc_low <= truth <= result.auroc_high
    assert 0.88 <= covered / reps <= 0.995


def test_kappa_by_hand() -> None:
    # pass:     T T F T F      positive: T T F F T
    # agree 3/5; chance .6*.6 + .4*.4 = .52; κ = .08/.48
    pairs = [(0.9, 1.0), (0.8, 1.0), (0.2, 0.0), (0.7, 0.0), (0.3, 1.0)]
    assert agreement(pairs, threshold=0.5).kappa == pytest.approx(0.08 / 0.48)


def test_kappa_edges() -> None:
    assert cohen_kappa([]) is None
    assert cohen_kappa([(True, True), (True, True)]) is None  # chance agreement is total
    assert cohen_kappa([(True, True), (False, False)]) == 1.0
    assert cohen_kappa([(True, False), (False, True)]) == -1.0
    assert agreement([(0.9, 1.0)], threshold=None).kappa is None


def test_pass_is_score_at_or_above_the_threshold() -> None:
    pairs = [(0.5, 1.0), (0.49, 0.0)]
    assert agreement(pairs, threshold=0.5).kappa == 1.0


def test_number_feedback_is_negative_below_one_half() -> None:
    result = agreement([(0.1, 0.49), (0.2, 0.5), (0.3, 0.0), (0.4, 1.0)], threshold=None)
    assert (result.negatives, result.positives) == (2, 2)


def test_bad_pairs_are_a_callers_bug() -> None:
    with pytest.raises(ValueError, match="finite"):
        agreement([(math.nan, 1.0)], threshold=None)
    with pytest.raises(ValueError, match="feedback"):
        agreement([(0.5, 2.0)], threshold=None)
    with pytest.raises(ValueError, match="confidence"):
        agreement([], threshold=None, confidence=1.0)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (True, 1.0),
        (False, 0.0),
        (0, 0.0),
        (1, 1.0),
        (0.25, 0.25),
        ("0.75", 0.75),
        (" TRUE ", 1.0),
        ("no", 0.0),
        ("thumbs_down", 0.0),
        ("👍", 1.0),
        (2, None),
        (-0.1, None),
        (math.nan, None),
        (math.inf, None),
        (10**400, None),  # past a float's range: a bad label, not a crash
        ("", None),
        ("maybe", None),
        ("nan", None),
        (None, None),
        ([1], None),
        ({"v": 1}, None),
    ],
)
def test_feedback_value(raw: object, expected: float | None) -> None:
    assert feedback_value(raw) == expected


# ------------------------------------------------------------------- properties

_scores = st.lists(
    st.one_of(
        st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),  # ties, as 0/1 metrics make
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(negatives=_scores, positives=_scores)
def test_auroc_matches_the_brute_force_definition(
    negatives: list[float], positives: list[float]
) -> None:
    assert auroc(negatives, positives) == pytest.approx(_brute_auroc(negatives, positives))


@settings(max_examples=300, deadline=None)
@given(
    negatives=_scores.filter(lambda v: len(v) >= 2),
    positives=_scores.filter(lambda v: len(v) >= 2),
)
def test_delong_variance_matches_its_definition(
    negatives: list[float], positives: list[float]
) -> None:
    _, variance = agr._auroc_parts(negatives, positives)
    assert variance == pytest.approx(
        _brute_delong_variance(negatives, positives), rel=1e-9, abs=1e-12
    )


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1),
            st.one_of(st.sampled_from([0.0, 1.0]), st.floats(min_value=0, max_value=1)),
        ),
        max_size=60,
    ),
    threshold=st.floats(min_value=0, max_value=1),
)
def test_agreement_is_consistent(pairs: list[tuple[float, float]], threshold: float) -> None:
    result = agreement(pairs, threshold=threshold)
    assert result.pairs == len(pairs) == result.negatives + result.positives
    if result.auroc is None:
        assert result.negatives == 0 or result.positives == 0
    else:
        assert result.auroc_low is not None
        assert result.auroc_high is not None
        assert 0.0 <= result.auroc_low <= result.auroc <= result.auroc_high <= 1.0
    if result.kappa is not None:
        assert -1.0 - 1e-12 <= result.kappa <= 1.0 + 1e-12
        # κ from its definition over the 2x2 table
        table = [(s >= threshold, f >= 0.5) for s, f in pairs]
        po = sum(a == b for a, b in table) / len(table)
        pa = sum(a for a, _ in table) / len(table)
        pb = sum(b for _, b in table) / len(table)
        pe = pa * pb + (1 - pa) * (1 - pb)
        assert result.kappa == pytest.approx((po - pe) / (1 - pe))


@settings(max_examples=200, deadline=None)
@given(negatives=_scores, positives=_scores)
def test_swapping_the_classes_mirrors_the_auroc(
    negatives: list[float], positives: list[float]
) -> None:
    forward = auroc(negatives, positives)
    backward = auroc(positives, negatives)
    assert forward is not None
    assert backward is not None
    assert forward + backward == pytest.approx(1.0)
