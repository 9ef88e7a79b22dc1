"""Fixtures for the metric tests (the scripted judge itself is in
:mod:`tests.fakes.judge`)."""

from __future__ import annotations

import pytest

from tests.fakes.judge import ScriptedJudge


@pytest.fixture
def scripted() -> type[ScriptedJudge]:
    return ScriptedJudge
