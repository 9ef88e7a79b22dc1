"""What holding feedback durably costs: ``FeedbackStage.record`` with the join kept in
SQLite (group commit, ``synchronous=FULL``: one fsync per group) against the same
stage in memory only, measured in the same run.

``--concurrency`` records run at once (as many requests in flight in the receiver);
each returns once its write is committed, so concurrent ones share a commit.  Half of
the requests were scored first, so half of the feedback joins.

    .venv/bin/python benchmarks/feedback_join.py                   # a few seconds
    .venv/bin/python benchmarks/feedback_join.py --feedback 20000 --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))

from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.record import Feedback
from ragtrace_collector.feedback.stage import FeedbackStage
from ragtrace_collector.results import MetricResult


async def _run(directory: Path | None, count: int, concurrency: int) -> float:
    """Feedback recorded per second (wall clock)."""
    stage = FeedbackStage(FeedbackConfig(), directory=directory, refresh_interval=3600)
    await stage.start()
    try:
        for i in range(0, count, 2):
            result = MetricResult(metric="contextual_recall", score=(i % 10) / 10)
            stage.scored("svc", "contextual_recall", result, f"{i + 1:032x}", ())
        await stage.drain()
        queue = [
            Feedback(f"{i + 1:032x}", None, "user_feedback", float(i % 2), "boolean")
            for i in range(count)
        ]

        async def worker() -> None:
            while queue:
                await stage.record(queue.pop())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return count / (time.perf_counter() - start)
    finally:
        await stage.shutdown(5.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--feedback", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    baseline = asyncio.run(_run(None, args.feedback, args.concurrency))
    with tempfile.TemporaryDirectory(prefix="feedback-join-bench-") as tmp:
        durable = asyncio.run(_run(Path(tmp), args.feedback, args.concurrency))
    print(f"{args.feedback} feedback, {args.concurrency} at once")
    print(f"in memory:          {baseline:10.0f} feedback/s (baseline)")
    print(f"SQLite, fsync'd:    {durable:10.0f} feedback/s")
    print(f"ratio durable / in memory: {durable / baseline:.3f}")


if __name__ == "__main__":
    main()
