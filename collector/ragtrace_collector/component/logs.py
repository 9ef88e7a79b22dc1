"""Structured logs (structlog, JSON lines on stderr) that never leak a secret.

:class:`~ragtrace_collector.component.redaction.Redactor` (in
:mod:`ragtrace_collector.component.redaction`) is a structlog processor, last before
rendering: secret-named keys, ``Bearer``/``Basic`` credentials, registered secret values
and credentials inside URLs never reach a line.

Third-party stdlib loggers (aiohttp, grpc, asyncio, litellm) are routed through the
same processors, so their lines are JSON and redacted too; exception text and
tracebacks are redacted after they are formatted.  The loggers that write request
bodies at debug level (``openai``, ``httpx``, ``httpcore``, ``litellm``) are held at
WARNING unless ``logging.third_party_debug`` opts in (:func:`hold_third_party_loggers`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any, Final, TextIO

import structlog

from ragtrace_collector.component.redaction import REDACTED, Redactor, redact, url_secrets
from ragtrace_collector.component.redaction import active_redactor as _active_redactor

__all__ = [
    "REDACTED",
    "Redactor",
    "configure_logging",
    "get_logger",
    "hold_third_party_loggers",
    "redact",
    "url_secrets",
]

#: Loggers that write whole requests (judge prompts: user data) at debug level.
THIRD_PARTY_LOGGERS: Final = ("openai", "httpx", "httpcore", "litellm", "LiteLLM")
#: litellm's loggers, which it gives a handler of its own (bypassing ours).
_LITELLM_LOGGERS: Final = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")
_third_party_debug = False


def hold_third_party_loggers() -> None:
    """Hold the request-body loggers at WARNING (unless ``third_party_debug``) and make
    litellm's loggers write through ours (redacted) rather than their own handler.

    Called by :func:`configure_logging` and again after litellm is imported (its
    import installs its handler)."""
    for name in _LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    if _third_party_debug:
        return
    for name in (*THIRD_PARTY_LOGGERS, *_LITELLM_LOGGERS):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
    litellm = sys.modules.get("litellm")
    if litellm is not None:
        setattr(litellm, "set_verbose", False)  # noqa: B010 (module attribute)


def configure_logging(
    level: str = "info",
    fmt: str = "json",
    *,
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
    third_party_debug: bool = False,
) -> Redactor:
    """Configure structlog and the stdlib root logger; returns the active redactor.

    ``fmt`` is ``json``, ``console`` or ``auto`` (console on a terminal, else JSON).
    ``third_party_debug`` lets the request-body loggers (:data:`THIRD_PARTY_LOGGERS`)
    follow ``level``; by default they are held at WARNING.  Safe to call more than once
    (later calls replace the configuration and add secrets).
    """
    global _third_party_debug
    _third_party_debug = third_party_debug
    _active_redactor().add_secrets(secrets)
    out = stream if stream is not None else sys.stderr
    if fmt == "auto":  # people at a terminal read the console form; pipelines get JSON
        isatty = getattr(out, "isatty", None)
        fmt = "console" if callable(isatty) and isatty() else "json"
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            _active_redactor(),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                _active_redactor(),
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_ragtrace", False)]:
        root.removeHandler(old)
    handler._ragtrace = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)
    # warnings.warn() (a library's RuntimeWarning...) goes through the same redacting
    # JSON handler instead of raw text on stderr.
    logging.captureWarnings(True)
    # aiohttp's access log is per request: too chatty for a span pipeline.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    for name in (*THIRD_PARTY_LOGGERS, *_LITELLM_LOGGERS):
        if third_party_debug:
            logging.getLogger(name).setLevel(logging.NOTSET)
    hold_third_party_loggers()
    return _active_redactor()


def get_logger(name: str) -> Any:
    """A structlog logger bound to ``component=name``."""
    return structlog.get_logger("ragtrace_collector").bind(component=name)
