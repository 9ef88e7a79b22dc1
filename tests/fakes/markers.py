"""Which test is running, so that starting a real service can check the test's markers.

``tests/conftest.py`` records the test about to run; :func:`require_services_marker` is
called where a real service starts (``redis-server``, Prometheus, Alertmanager, Phoenix)
and fails the test that is not marked ``services``: ``bash scripts/test.sh --fast``
(``-m "not services ..."``) runs without ``scripts/setup-services.sh``, so it must never
select such a test.
"""

from __future__ import annotations

import pytest

__all__ = ["current_test", "require_services_marker", "set_current_test"]

_current: pytest.Item | None = None


def set_current_test(item: pytest.Item | None) -> None:
    global _current
    _current = item


def current_test() -> pytest.Item | None:
    return _current


def require_services_marker(what: str) -> None:
    """Fail unless the running test (if any) is marked ``services``."""
    item = _current
    if item is not None and item.get_closest_marker("services") is None:
        pytest.fail(
            f"{item.nodeid} starts {what}, a real service from scripts/setup-services.sh: "
            "mark it @pytest.mark.services",
            pytrace=False,
        )
