"""Structured logs (structlog, JSON lines on stderr) that never leak a secret.

:class:`Redactor` is a structlog processor, last before rendering.  It walks the
event dict (nested dicts, lists and tuples too) and

* replaces the value of any key that names a secret (``authorization``, ``token``,
  ``api_key``, ``password``, ``secret``, ``cookie`` ... in any case, with ``-``/``_``
  variations) with ``[REDACTED]``, unless the value is a number (``prompt_tokens=12``);
* rewrites ``Bearer <token>`` / ``Basic <creds>`` anywhere in a string;
* removes every registered secret value (the configured bearer tokens, exporter header
  values) wherever it appears inside a string, e.g. in an exception message.

Third-party stdlib loggers (aiohttp, grpc, asyncio) are routed through the same
processors, so their lines are JSON and redacted too.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

import structlog

__all__ = ["REDACTED", "Redactor", "configure_logging", "get_logger"]

REDACTED = "[REDACTED]"

_SECRET_KEY_RE = re.compile(
    r"(^|[._-])(authorization|auth|token|tokens|bearer|bearer_tokens|api[_-]?key|apikey|"
    r"x[_-]api[_-]key|password|passwd|secret|client[_-]secret|cookie|set[_-]cookie|"
    r"private[_-]key|access[_-]key|credentials?)$",
    re.IGNORECASE,
)
_SCHEME_RE = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=\-]+", re.IGNORECASE)
#: Common API-key shapes (OpenAI/Anthropic style ``sk-...``), redacted wherever they appear.
_KEY_SHAPE_RE = re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}")
#: Secrets shorter than this are not substring-replaced (too likely to hit normal text).
_MIN_SECRET_LEN = 6


class Redactor:
    """structlog processor that removes secrets from an event dict."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self.add_secrets(secrets)

    def add_secrets(self, secrets: Iterable[str]) -> None:
        self._secrets |= {s for s in secrets if len(s) >= _MIN_SECRET_LEN}
        # Longest first, so a secret that contains another is removed whole.
        self._ordered = sorted(self._secrets, key=len, reverse=True)

    def __call__(
        self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key in list(event_dict):
            event_dict[key] = self._clean(key, event_dict[key])
        return event_dict

    def _clean(self, key: object, value: Any) -> Any:
        if (
            isinstance(key, str)
            and _SECRET_KEY_RE.search(key)
            and value not in (None, "", [])
            # Numbers are counts (prompt_tokens=120), never credentials.
            and not isinstance(value, bool | int | float)
        ):
            return REDACTED
        return self.scrub(value)

    def scrub(self, value: Any) -> Any:
        """Redact a value that is not under a secret-named key."""
        if isinstance(value, str):
            return self._scrub_str(value)
        if isinstance(value, dict):
            return {k: self._clean(k, v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.scrub(v) for v in value)
        if isinstance(value, bytes | bytearray):
            return self._scrub_str(bytes(value).decode("utf-8", "replace"))
        if isinstance(value, BaseException):
            return self._scrub_str(f"{type(value).__name__}: {value}")
        return value

    def _scrub_str(self, text: str) -> str:
        for secret in self._ordered:
            if secret in text:
                text = text.replace(secret, REDACTED)
        text = _SCHEME_RE.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
        return _KEY_SHAPE_RE.sub(REDACTED, text)


_redactor = Redactor()


def configure_logging(
    level: str = "info",
    fmt: str = "json",
    *,
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
) -> Redactor:
    """Configure structlog and the stdlib root logger; returns the active redactor.

    ``fmt`` is ``json``, ``console`` or ``auto`` (console on a terminal, else JSON).

    Safe to call more than once (later calls replace the configuration and add
    secrets).
    """
    _redactor.add_secrets(secrets)
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
            _redactor,
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
                _redactor,
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
    # aiohttp's access log is per request: too chatty for a span pipeline.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return _redactor


def get_logger(name: str) -> Any:
    """A structlog logger bound to ``component=name``."""
    return structlog.get_logger("ragtrace_collector").bind(component=name)
