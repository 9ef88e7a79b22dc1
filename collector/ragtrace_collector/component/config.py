"""The ``logging`` section: how every component's log lines are written
(:mod:`ragtrace_collector.component.logs`).  Light: no structlog import, so that
loading a configuration stays fast."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ragtrace_collector.configbase import StrictModel

__all__ = ["LoggingConfig"]


class LoggingConfig(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Lowest level written."
    )
    format: Literal["auto", "json", "console"] = Field(
        "auto",
        description="`json`: one JSON object per line; `console`: for humans; `auto`: "
        "`console` when stderr is a terminal, else `json`.",
    )
    third_party_debug: bool = Field(
        False,
        description="Let `openai`, `httpx`, `httpcore` and `litellm` log below WARNING "
        "(and litellm's verbose mode).  A privacy risk: at debug level they write whole "
        "judge requests, i.e. user questions and retrieved documents.",
    )
