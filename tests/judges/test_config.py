"""JudgeConfig, the factory, and keeping litellm out of imports that do not need it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from ragtrace_collector.judges.config import JudgeConfig
from ragtrace_collector.judges.factory import make_judge
from ragtrace_collector.judges.llm import LLMJudge
from tests.fakes.openai_server import FakeOpenAIServer
from tests.judges.conftest import KEY_ENV, KEY_VALUE

REPO = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    cfg = JudgeConfig()
    assert cfg.model == "offline"
    assert cfg.is_offline
    assert cfg.temperature == 0
    assert cfg.concurrency == 8
    assert cfg.api_key() is None


def test_env_fallbacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAGTRACE_JUDGE_MODEL", "openai/gpt-4o-mini")
    monkeypatch.setenv("RAGTRACE_JUDGE_API_BASE", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("RAGTRACE_JUDGE_API_KEY_ENV", KEY_ENV)
    monkeypatch.setenv("RAGTRACE_JUDGE_PROMPT_DIR", str(tmp_path))
    cfg = JudgeConfig()
    assert cfg.model == "openai/gpt-4o-mini"
    assert cfg.api_base == "http://127.0.0.1:9/v1"
    assert cfg.api_key() == KEY_VALUE
    assert cfg.prompt_dir == tmp_path
    # Explicit settings win over the environment.
    assert JudgeConfig(model="offline").model == "offline"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"modle": "x"}, "Extra inputs"),
        ({"model": " "}, "must not be empty"),
        ({"concurrency": 0}, "greater than or equal to 1"),
        ({"timeout_s": 0}, "greater than 0"),
        ({"extra_params": {"api_key": "sk-inline"}}, "may not set api_key"),
        ({"backoff_base_s": 5, "backoff_max_s": 1}, "backoff_max_s"),
    ],
)
def test_invalid_config(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        JudgeConfig.model_validate(settings)


def test_missing_key_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGTRACE_NO_SUCH_KEY", raising=False)
    cfg = JudgeConfig(model="openai/x", api_key_env="RAGTRACE_NO_SUCH_KEY")
    with pytest.raises(ValueError, match="RAGTRACE_NO_SUCH_KEY"):
        cfg.api_key()
    with pytest.raises(ValueError, match="RAGTRACE_NO_SUCH_KEY"):
        make_judge(cfg)


def test_factory_builds_the_llm_judge(openai_server: FakeOpenAIServer) -> None:
    seen: list[object] = []
    judge = make_judge(
        JudgeConfig(model="openai/x", api_base=openai_server.base_url, api_key_env=KEY_ENV),
        on_call=seen.append,
    )
    assert isinstance(judge, LLMJudge)
    assert judge.model == "openai/x"
    assert judge.heuristic is False


def test_factory_builds_the_offline_judge() -> None:
    judge = make_judge(JudgeConfig())
    assert judge.model == "offline"
    assert judge.heuristic is True
    assert type(judge).__name__ == "OfflineJudge"


def test_config_and_offline_judge_do_not_import_litellm() -> None:
    code = (
        "import sys\n"
        "import ragtrace\n"
        "from ragtrace_collector.judges.config import JudgeConfig\n"
        "from ragtrace_collector.judges.factory import make_judge\n"
        "make_judge(JudgeConfig())\n"
        "assert 'litellm' not in sys.modules, 'litellm imported'\n"
        "import os; assert os.environ['LITELLM_LOCAL_MODEL_COST_MAP'] == 'True'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGTRACE_JUDGE_")}
    env.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
