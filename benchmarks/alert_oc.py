"""The drop detector's operating characteristic: false pages per day on unchanged
traffic, and time to page on a real drop.

The real :class:`~ragtrace_collector.alerts.DropDetector` is driven with a simulated
clock: results arrive evenly (``--per-window`` results per rule window on each side,
60 by default, the figure of issue 28), and the detector evaluates every 30 s, as it
does in the service.  Nothing else is simulated: the rules are parsed from the same
config the collector reads.

* **A/A** streams: every side draws from the same distribution (mean 0.8), Bernoulli
  (0/1 scores, the worst case for a t-test) or Beta (k = 4, sd about 0.18).  A page
  is a ``firing`` transition; reported per simulated day of traffic (after a warm-up
  that fills the window, and the baseline of a drop rule).
* **A/B** streams: after the warm-up the candidate (a canary rule's tested value, or
  the whole series of a drop rule) drops by 0.05, 0.1 or 0.2 in mean recall; the time
  from the start of the drop to the first page, over ``--trials`` seeded runs (median
  and 95th percentile; ``never`` when more than half / 5% of the runs had not paged
  within ``--cap`` hours).

Each configuration runs with today's test (``test: window``: the rule's one-sided
Welch test at every evaluation) and with the sequential test (``test: sequential``,
the default), in the same run.

Run: ``.venv/bin/python benchmarks/alert_oc.py [--quick] [--days 7] [--trials 10]
[--only TEXT] [--method TEXT]`` (a few minutes; ``--quick`` about one; the table in
docs/alerting.md took 22 minutes with ``--days 40 --trials 20``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ragtrace_collector.alerts import AlertsConfig, DropDetector
from ragtrace_collector.segments import SegmentKey

T0 = 1_699_999_200.0
STEP = 30.0  # the default evaluation_interval
SEGMENT = "deployment.environment"
METRIC = "contextual_recall"
MEAN = 0.8

#: The methods compared: extra rule keys.
METHODS: dict[str, dict[str, Any]] = {
    "today (window)": {"test": "window"},
    "new (sequential)": {"test": "sequential"},
}


class _Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class Scenario:
    """One rule and its traffic.  ``sides``: the segment values that get traffic (one
    entry for a drop rule, which sees the whole series); ``candidate`` the one that
    drops in an A/B run."""

    name: str
    rule: dict[str, Any]
    sides: tuple[str, ...]
    candidate: str
    warmup: float  # seconds before A/A counting starts, or before the drop
    drops: tuple[float, ...] = (0.05, 0.1, 0.2)
    noises: tuple[str, ...] = ("bernoulli", "beta")
    extra: dict[str, Any] = field(default_factory=dict)


def _canary(name: str, **rule: Any) -> dict[str, Any]:
    return {"name": name, "kind": "canary", "metric": METRIC, "segment": SEGMENT, **rule}


SCENARIOS = [
    Scenario(
        "canary, defaults (15m, drop 0.1), 1 value vs rest",
        _canary("c_default"),
        ("stable", "v2"),
        "v2",
        warmup=900,
    ),
    Scenario(
        "canary, defaults, 5 values vs rest",
        _canary("c_five"),
        ("v1", "v2", "v3", "v4", "v5"),
        "v5",
        warmup=900,
        drops=(0.1,),
    ),
    Scenario(
        "canary, docs example (10m, drop 0.05, canary vs production)",
        _canary("c_docs", candidate="canary", against="production", window="10m", drop=0.05),
        ("production", "canary"),
        "canary",
        warmup=600,
    ),
    Scenario(
        "canary, docs example, 5 values vs rest (candidate unset)",
        _canary("c_docs5", window="10m", drop=0.05),
        ("v1", "v2", "v3", "v4", "v5"),
        "v5",
        warmup=600,
        drops=(0.05,),
    ),
    Scenario(
        "canary, defaults, test_margin: false",
        _canary("c_nomargin", test_margin=False),
        ("stable", "v2"),
        "v2",
        warmup=900,
        drops=(0.1,),
    ),
    Scenario(
        "canary, defaults, false_alarm_interval: 3d",
        _canary("c_3d", false_alarm_interval="3d"),
        ("stable", "v2"),
        "v2",
        warmup=900,
        drops=(0.1, 0.2),
        noises=("bernoulli",),
    ),
    Scenario(
        "drop rule, defaults (15m vs 24h, drop 0.1, for 5m)",
        {"name": "d_default", "metric": METRIC},
        ("all",),
        "all",
        warmup=86400 + 900,
    ),
    Scenario(
        "drop rule, docs example (severity page, hysteresis 0.05)",
        {
            "name": "d_docs",
            "metric": METRIC,
            "window": "15m",
            "baseline": "24h",
            "drop": 0.1,
            "min_samples": 30,
            "for": "5m",
            "hysteresis": 0.05,
            "labels": {"severity": "page"},
        },
        ("all",),
        "all",
        warmup=86400 + 900,
        drops=(0.1,),
        noises=("bernoulli",),
    ),
]


def _draw(noise: str) -> Callable[[random.Random, float], float]:
    if noise == "bernoulli":
        return lambda rng, mean: 1.0 if rng.random() < mean else 0.0
    k = 4.0
    return lambda rng, mean: rng.betavariate(mean * k, (1 - mean) * k)


def _detector(scenario: Scenario, method: dict[str, Any], clock: _Clock) -> DropDetector:
    rule = {**scenario.rule, **method}
    config = AlertsConfig.model_validate({"rules": [rule], "log": {"enabled": False}})
    keys = [SegmentKey(key=SEGMENT, max_values=10)]
    return DropDetector(config, [], None, clock, keys)


async def _drive(
    scenario: Scenario,
    method: dict[str, Any],
    noise: str,
    seed: int,
    per_window: int,
    *,
    aa_seconds: float,
    drop: float,
    cap: float,
) -> tuple[int, float | None, float | None]:
    """A/A (``drop`` 0): the pages in ``aa_seconds`` after the warm-up.  A/B: the
    seconds from the start of the drop to the first page (None: not within ``cap``),
    and, the drop being fixed at that page, from the fix to the alert's resolution."""
    clock = _Clock()
    det = _detector(scenario, method, clock)
    window = float(det.config.rules[0].window)
    rate = per_window / window  # results a second, per side
    draw = _draw(noise)
    rng = random.Random(seed)
    # Fractional arrivals carried over, so every side gets exactly `rate` on average.
    carry = {side: rng.random() for side in scenario.sides}
    observe = det.observe
    warm_end = T0 + scenario.warmup
    end = warm_end + (aa_seconds if drop == 0 else cap)
    pages = 0
    paged: float | None = None
    t = T0
    while t < end:
        dropping = drop > 0 and t >= warm_end and paged is None
        for side in scenario.sides:
            carry[side] += rate * STEP
            k = int(carry[side])
            carry[side] -= k
            mean = MEAN - drop if dropping and side == scenario.candidate else MEAN
            for i in range(k):
                at = t + (i + 0.5) * STEP / k
                observe("shop", METRIC, draw(rng, mean), None, at, segments=(side,))
        t += STEP
        clock.t = t
        if t < warm_end - window:
            continue  # filling the baseline: nothing to evaluate yet (and it is cheaper)
        events = await det.evaluate(t)
        if t <= warm_end:
            continue
        fired = [e for e in events if e.status == "firing"]
        mine = [e for e in events if scenario.candidate in e.segments.values() or not e.segments]
        if drop == 0:
            pages += len(fired)
        elif paged is None and any(e.status == "firing" for e in mine):
            paged = t
            end = t + cap
        elif paged is not None and any(e.status == "resolved" for e in mine):
            return 1, paged - warm_end, t - paged
    return pages, None if paged is None else paged - warm_end, None


