"""A logger made on first use.

Modules on the configuration path (``check-config``, ``--help``) build objects that
may log, but must not import structlog (and rich) just to exist: they hold a
:class:`LazyLogger`, which imports :mod:`ragtrace_collector.component.logs` the first time a line
is written.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LazyLogger"]


class LazyLogger:
    """Forwards every call to ``logs.get_logger(name)``, made on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, method: str) -> Any:
        if self._logger is None:
            from ragtrace_collector.component.logs import get_logger

            self._logger = get_logger(self._name)
        return getattr(self._logger, method)
