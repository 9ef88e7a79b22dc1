"""Failure containment: ragtrace never breaks the application it observes.

Every internal step that can fail (serialising a value, extracting a document, calling
the user's ``redact`` or ``output`` callable, talking to the tracer) is wrapped by its
caller; the exception goes to :func:`report`, which logs it once per cause through the
stdlib logger ``"ragtrace"`` and returns.  A *cause* is the pair (site, exception type),
so a value that fails on every request produces one log record, not one per request.

The SDK never configures logging; the application decides where these records go.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["logger", "report", "warn_once"]

logger = logging.getLogger("ragtrace")

#: Upper bound on remembered causes, so a pathological app cannot grow this set forever.
_MAX_CAUSES = 1024

_seen: set[tuple[str, str]] = set()
_lock = threading.Lock()


def _first_time(key: tuple[str, str]) -> bool:
    if key in _seen:
        return False
    with _lock:
        if key in _seen or len(_seen) >= _MAX_CAUSES:
            return False
        _seen.add(key)
    return True


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "<str() of the exception failed>"
    name = type(exc).__qualname__
    return f"{name}: {text}" if text else name


def report(site: str, exc: BaseException) -> None:
    """Log an internal failure at ``site`` once per (site, exception type); never raises."""
    try:
        if not _first_time((site, type(exc).__qualname__)):
            return
        logger.warning(
            "ragtrace: %s failed (%s); the application is not affected. "
            "Further failures of this kind are not logged.",
            site,
            _describe(exc),
            exc_info=(type(exc), exc, exc.__traceback__),
        )
    except Exception:
        pass


def warn_once(key: str, message: str) -> None:
    """Log a usage warning once per ``key``; never raises."""
    try:
        if _first_time(("warning", key)):
            logger.warning("ragtrace: %s", message)
    except Exception:
        pass


def _forget_for_tests() -> None:
    """Forget which causes were logged (tests only)."""
    with _lock:
        _seen.clear()
