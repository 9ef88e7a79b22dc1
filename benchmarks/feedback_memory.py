"""Memory the feedback join and the agreement tracker hold, per entry (tracemalloc).

Fills a :class:`MemoryJoinStore` (no SQLite) with ``--requests`` evaluated requests,
each with ``--metrics`` scores, one segment value and one feedback, then with as many
pending feedback (no scores), and a tracker series with as many pairs; prints the bytes
per entry of each and the bound they give at the default configuration.

The baseline, measured in the same run: the same content as the compact JSON the
durable backends store (one string per request), held in a dict by trace id.  The
ratio says what the in-memory form costs over that.

    .venv/bin/python benchmarks/feedback_memory.py             # a few seconds
    .venv/bin/python benchmarks/feedback_memory.py --requests 2000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))

from ragtrace_collector.feedback.config import FeedbackConfig
from ragtrace_collector.feedback.memory import MemoryJoinStore
from ragtrace_collector.feedback.record import Feedback
from ragtrace_collector.feedback.tracker import AgreementTracker

METRICS = [
    "faithfulness",
    "answer_relevancy",
    "contextual_recall",
    "contextual_precision",
    "hallucination",
]


def _measure(build: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes still allocated once ``build()`` returned (its result kept alive)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, kept


def _feedback(i: int) -> Feedback:
    return Feedback(
        trace_id=f"{i:032x}",
        span_id=f"{i:016x}",
        name="user_feedback",
        value=float(i % 2),
        value_type="boolean",
        comment="the answer cited the wrong article" if i % 5 == 0 else None,
        user_id=f"user-{i % 997}",
        service="support-bot",
        time_unix_nano=1_700_000_000_000_000_000 + i,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--metrics", type=int, default=len(METRICS))
    args = parser.parse_args()
    n, metrics = args.requests, METRICS[: args.metrics]
    config = FeedbackConfig(max_requests=n, max_pending=n, max_pairs=n)
    loop = asyncio.new_event_loop()

    def scored() -> MemoryJoinStore:
        store = MemoryJoinStore(config, clock=lambda: 1.0)
        for i in range(n):
            trace_id = f"{i:032x}"
            for m, metric in enumerate(metrics):
                score = ((i * 7 + m) % 100) / 100
                loop.run_until_complete(
                    store.add_score(trace_id, ("support-bot", metric), (score, 0.5), ("prod",), 1.0)
                )
            loop.run_until_complete(store.add_feedback(_feedback(i), 1.0))
        return store

    def pending() -> MemoryJoinStore:
        store = MemoryJoinStore(config, clock=lambda: 1.0)
        for i in range(n):
            loop.run_until_complete(store.add_feedback(_feedback(i), 1.0))
        return store

    def baseline() -> dict[str, str]:
        held: dict[str, str] = {}
        for i in range(n):
            f = _feedback(i)
            scores = {m: [((i * 7 + k) % 100) / 100, 0.5] for k, m in enumerate(metrics)}
            held[f.trace_id] = json.dumps(
                [1.0, ["prod"], scores, [f.name, f.user_id, f.value, f.comment, f.span_id]],
                separators=(",", ":"),
            )
        return held

    def pairs() -> AgreementTracker:
        tracker = AgreementTracker(config, clock=lambda: 1.0)
        for i in range(n):
            f = _feedback(i)
            tracker.add(
                ("support-bot", "faithfulness", "user_feedback", ("prod",)),
                (f.trace_id, f.user_id or ""),
                (i % 100) / 100,
                f.value,
                0.5,
                1.0,
            )
        return tracker

    # Warm the interned strings and the code paths once, on a small run.
    for build in (scored, pending, baseline, pairs):
        build()
    per_request = _measure(scored)[0] / n
    per_pending = _measure(pending)[0] / n
    per_json = _measure(baseline)[0] / n
    per_pair = _measure(pairs)[0] / n
    loop.close()
    defaults = FeedbackConfig()
    join_bound = defaults.max_requests * per_request + defaults.max_pending * per_pending
    pairs_bound = defaults.max_series * defaults.max_pairs * per_pair
    print(f"requests={n} metrics={len(metrics)} (one segment value, one feedback each)")
    print(f"scored request held:   {per_request:8.0f} B")
    print(f"pending feedback held: {per_pending:8.0f} B")
    print(f"tracker pair held:     {per_pair:8.0f} B")
    print(f"baseline (the same as compact JSON in a dict): {per_json:8.0f} B per request")
    print(f"ratio scored request / baseline: {per_request / per_json:.2f}")
    print(
        f"bound at the defaults: join {join_bound / 2**20:.0f} MiB "
        f"({defaults.max_requests} requests + {defaults.max_pending} pending), "
        f"tracker {pairs_bound / 2**20:.0f} MiB "
        f"({defaults.max_series} series x {defaults.max_pairs} pairs)"
    )


if __name__ == "__main__":
    main()
