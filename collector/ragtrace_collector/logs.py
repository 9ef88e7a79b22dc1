"""Structured logs (structlog, JSON lines on stderr) that never leak a secret.

:class:`Redactor` is a structlog processor, last before rendering.  It walks the
event dict (nested dicts, lists and tuples too) and

* replaces the value of any key that names a secret (``authorization``, ``token``,
  ``api_key``, ``password``, ``secret``, ``cookie`` ... in any case, with ``-``/``_``
  variations) with ``[REDACTED]``, unless the value is a number (``prompt_tokens=12``);
* rewrites ``Bearer <token>`` / ``Basic <creds>`` anywhere in a string;
* removes every registered secret value (the configured bearer tokens, header values,
  URL passwords) wherever it appears inside a string, e.g. in an exception message;
* redacts credentials in any URL inside a string: the userinfo
  (``https://user:pass@host`` -> ``https://[REDACTED]@host``) and the value of every
  query parameter named like a credential (``key``, ``token``, ``secret``,
  ``password``, ``signature``, ``sig``, ``auth``, ``credential``...).

Third-party stdlib loggers (aiohttp, grpc, asyncio, litellm) are routed through the
same processors, so their lines are JSON and redacted too; exception text and
tracebacks are redacted after they are formatted.  The loggers that write request
bodies at debug level (``openai``, ``httpx``, ``httpcore``, ``litellm``) are held at
WARNING unless ``logging.third_party_debug`` opts in (:func:`hold_third_party_loggers`).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, Final, TextIO
from urllib.parse import parse_qsl, unquote, urlsplit

import structlog

__all__ = [
    "REDACTED",
    "Redactor",
    "configure_logging",
    "get_logger",
    "hold_third_party_loggers",
    "redact",
    "url_secrets",
]

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
#: ``scheme://userinfo@``: the userinfo of any URL (``redis://:pw@``, ``https://u:p@``).
_USERINFO_RE = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/\s@?#'\"<>]+@")
#: A query parameter whose name looks like a credential, and its value.
_CREDENTIAL_PARAM = (
    r"[\w.\-]*(?:key|token|secret|passw(?:or)?d|pwd|signature|sig|auth|credential)[\w.\-]*"
)
_QUERY_SECRET_RE = re.compile(
    rf"([?&;]{_CREDENTIAL_PARAM}=)[^&;#\s'\"<>]+",
    re.IGNORECASE,
)
_QUERY_SECRET_NAME_RE = re.compile(rf"^{_CREDENTIAL_PARAM}$", re.IGNORECASE)

#: Loggers that write whole requests (judge prompts: user data) at debug level.
THIRD_PARTY_LOGGERS: Final = ("openai", "httpx", "httpcore", "litellm", "LiteLLM")
#: litellm's loggers, which it gives a handler of its own (bypassing ours).
_LITELLM_LOGGERS: Final = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")
_third_party_debug = False


def url_secrets(url: str | None) -> list[str]:
    """The credentials inside ``url`` (password/userinfo, credential-named query
    values), raw and percent-decoded, to register with the redactor."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        # With a password, the user name is not the secret; alone, it often is (a token).
        found = [parts.password if parts.password is not None else parts.username or ""]
        found += [v for k, v in parse_qsl(parts.query) if _QUERY_SECRET_NAME_RE.match(k)]
    except ValueError:
        return []
    out: list[str] = []
    for value in found:
        if value:
            out += [value, unquote(value)]
    return out


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
        if "://" in text:
            text = _USERINFO_RE.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
        if "=" in text:
            text = _QUERY_SECRET_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
        return _KEY_SHAPE_RE.sub(REDACTED, text)


_redactor = Redactor()


def redact(value: Any) -> Any:
    """``value`` with every secret the active redactor knows removed (for text that
    leaves the process outside a log line: stderr messages, HTTP error bodies)."""
    return _redactor.scrub(value)


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
    # warnings.warn() (a library's RuntimeWarning...) goes through the same redacting
    # JSON handler instead of raw text on stderr.
    logging.captureWarnings(True)
    # aiohttp's access log is per request: too chatty for a span pipeline.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    for name in (*THIRD_PARTY_LOGGERS, *_LITELLM_LOGGERS):
        if third_party_debug:
            logging.getLogger(name).setLevel(logging.NOTSET)
    hold_third_party_loggers()
    return _redactor


def get_logger(name: str) -> Any:
    """A structlog logger bound to ``component=name``."""
    return structlog.get_logger("ragtrace_collector").bind(component=name)
