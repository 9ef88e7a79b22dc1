"""The quality gate of offline evaluation: fail a CI run on low scores.

* ``fail_under``: every metric's mean must reach this value;
* ``per_metric``: ``{metric: value}``, the mean of that metric must reach it (over
  ``fail_under`` for that metric);
* ``fail_on_case_failure``: every scored result must pass its metric's own threshold.

Means are over scored results only (skips and errors do not count, see
:func:`ragtrace_collector.offline.runner.summarise`).  So a gated metric (named in
``per_metric``, any metric under ``fail_under``, every metric under
``fail_on_case_failure``) that scored no row at all fails the gate, with its most
common skip reason: a gate never passes on no data.  ``allow_unscored`` lets such a
metric pass (it then gates nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragtrace_collector.offline.runner import EvalReport

__all__ = ["QualityGate", "parse_fail_under"]


def _score(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{where}: {value:g} is outside 0..1")
    return value


def parse_fail_under(values: Iterable[str]) -> tuple[float | None, dict[str, float]]:
    """``["0.7", "id_context_recall=0.9"]`` -> ``(0.7, {"id_context_recall": 0.9})``.

    Raises ``ValueError`` for a value that is not a number in 0..1 or a second bare
    value.  Metric names are not checked here (the caller knows the valid ones).
    """
    overall: float | None = None
    per_metric: dict[str, float] = {}
    for raw in values:
        if "=" in raw:
            name, _, text = raw.partition("=")
            name = name.strip()
            if not name:
                raise ValueError(f"--fail-under {raw!r}: expected METRIC=VALUE")
            per_metric[name] = _score(text.strip(), f"--fail-under {name}")
        else:
            if overall is not None:
                raise ValueError("--fail-under VALUE given twice (use METRIC=VALUE per metric)")
            overall = _score(raw.strip(), "--fail-under")
    return overall, per_metric


@dataclass(frozen=True)
class QualityGate:
    fail_under: float | None = None
    per_metric: Mapping[str, float] = field(default_factory=dict)
    fail_on_case_failure: bool = False
    #: A gated metric that scored no row passes (instead of failing the gate).
    allow_unscored: bool = False

    @property
    def active(self) -> bool:
        return self.fail_under is not None or bool(self.per_metric) or self.fail_on_case_failure

    def check(self, report: EvalReport) -> list[str]:
        """Why the report fails the gate, one line per reason; empty when it passes."""
        failures: list[str] = []
        unscored: set[str] = set()
        gated = {name: self.fail_under for name in report.metrics} | dict(self.per_metric)
        for name, floor in gated.items():
            if floor is None:
                continue
            summary = report.summary.get(name)
            mean = summary.mean if summary is not None else None
            if mean is None:
                unscored.add(name)
                if not self.allow_unscored:
                    failures.append(_unscored(name, f"to compare with {floor:g}", report))
            elif mean < floor:
                failures.append(f"{name}: mean {mean:.4f} is under {floor:g}")
        if self.fail_on_case_failure:
            for name in report.metrics:
                if not report.summary[name].scored and name not in unscored:
                    if not self.allow_unscored:
                        failures.append(_unscored(name, "to check against its threshold", report))
                    continue
                failed = report.summary[name].failed
                if failed:
                    where = [
                        item.case_id or f"#{item.index}"
                        for item in report.items
                        if (r := item.result(name)) is not None and r.outcome == "failed"
                    ]
                    shown = ", ".join(where[:5]) + (" ..." if len(where) > 5 else "")
                    failures.append(
                        f"{name}: {failed} case(s) under the metric's threshold ({shown})"
                    )
        return failures


def _unscored(name: str, against: str, report: EvalReport) -> str:
    """The failure line of a gated metric without a single scored row (``against``:
    what the scores were for, e.g. "to compare with 0.7")."""
    summary = report.summary.get(name)
    if summary is None or not summary.count:
        return f"{name}: no scored rows {against} (the metric did not run)"
    reasons: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for item in report.items:
        r = item.result(name)
        if r is None:
            continue
        if r.error is None:
            reasons[r.reason or "no reason given"] += 1
        elif r.error:
            errors[r.error] += 1
    parts = [f"{summary.skipped} skipped", f"{summary.errors} error(s)"]
    line = f"{name}: no scored rows {against} ({', '.join(parts)})"
    if reasons:
        reason, count = reasons.most_common(1)[0]
        line += f"; most common skip reason ({count}x): {reason}"
    elif errors:
        error, count = errors.most_common(1)[0]
        line += f"; most common error ({count}x): {error}"
    return line
