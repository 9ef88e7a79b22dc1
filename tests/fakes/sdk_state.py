"""A clean ragtrace SDK for every test: no ``RAGTRACE_*`` / ``OTEL_*`` variables from
the environment and the SDK's module state (configuration, safety, sessions) reset
before and after.

A conftest imports :func:`clean_sdk` to get it as an autouse fixture, or calls
:func:`clean_sdk_state` from its own fixture when it must keep or set variables.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager

import pytest

from ragtrace import _config, _safety, _session

__all__ = ["clean_sdk", "clean_sdk_state"]


def _reset_sdk() -> None:
    _config._reset_for_tests()
    _safety._forget_for_tests()
    _session._forget_for_tests()


@contextmanager
def clean_sdk_state(
    monkeypatch: pytest.MonkeyPatch,
    *,
    keep: Collection[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[None]:
    """Remove the ``RAGTRACE_*`` / ``OTEL_*`` variables except ``keep``, set ``env``,
    reset the SDK; reset it again on the way out."""
    for key in list(os.environ):
        if key.startswith(("RAGTRACE_", "OTEL_")) and key not in keep:
            monkeypatch.delenv(key)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    _reset_sdk()
    try:
        yield
    finally:
        _reset_sdk()


@pytest.fixture(autouse=True)
def clean_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with clean_sdk_state(monkeypatch):
        yield
