"""Fixtures for the end-to-end tests: clean SDK state, a sink, a loopback judge."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e import _app
from tests.e2e._support import JUDGE_KEY_ENV, JudgeServer
from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.sdk_state import clean_sdk_state


@pytest.fixture(autouse=True)
def _clean_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with clean_sdk_state(
        monkeypatch, keep={"RAGTRACE_PHOENIX_PYTHON"}, env={JUDGE_KEY_ENV: "sk-e2e-dummy"}
    ):
        _app.ROUTES.clear()
        yield
        _app.ROUTES.clear()


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


@pytest.fixture
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer().start()
    try:
        yield server
    finally:
        server.stop()
