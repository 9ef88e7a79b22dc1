"""The ``segments:`` section: the attribute keys whose values label the scores, and
their Prometheus labels.  Shared by the evaluation stage (which reads each case's
values, :mod:`ragtrace_collector.evaluation.segments`), the score metrics and the
drop detector (which group by them)::

    segments:
      - deployment.environment          # a bare key: at most 20 values (the default)
      - key: app.index_version
        max_values: 10

Two placeholder values, never dropped scores:

* ``unset``: the case has no such attribute (or an empty one);
* ``other``: the value is not one of the key's ``max_values`` most frequent ones.

**Labels.**  The Prometheus label of a key is its Prometheus-safe form: every character
outside ``[a-zA-Z0-9_]`` becomes ``_`` (``service.version`` -> ``service_version``), and
a leading digit gets a ``_`` in front.  A label that collides with one the collector
already uses (``service``, ``metric``, ``outcome``, ``le``...) or with another key's
label is a configuration error.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from ragtrace_collector.configbase import StrictModel

__all__ = [
    "OTHER",
    "RESERVED_LABELS",
    "UNSET",
    "SegmentKey",
    "SegmentsConfig",
    "prometheus_label",
]

#: The value of a case that has no such attribute.
UNSET = "unset"
#: The value standing for every value beyond a key's ``max_values``.
OTHER = "other"
#: Labels the score metrics and the alerts already use: a segment cannot take them.
RESERVED_LABELS = frozenset(
    {
        "service",
        "metric",
        "outcome",
        "le",
        "quantile",
        "rule",
        "alertname",
        "severity",
        "job",
        "instance",
        "notifier",
    }
)
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_label(key: str) -> str:
    """The Prometheus label of an attribute key: ``service.version`` -> ``service_version``."""
    label = _UNSAFE.sub("_", key)
    return "_" + label if label[:1].isdigit() else label


class SegmentKey(StrictModel):
    """One segment key: an attribute whose values label the scores."""

    key: str = Field(min_length=1, max_length=200, description="The attribute key.")
    max_values: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="Values kept for this key (the most frequent); the others count as `other`.",
    )

    @property
    def label(self) -> str:
        return prometheus_label(self.key)


def _key_input(value: Any) -> Any:
    return {"key": value} if isinstance(value, str) else value


def _check_keys(keys: list[SegmentKey]) -> list[SegmentKey]:
    seen: dict[str, str] = {}
    for entry in keys:
        label = entry.label
        if label in RESERVED_LABELS or label.startswith("__"):
            raise ValueError(
                f"segment {entry.key!r}: its Prometheus label {label!r} is one the collector "
                "already uses"
            )
        if label in seen:
            other = seen[label]
            raise ValueError(
                f"segments {other!r} and {entry.key!r} have the same Prometheus label {label!r}"
                if other != entry.key
                else f"segment {entry.key!r} is listed twice"
            )
        seen[label] = entry.key
    return keys


#: The ``segments:`` section: a list of keys (strings, or ``{key, max_values}``).
SegmentsConfig = Annotated[
    list[Annotated[SegmentKey, BeforeValidator(_key_input)]], AfterValidator(_check_keys)
]
