"""Fixtures for the judge tests: a loopback OpenAI-compatible server and judges on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import ragtrace_collector  # noqa: F401  (sets LITELLM_LOCAL_MODEL_COST_MAP before litellm loads)
from ragtrace_collector.judges.base import JudgeCallRecord
from ragtrace_collector.judges.config import JudgeConfig
from ragtrace_collector.judges.llm import LLMJudge
from tests.fakes.openai_server import FakeOpenAIServer, openai_server

__all__ = ["openai_server"]

KEY_ENV = "RAGTRACE_TEST_JUDGE_KEY"
KEY_VALUE = "sk-ragtrace-test-key"

MakeJudge = Callable[..., LLMJudge]


@pytest.fixture(autouse=True)
def _judge_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "RAGTRACE_JUDGE_MODEL",
        "RAGTRACE_JUDGE_API_BASE",
        "RAGTRACE_JUDGE_API_KEY_ENV",
        "RAGTRACE_JUDGE_PROMPT_DIR",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_ENV, KEY_VALUE)


@pytest.fixture
def make_judge(openai_server: FakeOpenAIServer) -> MakeJudge:
    """Build an LLMJudge pointed at the loopback server; keyword overrides go to
    :class:`JudgeConfig` (fast backoff by default)."""

    def make(
        model: str = "openai/ragtrace-test-judge",
        *,
        on_call: Callable[[JudgeCallRecord], None] | None = None,
        **overrides: Any,
    ) -> LLMJudge:
        settings: dict[str, Any] = {
            "model": model,
            "api_base": openai_server.base_url,
            "api_key_env": KEY_ENV,
            "timeout_s": 20.0,
            "backoff_base_s": 0.01,
            "backoff_max_s": 2.0,
            **overrides,
        }
        return LLMJudge(JudgeConfig(**settings), on_call=on_call)

    return make
