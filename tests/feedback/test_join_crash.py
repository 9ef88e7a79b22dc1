"""A kill -9 right after record() returned loses nothing: the join is read back from
its SQLite file with every feedback a record() acknowledged."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.stage import FeedbackStage

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from ragtrace_collector.feedback.config import FeedbackConfig
    from ragtrace_collector.feedback.record import Feedback
    from ragtrace_collector.feedback.stage import FeedbackStage

    async def main() -> None:
        stage = FeedbackStage(FeedbackConfig(), directory=Path(sys.argv[1]))
        await stage.start()
        for i in range(100_000):
            fb = Feedback(f"{i + 1:032x}", None, "user_feedback", 0.0, "boolean")
            await stage.record(fb)
            print(i, flush=True)  # acknowledged

    asyncio.run(main())
    """
)


def test_acknowledged_feedback_survives_kill_9(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert child.stdout is not None
    acknowledged = -1
    try:
        for line in child.stdout:  # bounded: the child stops at 100,000
            acknowledged = int(line)
            if acknowledged >= 300:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert acknowledged >= 300

    async def reopen() -> tuple[int, int]:
        stage = FeedbackStage(FeedbackConfig(), directory=tmp_path, refresh_interval=3600)
        await stage.start()
        try:
            missing = [
                i for i in range(acknowledged + 1) if await stage.store.get(f"{i + 1:032x}") is None
            ]
            assert missing == []
            return stage.store.held()
        finally:
            await stage.shutdown(1.0)

    scored, pending = asyncio.run(reopen())
    assert scored == 0
    assert pending >= acknowledged + 1
