"""Fixtures for the alerting end-to-end tests: clean SDK state that exports every
100 ms, and a recording OTLP backend."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ragtrace import _config, _safety, _session
from tests.fakes.otlp_sink import OtlpSink


@pytest.fixture(autouse=True)
def _clean_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith(("RAGTRACE_", "OTEL_")) and key != "RAGTRACE_PHOENIX_PYTHON":
            monkeypatch.delenv(key)
    # The SDK's batch processor exports every 100 ms instead of every 5 s, so scores
    # reach the detector's seconds-long windows as a steady stream.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    _config._reset_for_tests()
    _safety._forget_for_tests()
    _session._forget_for_tests()
    yield
    _config._reset_for_tests()
    _safety._forget_for_tests()
    _session._forget_for_tests()


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s
