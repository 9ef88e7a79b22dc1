"""Prometheus recording and alert rules for score drops, generated from parameters.

The rules shipped in ``docker/prometheus/rules/ragtrace.rules.yml`` are
``render_rules(SHIPPED_ALERTS)``; a test checks the file still matches, and the real
Prometheus test renders the same alerts with windows of seconds
(:func:`with_durations`), so the shipped rules and the tested rules cannot drift.

Regenerate (or render your own thresholds)::

    python -m ragtrace_collector.alerts.promrules -o docker/prometheus/rules/ragtrace.rules.yml
    python -m ragtrace_collector.alerts.promrules --window 30m --baseline 7d --drop 10%
    python -m ragtrace_collector.alerts.promrules --segments service.version,tenant.tier

The windowed mean of ``ragtrace_eval_score`` (a histogram labelled ``service``,
``metric`` and one label per configured segment) is ``rate(_sum[w]) / rate(_count[w])``,
summed over replicas by ``(service, metric, <segment labels>)``: the global view of each
segment, so a drop confined to one index version or one release is that segment's
alert.  The segment labels are the Prometheus-safe forms of the collector's
``segments:`` keys (``service.version`` -> ``service_version``); a label a collector does
not export is simply empty, so the rules also hold for a config without segments.
Render the rules for your own ``segments:`` with ``--segments``.

The baseline is the same mean over the trailing ``baseline`` window, offset by the
current window so that it excludes it.
Prometheus cannot run the detector's t-test (the histogram has no sum of squares);
the alerts require a minimum number of scored results in both windows and a ``for``
duration instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from ragtrace_collector.alerts.config import format_duration, parse_duration
from ragtrace_collector.segments import prometheus_label as segment_label

__all__ = [
    "SHIPPED_ALERTS",
    "SHIPPED_SEGMENTS",
    "PromDropAlert",
    "render_rules",
    "with_durations",
]

_HISTOGRAM = "ragtrace_eval_score"

#: The segment keys the shipped rules and dashboard group by (docs/alerting.md).
SHIPPED_SEGMENTS: tuple[str, ...] = (
    "deployment.environment",
    "service.version",
    "app.index_version",
)


def _by(segments: Sequence[str]) -> str:
    return ", ".join(["service", "metric", *(segment_label(k) for k in segments)])


@dataclass(frozen=True, slots=True)
class PromDropAlert:
    """One alert: the mean of the metrics matching ``metric_regex`` dropped."""

    alert: str
    metric_regex: str
    #: What the alert is about, in words ("recall").
    noun: str
    window: float = 900.0
    baseline: float = 86400.0
    #: Absolute drop in score points, or a fraction of the baseline when ``relative``.
    drop: float = 0.1
    relative: bool = False
    min_samples: int = 30
    for_: float = 600.0
    severity: str = "warning"


#: The shipped alerts: recall and precision metrics, 15m window against the 24h before.
SHIPPED_ALERTS: tuple[PromDropAlert, ...] = (
    PromDropAlert(alert="RagtraceRecallDrop", metric_regex=".*recall.*", noun="recall"),
    PromDropAlert(alert="RagtracePrecisionDrop", metric_regex=".*precision.*", noun="precision"),
)


def with_durations(
    alerts: Sequence[PromDropAlert], *, window: float, baseline: float, for_: float
) -> tuple[PromDropAlert, ...]:
    """The same alerts with other durations (used by tests to run in seconds)."""
    return tuple(replace(a, window=window, baseline=baseline, for_=for_) for a in alerts)


def _mean(by: str, window: str, offset: str | None) -> str:
    off = f" offset {offset}" if offset else ""
    return (
        f"sum by ({by}) (rate({_HISTOGRAM}_sum[{window}]{off}))\n"
        f"/\nsum by ({by}) (rate({_HISTOGRAM}_count[{window}]{off}))\n"
    )


def _count(by: str, window: str, offset: str | None) -> str:
    off = f" offset {offset}" if offset else ""
    return f"sum by ({by}) (increase({_HISTOGRAM}_count[{window}]{off}))\n"


def _names(a: PromDropAlert) -> tuple[str, str, str, str]:
    w, b = format_duration(a.window), format_duration(a.baseline)
    return (
        f"service_metric:{_HISTOGRAM}:mean_{w}",
        f"service_metric:{_HISTOGRAM}_count:increase_{w}",
        f"service_metric:{_HISTOGRAM}:mean_{b}_offset_{w}",
        f"service_metric:{_HISTOGRAM}_count:increase_{b}_offset_{w}",
    )


def _recording_rules(alerts: Sequence[PromDropAlert], by: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    seen: set[str] = set()
    for a in alerts:
        w, b = format_duration(a.window), format_duration(a.baseline)
        mean, count, base_mean, base_count = _names(a)
        for record, expr in (
            (mean, _mean(by, w, None)),
            (count, _count(by, w, None)),
            (base_mean, _mean(by, b, w)),
            (base_count, _count(by, b, w)),
        ):
            if record not in seen:
                seen.add(record)
                rules.append({"record": record, "expr": expr})
    return rules


def _number(x: float) -> str:
    return f"{x:g}"


def _where(segments: Sequence[str]) -> str:
    """Go template text naming the alert's segment: ", service_version=v2" per label."""
    return "".join(
        f"{{{{ with $labels.{label} }}}}, {label}={{{{ . }}}}{{{{ end }}}}"
        for label in map(segment_label, segments)
    )


