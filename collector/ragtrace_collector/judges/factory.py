"""Build the judge a configuration names."""

from __future__ import annotations

from collections.abc import Callable

from ragtrace_collector.judges.base import Judge, JudgeCallRecord
from ragtrace_collector.judges.config import JudgeConfig

__all__ = ["make_judge"]


def make_judge(
    config: JudgeConfig | None = None,
    on_call: Callable[[JudgeCallRecord], None] | None = None,
) -> Judge:
    """The offline judge for ``model="offline"``, otherwise the litellm judge.

    Both modules are imported lazily: building an offline judge never imports litellm.
    """
    config = config if config is not None else JudgeConfig()
    if config.is_offline:
        from ragtrace_collector.judges.offline import OfflineJudge

        return OfflineJudge(on_call=on_call)
    from ragtrace_collector.judges.llm import LLMJudge

    return LLMJudge(config, on_call=on_call)
