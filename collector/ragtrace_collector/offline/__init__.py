"""Offline evaluation: the online metric suite run over a dataset, for CI and notebooks.

Public surface::

    from ragtrace_collector.offline import evaluate, evaluate_file, evaluate_rows

* :mod:`.runner`: :func:`evaluate` (async, over cases), :func:`evaluate_file` and
  :func:`evaluate_rows` (sync), and the report they return;
* :mod:`.loaders`: datasets in JSONL, JSON, YAML, CSV, Parquet or Hugging Face form;
* :mod:`.cli`: ``ragtrace-collector eval``; :mod:`.gate`: its ``--fail-under`` gate;
* :mod:`.pytest_plugin`: the ``ragtrace_eval`` fixture.

The names load their modules on first use, so that the pytest plugin's entry point
costs nothing until a test asks for the fixture's machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragtrace_collector.offline.runner import (
        EvalReport,
        ItemResult,
        MetricSummary,
        evaluate,
        evaluate_file,
        evaluate_rows,
    )

__all__ = [
    "EvalReport",
    "ItemResult",
    "MetricSummary",
    "evaluate",
    "evaluate_file",
    "evaluate_rows",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ragtrace_collector.offline import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