def _alert_rule(a: PromDropAlert, segments: Sequence[str]) -> dict[str, Any]:
    by, where = _by(segments), _where(segments)
    mean, count, base_mean, base_count = _names(a)
    sel = f'{{metric=~"{a.metric_regex}"}}'
    delta = f"{base_mean}{sel}\n  - on ({by})\n  {mean}{sel}"
    if a.relative:
        lhs = f"(\n  (\n  {delta}\n  )\n  / on ({by})\n  {base_mean}{sel}\n)"
        value = "{{ $value | humanizePercentage }}"
        threshold = f"{a.drop:.0%}".replace("%", "% of it")
    else:
        lhs = f"(\n  {delta}\n)"
        value = '{{ $value | printf "%.2f" }}'
        threshold = _number(a.drop)
    expr = (
        f"{lhs} >= {_number(a.drop)}\n"
        f"and on ({by}) ({count} >= {a.min_samples})\n"
        f"and on ({by}) ({base_count} >= {a.min_samples})\n"
    )
    w, b = format_duration(a.window), format_duration(a.baseline)
    rule: dict[str, Any] = {"alert": a.alert, "expr": expr}
    if a.for_ > 0:
        rule["for"] = format_duration(a.for_)
    rule["labels"] = {"severity": a.severity, "source": "ragtrace"}
    rule["annotations"] = {
        "summary": f"{a.noun.capitalize()} dropped: {{{{ $labels.metric }}}} for service"
        f" {{{{ $labels.service }}}}{where}",
        "description": (
            f"The mean {{{{ $labels.metric }}}} of service {{{{ $labels.service }}}}{where}"
            " over the last"
            f" {w} is {value} below its mean over the {b} before (alert at a drop of"
            f" {threshold} or more, with at least {a.min_samples} scored results in each window)."
        ),
    }
    return rule


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def render_rules(
    alerts: Sequence[PromDropAlert] = SHIPPED_ALERTS,
    *,
    segments: Sequence[str] = SHIPPED_SEGMENTS,
    group: str = "ragtrace-eval-score",
    interval: float | None = None,
) -> str:
    """A Prometheus rules file: recording rules first, then the alerts, in one group
    (rules of a group are evaluated in order, so the alerts see fresh recordings).
    ``segments`` are the collector's ``segments:`` keys: every rule keeps their labels."""
    by = _by(segments)
    grp: dict[str, Any] = {"name": group}
    if interval is not None:
        grp["interval"] = format_duration(interval)
    grp["rules"] = _recording_rules(alerts, by) + [_alert_rule(a, segments) for a in alerts]
    header = (
        "# Generated by `python -m ragtrace_collector.alerts.promrules`; do not edit by hand.\n"
        "# Score-drop recording and alert rules over the collector's ragtrace_eval_score\n"
        "# histogram (tests/alerts check that this file matches the generator).\n"
    )
    body = yaml.dump(
        {"groups": [grp]}, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True
    )
    return header + body


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ragtrace_collector.alerts.promrules",
        description="Render ragtrace's Prometheus score-drop rules.",
    )
    parser.add_argument("--window", default=None, help="current window (default 15m)")
    parser.add_argument("--baseline", default=None, help="trailing baseline (default 24h)")
    parser.add_argument("--for", dest="for_", default=None, help="hold time (default 10m)")
    parser.add_argument("--drop", default=None, help="0.1 (absolute) or 10%% (relative)")
    parser.add_argument("--min-samples", type=int, default=None)
    parser.add_argument(
        "--segments",
        default=None,
        help="the collector's segments: keys, comma-separated"
        f" (default {','.join(SHIPPED_SEGMENTS)}; empty for none)",
    )
    parser.add_argument("-o", "--output", type=Path, default=None, help="file (default stdout)")
    args = parser.parse_args(argv)
    alerts = list(SHIPPED_ALERTS)
    changes: dict[str, Any] = {}
    if args.window is not None:
        changes["window"] = parse_duration(args.window)
    if args.baseline is not None:
        changes["baseline"] = parse_duration(args.baseline)
    if args.for_ is not None:
        changes["for_"] = parse_duration(args.for_)
    if args.min_samples is not None:
        changes["min_samples"] = args.min_samples
    if args.drop is not None:
        text = str(args.drop).strip()
        if text.endswith("%"):
            changes["drop"], changes["relative"] = float(text[:-1]) / 100, True
        else:
            changes["drop"], changes["relative"] = float(text), False
    alerts = [replace(a, **changes) for a in alerts]
    segments = SHIPPED_SEGMENTS
    if args.segments is not None:
        segments = tuple(k.strip() for k in args.segments.split(",") if k.strip())
    text = render_rules(alerts, segments=segments)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
