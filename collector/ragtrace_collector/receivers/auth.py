"""Bearer-token check shared by both receivers (constant-time comparison)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from pydantic import SecretStr

__all__ = ["BearerAuth"]


class BearerAuth:
    """Accepts ``Authorization: Bearer <token>`` for any configured token."""

    def __init__(self, tokens: Sequence[SecretStr]) -> None:
        self._tokens = [t.get_secret_value().encode("utf-8") for t in tokens]

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def check(self, header: str | None) -> bool:
        """True if auth is off, or ``header`` carries a configured bearer token."""
        if not self._tokens:
            return True
        if not header:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return False
        offered = credentials.strip().encode("utf-8")
        # Compare against every token so timing does not reveal which one matched.
        ok = False
        for token in self._tokens:
            ok |= hmac.compare_digest(offered, token)
        return ok
