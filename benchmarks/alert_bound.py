"""The fastest any drop alert can page at a given false-alarm budget (Lorden's bound).

A rule that pages at most once per ``budget`` on unchanged traffic cannot detect a
drop faster, on average, than the CUSUM of the exact log likelihood ratios does at
that budget (Lorden 1971; Moustakides 1986; exactly, for the continuous-time limit,
Shiryaev 1996).  With ``I`` the Kullback-Leibler information per minute that the
scores carry about the drop, that CUSUM's figures in continuous time are closed form:

* mean time between false alarms at level ``h``: ``(e**h - h - 1) / I``;
* mean time to page a drop that starts while the sum is at zero: ``(h + e**-h - 1) / I``;
* the median time to page: the first passage of the same sum (drift ``I``, variance
  ``2 I``, never below zero) to ``h``, simulated on a fine grid (20,000 paths, seeded).

``I`` per minute at ``r`` results a minute per side, mean ``p`` before and ``p - d``
after:

* a rule whose reference is known (a drop rule against a 24-hour baseline, which
  holds 96 times the window's results): the exact KL of one score, times ``r``
  (Bernoulli: ``KL(Bern(p - d) || Bern(p))``; Beta scores: ``d**2 / 2 var``);
* a canary rule, whose reference is the other side in the same window with ``k``
  times the candidate's results (``k`` = 1 for one value against another, 4 for one
  of five values against the other four): ``d**2 / (2 (var_after + var_before / k))``
  per candidate result, times ``r`` (the Gaussian approximation: the reference's
  noise counts too, less the more results it has).

A rule that compares ``n`` series in one service keeps its budget per rule, so each
series gets ``n`` times the budget.  The classic first-order figure ``ln(ARL0) / KL``
(per result) is printed too: it ignores the ``- 1`` and the ``I`` inside the log and
overstates the bound at these traffic rates.

Run: ``.venv/bin/python benchmarks/alert_bound.py [--per-window 60] [--budget-days 30]``
(instant).  Compare with ``benchmarks/alert_oc.py``, which measures the detector.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

MEAN = 0.8
BETA_K = 4.0  # benchmarks/alert_oc.py's Beta scores: var = m (1 - m) / (k + 1)


@dataclass(frozen=True)
class Case:
    name: str
    window_min: float
    series: int  # series the rule compares in one service
    reference: float  # the reference side's results per candidate result; 0: known


CASES = [
    Case("canary, defaults (15m), 1 value vs rest (2 series)", 15, 2, 1),
    Case("canary, defaults, 5 values vs rest", 15, 5, 4),
    Case("canary, docs example (10m, canary vs production)", 10, 1, 1),
    Case("drop rule, defaults (15m vs 24h)", 15, 1, 0),
]


def _var(noise: str, m: float) -> float:
    return m * (1 - m) / (BETA_K + 1) if noise == "beta" else m * (1 - m)


def _kl_bernoulli(q: float, p: float) -> float:
    return q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))


def information(case: Case, noise: str, drop: float, rate: float) -> tuple[float, float]:
    """KL information per minute and per result (a result: one score of the candidate,
    with one of the other side for a canary rule)."""
    before, after = _var(noise, MEAN), _var(noise, MEAN - drop)
    if case.reference:
        per = drop * drop / (2 * (after + before / case.reference))
    elif noise == "bernoulli":
        per = _kl_bernoulli(MEAN - drop, MEAN)
    else:
        per = drop * drop / (2 * after)
    return per * rate, per


def bound(info: float, arl0: float) -> tuple[float, float, float]:
    """The optimal CUSUM's level, mean and median time to page, for a mean time
    between false alarms ``arl0`` (minutes) at ``info`` nats a minute."""
    h = brentq(lambda x: (math.exp(x) - x - 1) / info - arl0, 1e-9, 100.0)
    mean = (h + math.exp(-h) - 1) / info
    return h, mean, _median_passage(info, h)


def _median_passage(info: float, h: float, paths: int = 20_000) -> float:
    """Median first passage to ``h`` of a CUSUM of drift ``info`` and variance
    ``2 info`` a minute, started at zero (steps of at most a 200th of the mean)."""
    rng = np.random.default_rng(28)
    dt = max(h / info, 1.0) / 200
    x = np.zeros(paths)
    hit = np.full(paths, np.inf)
    t = 0.0
    while np.isinf(hit).sum() > paths // 2 and t < 100 * h / info:
        t += dt
        x = np.maximum(0.0, x + info * dt + rng.normal(0.0, math.sqrt(2 * info * dt), paths))
        hit[np.isinf(hit) & (x >= h)] = t
    return float(np.median(hit))


def budget_for(info: float, median_min: float, arl0: float) -> float | None:
    """The mean time between false alarms (minutes) at which the optimal CUSUM's median
    time to page is ``median_min``; None when it is already no slower at ``arl0``."""
    if bound(info, arl0)[2] <= median_min:
        return None
    return float(brentq(lambda a: bound(info, a)[2] - median_min, 1.0, arl0, xtol=1.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-window", type=int, default=60, help="results per window/side")
    parser.add_argument("--budget-days", type=float, default=30.0, help="false-alarm budget")
    parser.add_argument("--target", type=float, default=70.0, help="minutes, for the last column")
    args = parser.parse_args()
    print(
        f"{args.per_window} results per window per side; one false page per"
        f" {args.budget_days:g} days per rule; scores of mean {MEAN} before the drop"
    )
    print(
        f"{'rule':52} {'scores':9} {'drop':>4} {'KL/min':>7} {'level':>5}"
        f" {'mean':>5} {'median':>6} {'ln(ARL0)/KL':>11}  budget for a {args.target:g}-min median"
    )
    for case in CASES:
        rate = args.per_window / case.window_min
        arl0 = args.budget_days * 1440 * case.series
        for noise in ("bernoulli", "beta"):
            for drop in (0.05, 0.1, 0.2):
                info, per = information(case, noise, drop, rate)
                h, mean, median = bound(info, arl0)
                crude = math.log(arl0 * rate) / per / rate
                need = budget_for(info, args.target, arl0) if drop == 0.1 else None
                shown = "-" if need is None else f"{need / case.series / 1440:.2g} days"
                print(
                    f"{case.name:52} {noise:9} {drop:4g} {info:7.4f} {h:5.2f}"
                    f" {mean:5.0f} {median:6.0f} {crude:11.0f}  {shown}"
                )
    print(
        "(minutes; last column, for a 0.1 drop: the mean days between false pages per"
        " rule at which even the optimal test's median is that fast; '-': it already is)"
    )


if __name__ == "__main__":
    main()
