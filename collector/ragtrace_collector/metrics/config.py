"""The ``metrics`` section's keys: metric names checked against docs/metrics.md, and
``include_defaults``."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator

from ragtrace_collector.metrics import METRIC_NAMES, OFFLINE_METRICS

__all__ = ["MetricName", "expand_include_defaults"]


def _check_metric_name(name: str) -> str:
    if name not in METRIC_NAMES:
        close = difflib.get_close_matches(name, METRIC_NAMES, n=2, cutoff=0.6)
        hint = " or ".join(repr(c) for c in close)
        raise ValueError(
            f"unknown metric {name!r} (did you mean {hint}?)"
            if close
            else f"unknown metric {name!r} (known metrics: {', '.join(METRIC_NAMES)})"
        )
    return name


#: A metric name of docs/metrics.md; each unknown name is its own error.
MetricName = Annotated[str, AfterValidator(_check_metric_name)]


def expand_include_defaults(value: Any) -> Any:
    """``metrics: {include_defaults: true, faithfulness: {}}``: the default set plus
    faithfulness (a metric listed again keeps its own options)."""
    if not isinstance(value, Mapping) or "include_defaults" not in value:
        return value
    data = dict(value)
    flag = data.pop("include_defaults")
    if not isinstance(flag, bool):
        raise ValueError(f"include_defaults: expected true or false, got {flag!r}")
    if not flag:
        return data
    return {**{name: data.pop(name, {}) for name in OFFLINE_METRICS}, **data}
