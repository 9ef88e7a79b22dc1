"""Secret redaction for logs and error text: no dependency beyond the standard library.

:class:`Redactor` removes secrets from values of any shape (nested dicts, lists,
tuples, bytes, exceptions):

* the value of any key that names a secret (``authorization``, ``token``,
  ``api_key``, ``password``, ``secret``, ``cookie`` ... in any case, with ``-``/``_``
  variations) becomes ``[REDACTED]``, unless it is a number (``prompt_tokens=12``);
* ``Bearer <token>`` / ``Basic <creds>`` anywhere in a string;
* every registered secret value (configured bearer tokens, header values, URL
  passwords) wherever it appears inside a string, e.g. in an exception message;
* credentials in any URL inside a string: the userinfo
  (``https://user:pass@host`` -> ``https://[REDACTED]@host``) and the value of every
  query parameter named like a credential (``key``, ``token``, ``secret``,
  ``password``, ``signature``, ``sig``, ``auth``, ``credential``...).

It lives apart from :mod:`ragtrace_collector.component.logs` so that config checks and error
rendering (``check-config``, ``--help``) can redact without importing structlog.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["REDACTED", "Redactor", "active_redactor", "redact", "url_secrets"]

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


def active_redactor() -> Redactor:
    """The process-wide redactor that :func:`redact` and the log pipeline share."""
    return _redactor
