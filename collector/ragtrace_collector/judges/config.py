"""Judge configuration: which model answers the judge tasks, and how it is called.

``model`` is ``"offline"`` (the deterministic lexical judge, no network) or any
litellm model string (``"openai/gpt-4o-mini"``, ``"anthropic/claude-3-5-haiku-latest"``,
``"ollama/llama3"``...).  Secrets are never stored here: ``api_key_env`` *names* the
environment variable that holds the key; without it, litellm reads the provider's
usual variables (``OPENAI_API_KEY``...) itself.

Environment fallbacks (used when the field is not set explicitly):

* ``RAGTRACE_JUDGE_MODEL`` -> ``model``
* ``RAGTRACE_JUDGE_API_BASE`` -> ``api_base``
* ``RAGTRACE_JUDGE_API_KEY_ENV`` -> ``api_key_env``
* ``RAGTRACE_JUDGE_PROMPT_DIR`` -> ``prompt_dir``
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragtrace_collector.units import Duration

__all__ = ["JudgeConfig"]

_ENV_FALLBACKS: dict[str, str] = {
    "model": "RAGTRACE_JUDGE_MODEL",
    "api_base": "RAGTRACE_JUDGE_API_BASE",
    "api_key_env": "RAGTRACE_JUDGE_API_KEY_ENV",
    "prompt_dir": "RAGTRACE_JUDGE_PROMPT_DIR",
}


class JudgeConfig(BaseModel):
    """How to reach the judge model.  Unknown keys are a configuration error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        "offline",
        description="`offline` (the lexical judge: no network, scores labelled heuristic) "
        "or a litellm model string such as `openai/gpt-4o-mini`.  Unset: "
        "`RAGTRACE_JUDGE_MODEL`.",
    )
    api_base: str | None = Field(
        None,
        description="Base URL of an OpenAI-compatible (or other provider) endpoint.  "
        "Unset: `RAGTRACE_JUDGE_API_BASE`.",
    )
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding the API key (not the key "
        "itself); unset, litellm reads the provider's usual variable (`OPENAI_API_KEY`...).",
    )
    #: Per-call timeout, seconds.
    timeout_s: Duration = Field(default=60.0, gt=0)
    #: Retries on 429, 5xx and connection errors (0 = a single attempt).
    max_retries: int = Field(default=3, ge=0, le=20)
    #: Exponential backoff: base * 2**attempt, capped at max, with full jitter.
    backoff_base_s: Duration = Field(default=0.5, ge=0)
    backoff_max_s: Duration = Field(
        default=30.0, ge=0, description="Longest backoff delay before a retry, seconds."
    )
    #: Longest judge answer taken, in characters; a longer one is refused unparsed
    #: (an ``invalid_response`` error on the metric), never truncated and scored.
    #: For models called through the OpenAI client (``openai/...``, any
    #: OpenAI-compatible server) the HTTP answer is refused unread past 12 bytes per
    #: character plus 64 KiB, and when compressed.
    max_answer_chars: int = Field(default=200_000, ge=1)
    #: Maximum judge calls in flight for one judge instance.
    concurrency: int = Field(default=8, ge=1, le=1024)
    #: Entries of the in-process answer cache (0 disables it).
    cache_size: int = Field(default=4096, ge=0)
    temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="Sampling temperature of the judge model."
    )
    #: Ask for ``response_format={"type": "json_object"}`` when the model supports it.
    json_mode: bool = True
    #: Extra keyword arguments passed through to ``litellm.acompletion``.
    extra_params: dict[str, Any] = Field(default_factory=dict)
    #: A directory of ``<task_name>.txt`` templates overriding the built-in prompts.
    prompt_dir: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _env_fallbacks(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        merged = dict(data)
        for field, var in _ENV_FALLBACKS.items():
            if merged.get(field) is None:
                value = os.environ.get(var)
                if value:
                    merged[field] = value
        return merged

    @model_validator(mode="after")
    def _check(self) -> JudgeConfig:
        if not self.model.strip():
            raise ValueError("judge model must not be empty (use 'offline' for no LLM)")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")
        reserved = {"model", "messages", "api_base", "api_key", "timeout", "num_retries"}
        clash = sorted(reserved & set(self.extra_params))
        if clash:
            raise ValueError(
                f"extra_params may not set {', '.join(clash)}; use the judge config fields"
            )
        return self

    @property
    def is_offline(self) -> bool:
        return self.model.strip().lower() == "offline"

    def api_key(self) -> str | None:
        """The key read from ``api_key_env``; None lets litellm use provider defaults.

        Raises ``ValueError`` when ``api_key_env`` is set but the variable is empty.
        """
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ValueError(f"environment variable {self.api_key_env} (api_key_env) is not set")
        return value