def _quantile(values: list[float | None], q: float) -> float | None:
    """The q-quantile, None ("never") when it falls among the runs that never paged."""
    ordered = sorted(math.inf if v is None else v for v in values)
    x = ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
    return None if math.isinf(x) else x


def _minutes(x: float | None) -> str:
    return "never" if x is None else f"{x / 60:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer days and trials")
    parser.add_argument("--days", type=float, default=None, help="A/A days per config")
    parser.add_argument("--trials", type=int, default=None, help="A/B runs per drop")
    parser.add_argument("--cap", type=float, default=6.0, help="A/B: hours before 'never'")
    parser.add_argument("--per-window", type=int, default=60, help="results per window/side")
    parser.add_argument("--only", default=None, help="scenarios whose name has this text")
    parser.add_argument("--method", default=None, help="methods whose name has this text")
    args = parser.parse_args()
    days = args.days if args.days is not None else (2.0 if args.quick else 7.0)
    trials = args.trials if args.trials is not None else (5 if args.quick else 10)
    scenarios = [s for s in SCENARIOS if args.only is None or args.only in s.name]
    methods = {k: v for k, v in METHODS.items() if args.method is None or args.method in k}
    started = time.monotonic()
    print(
        f"A/A: {days:g} days per configuration; A/B: {trials} runs per drop (cap"
        f" {args.cap:g} h); {args.per_window} results per window per side; evaluated"
        f" every {STEP:g}s"
    )
    head = f"{'configuration':62} {'scores':9} {'method':17} {'pages/day':>9}"
    print(
        head + "  time to page, min: median / p95 per drop  | minutes from the fix to"
        " resolved (median, largest drop)"
    )
    for scenario in scenarios:
        for noise in scenario.noises:
            for method_name, method in methods.items():
                pages, _, _ = asyncio.run(
                    _drive(
                        scenario,
                        method,
                        noise,
                        1,
                        args.per_window,
                        aa_seconds=days * 86400,
                        drop=0.0,
                        cap=0.0,
                    )
                )
                cells = []
                fixed: list[float | None] = []
                for drop in scenario.drops:
                    runs = [
                        asyncio.run(
                            _drive(
                                scenario,
                                method,
                                noise,
                                1000 + seed,
                                args.per_window,
                                aa_seconds=0.0,
                                drop=drop,
                                cap=args.cap * 3600,
                            )
                        )
                        for seed in range(trials)
                    ]
                    times = [r[1] for r in runs]
                    fixed = [r[2] for r in runs if r[1] is not None]
                    med, p95 = _quantile(times, 0.5), _quantile(times, 0.95)
                    cells.append(f"{drop:g}: {_minutes(med)} / {_minutes(p95)}")
                rate = pages / days
                shown = f"{rate:.2f}" if pages else f"0 (<{3 / days:.2f})"
                resolve = _minutes(_quantile(fixed, 0.5)) if fixed else "-"
                print(
                    f"{scenario.name:62} {noise:9} {method_name:17} {shown:>9}  "
                    + "; ".join(cells)
                    + f"  | fix->resolved {resolve}",
                    flush=True,
                )
    print(f"({time.monotonic() - started:.0f} s; '0 (<x)': no page, x = 95% upper bound)")


if __name__ == "__main__":
    main()
