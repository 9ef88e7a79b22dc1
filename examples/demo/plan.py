"""How much traffic the demo sends, and the drop-alert rules that must fire on it.

The collector's drop detector (``ragtrace_collector.alerts``) fires a rule when the
mean score of its current ``window`` is at least ``drop`` below the trailing baseline
(the scores of the ``baseline`` seconds before the window), the window holds
``min_samples`` scores, a one-sided Welch test says a drop of at least ``drop`` is real,
and all of that has held for ``for`` seconds.  Scores are timestamped when the
collector evaluates them, so the demo paces its requests in real time:

* the healthy phase lasts longer than one window plus the time to collect
  ``min_samples`` golden requests, so the baseline is full when the fault starts;
* the rule must fire within about one window of the fault: after that, the degraded
  scores leave the window and enter the trailing baseline, which they drag down.  So
  the window holds enough samples (30 to 70 golden requests) for the test to see the
  smallest drop of the three faults (``shuffle``: ID recall 1.0 -> 0.63, scores 0 or
  1) well inside that time, with ``drop`` at the detector's default 0.1.  Under
  ``wrong_index`` and ``drop_top`` (1.0 -> about 0.07) it fires as soon as a few
  degraded scores are in the window, plus ``for``.

Measured with the quick plan: about 4 s after the fault for every fault mode.

**Rollout** (``--rollout``): the second phase does not break every request.  A new
index version (``app.index_version=v2``, broken by the fault) takes one request in
``ROLLOUT_EVERY``; the rest stays on ``v1``.  The collector labels the scores with the
index version (``segments:``); the drop rules are split by it (``group_by``), so ``v1``
is watched against its own past and stays quiet, and a canary rule per metric compares
``v2`` with ``v1`` in the same window (``v2`` has no past to drop from).  The canary
needs ``min_samples`` scores on each side: half the plan's, as ``v2`` sees a third of
the traffic.  Measured: the canary fired 4.2 s after the rollout began with the quick
plan (every fault mode within 4-6 s), 7.8 s with the normal one.
"""

from __future__ import annotations

from dataclasses import dataclass

from examples.support_bot import FaultMode

__all__ = [
    "ALERT_METRICS",
    "CANDIDATE_INDEX",
    "FAULT_DESCRIPTIONS",
    "INDEX_VERSION_KEY",
    "NORMAL",
    "PRIMARY_ALERT_METRIC",
    "QUICK",
    "ROLLOUT_EVERY",
    "STABLE_INDEX",
    "DemoPlan",
    "alert_kind",
    "alert_rules",
    "primary_rule",
]

#: The rule the demo must see firing; it degrades under every fault mode.
PRIMARY_ALERT_METRIC = "id_context_recall"
#: Every metric with an alert rule (contextual_recall drops reliably too: 1.0 -> ~0.1
#: with the offline judge under ``wrong_index``).
ALERT_METRICS: tuple[str, ...] = (PRIMARY_ALERT_METRIC, "contextual_recall")

#: The support bot's own attribute on its ``@rag`` span: which index served the request.
INDEX_VERSION_KEY = "app.index_version"
STABLE_INDEX, CANDIDATE_INDEX = "v1", "v2"
#: In a rollout, one golden request in this many goes to the candidate index.
ROLLOUT_EVERY = 3

FAULT_DESCRIPTIONS: dict[FaultMode, str] = {
    FaultMode.WRONG_INDEX: "the index and the document store are out of sync: "
    "every hit is another article",
    FaultMode.DROP_TOP: "the best hit of every search is lost",
    FaultMode.SHUFFLE: "the ranking is shuffled across a wider pool before the cut-off",
}


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """Traffic volume and alert-rule timing (all durations in seconds)."""

    #: Seconds between golden (ground-truth) requests.
    interval: float
    #: One scripted multi-turn conversation after every this many golden requests.
    conversation_every: int
    healthy_seconds: float
    #: The degraded phase lasts at least this long, then ends once the alerts fired...
    degraded_min_seconds: float
    #: ...or at this limit (the primary alert not firing by then is a failure).
    degraded_max_seconds: float
    window: float
    baseline: float
    for_: float
    min_samples: int
    #: Absolute drop in score points that counts.
    drop: float
    evaluation_interval: float

    @property
    def golden_per_second(self) -> float:
        return 1.0 / self.interval

    def rule(self, metric: str, *, group_by: tuple[str, ...] = ()) -> dict[str, object]:
        """The ``alerts.rules`` entry for ``metric`` (collector config syntax)."""
        rule: dict[str, object] = {
            "name": f"{metric}_drop",
            "metric": metric,
            "window": f"{self.window:g}s",
            "baseline": f"{self.baseline:g}s",
            "drop": self.drop,
            "min_samples": self.min_samples,
            "for": f"{self.for_:g}s",
            "confidence": 0.95,
            "labels": {"severity": "warning", "source": "ragtrace-demo"},
        }
        if group_by:
            rule["group_by"] = list(group_by)
        return rule

    def canary_rule(self, metric: str) -> dict[str, object]:
        """``metric`` of the candidate index against the stable one, same window."""
        return {
            "name": f"{metric}_canary",
            "kind": "canary",
            "metric": metric,
            "segment": INDEX_VERSION_KEY,
            "candidate": CANDIDATE_INDEX,
            "against": STABLE_INDEX,
            "window": f"{self.window:g}s",
            "drop": self.drop,
            "min_samples": max(3, self.min_samples // 2),
            "for": f"{self.for_:g}s",
            "confidence": 0.95,
            "labels": {"severity": "warning", "source": "ragtrace-demo"},
        }

    def rules(self, *, rollout: bool) -> list[dict[str, object]]:
        """Every alert rule of the run: one drop rule per alert metric; in a rollout,
        split by index version, plus a canary rule per metric."""
        if not rollout:
            return [self.rule(m) for m in ALERT_METRICS]
        split = [self.rule(m, group_by=(INDEX_VERSION_KEY,)) for m in ALERT_METRICS]
        return split + [self.canary_rule(m) for m in ALERT_METRICS]


def alert_kind(*, rollout: bool) -> str:
    """The kind of the rules the demo waits for: ``canary`` in a rollout (the split
    drop rules are there too, but v1 holds, so they stay quiet), else ``drop``."""
    return "canary" if rollout else "drop"


def primary_rule(*, rollout: bool) -> str:
    """The rule whose firing the demo waits for."""
    return f"{PRIMARY_ALERT_METRIC}_{alert_kind(rollout=rollout)}"


def alert_rules(*, rollout: bool) -> tuple[str, ...]:
    """The rules whose firing the demo reports (the primary one first)."""
    kind = alert_kind(rollout=rollout)
    return tuple(f"{m}_{kind}" for m in ALERT_METRICS)


#: ``bash scripts/demo.sh``: about 40 s of traffic.
NORMAL = DemoPlan(
    interval=0.15,
    conversation_every=8,
    healthy_seconds=20.0,
    degraded_min_seconds=12.0,
    degraded_max_seconds=60.0,
    window=10.0,
    baseline=60.0,
    for_=2.0,
    min_samples=20,
    drop=0.1,
    evaluation_interval=1.0,
)

#: ``--quick`` (tests): fewer requests, shorter windows, about 15 s of traffic.
QUICK = DemoPlan(
    interval=0.15,
    conversation_every=8,
    healthy_seconds=8.0,
    degraded_min_seconds=5.0,
    degraded_max_seconds=40.0,
    window=5.0,
    baseline=30.0,
    for_=1.0,
    min_samples=10,
    drop=0.1,
    evaluation_interval=0.5,
)
