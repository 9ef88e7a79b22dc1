"""Fixtures for the alerting end-to-end tests: clean SDK state that exports every
100 ms, and a recording OTLP backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.sdk_state import clean_sdk_state


@pytest.fixture(autouse=True)
def _clean_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The SDK's batch processor exports every 100 ms instead of every 5 s, so scores
    # reach the detector's seconds-long windows as a steady stream.
    with clean_sdk_state(
        monkeypatch, keep={"RAGTRACE_PHOENIX_PYTHON"}, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}
    ):
        yield


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s
