"""Fixtures for the end-to-end tests: clean SDK state, a sink, a loopback judge."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ragtrace import _config, _safety, _session
from tests.e2e import _app
from tests.e2e._support import JUDGE_KEY_ENV, JudgeServer
from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.redis_server import redis_server as redis_server


@pytest.fixture(autouse=True)
def _clean_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith(("RAGTRACE_", "OTEL_")) and key != "RAGTRACE_PHOENIX_PYTHON":
            monkeypatch.delenv(key)
    monkeypatch.setenv(JUDGE_KEY_ENV, "sk-e2e-dummy")
    _config._reset_for_tests()
    _safety._forget_for_tests()
    _session._forget_for_tests()
    _app.ROUTES.clear()
    yield
    _config._reset_for_tests()
    _safety._forget_for_tests()
    _session._forget_for_tests()
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
