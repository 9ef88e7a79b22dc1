"""Drop-detector memory and CPU per result with score segments, against no segments.

The same stream of results (one service, one metric, simulated time: ``--rate``
results a second for ``--hours`` hours, an evaluation every 30 s) goes through:

* **baseline**: today's detector, one drop rule (5 min window, 1 h trailing baseline:
  a series holds the same 20 fine + 97 coarse buckets whatever the lengths, so this
  is the memory of a 15 min / 24 h rule too, filled in 65 simulated minutes), no
  segments;
* **3 keys, one rule without group_by**: the per-result cost of the segment labels
  alone (reading and bounding the values, the labelled score metrics);
* **3 keys, one rule per key**: ``segments:`` with three keys, each at its cardinality
  limit (``--max-values`` values seen, plus cases without the attribute, so every key
  has ``max_values + 2`` label values: the kept ones, ``other`` and ``unset``), and
  three drop rules, each ``group_by`` one key;
* **3 keys, one rule over all three**: one drop rule ``group_by`` the three keys, the
  worst case: ``(max_values + 2) ** 3`` series.

Each segmented run also pays what the evaluator pays per case: turning the raw values
into label values (:class:`~ragtrace_collector.evaluation.segments.Segments`) and
counting the result in ``ragtrace_eval_score``/``ragtrace_eval_results``
(:class:`~ragtrace_collector.component.telemetry.ResultBook`); the baseline counts the
result without segments.  For each key, 90% of the cases carry one of ``max_values``
values, 5% one of ``50 x max_values`` rare values (counted as ``other``), 5% none
(``unset``): every key is at its limit, with every label value in use.

Reported: CPU time per result (``time.process_time``, observe + record + the
evaluations, divided by the results), the detector's memory (``tracemalloc``, the
bytes held once the stream has run, i.e. a full window and baseline of buckets), and
each ratio to the baseline measured in the same run.

Run: ``.venv/bin/python benchmarks/detector_segments.py [--hours 1.25] [--rate 20]
[--max-values 10]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from ragtrace_collector.alerts import AlertsConfig, DropDetector
from ragtrace_collector.component.telemetry import ResultBook
from ragtrace_collector.evaluation.segments import Segments
from ragtrace_collector.segments import SegmentKey

KEYS = ("deployment.environment", "service.version", "app.index_version")
T0 = 1_699_999_200.0


class _Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _rule(name: str, group_by: Sequence[str]) -> dict[str, Any]:
    return {
        "name": name,
        "metric": "contextual_recall",
        "window": "5m",
        "baseline": "1h",
        "for": "5m",
        "group_by": list(group_by),
    }


def _stream(seconds: float, rate: float, max_values: int, seed: int) -> list[Any]:
    """(time, score, raw values per key) for the whole run, drawn before timing."""
    rng = random.Random(seed)
    n = round(seconds * rate)
    kept = [f"v{i}" for i in range(max_values)]
    rare = [f"rare{i}" for i in range(50 * max_values)]

    def value() -> str | None:
        u = rng.random()
        if u < 0.05:
            return None  # unset
        if u < 0.10:
            return rng.choice(rare)  # other: each far rarer than any kept value
        return rng.choice(kept)

    out = []
    for i in range(n):
        raw = tuple(value() for _ in KEYS)
        out.append((T0 + i / rate, min(1.0, max(0.0, rng.gauss(0.8, 0.15))), raw))
    return out


def _run(
    rules: list[dict[str, Any]],
    segment_keys: list[SegmentKey],
    stream: list[Any],
    evaluate_every: float,
    *,
    trace_memory: bool,
) -> tuple[float, int, int]:
    """CPU seconds per result, bytes held by the detector, the score metrics and the
    segment state at the end (with ``trace_memory``; else 0), and the series count."""
    gc.collect()
    if trace_memory:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if trace_memory else 0
    clock = _Clock()
    config = AlertsConfig.model_validate({"rules": rules, "log": {"enabled": False}})
    detector = DropDetector(config, [], None, clock, segment_keys)
    book = ResultBook()
    segments = Segments(segment_keys) if segment_keys else None
    if segments is not None:
        book.set_segment_labels(segments.labels_names)
        segments.add_evict_listener(book.forget)
    loop = asyncio.new_event_loop()
    observe: Callable[..., None] = detector.observe
    record = book.record
    next_eval = T0 + evaluate_every
    cpu = 0.0
    for chunk_start in range(0, len(stream), 10_000):
        chunk = stream[chunk_start : chunk_start + 10_000]
        t0 = time.process_time()
        for at, score, raw in chunk:
            clock.t = at
            if segments is not None:
                labels = segments.labels(segments.read(dict(zip(KEYS, raw, strict=True)), None))
            else:
                labels = ()
            record("shop", "contextual_recall", "passed", score, labels)
            observe("shop", "contextual_recall", score, "trace", at, segments=labels)
            if at >= next_eval:
                loop.run_until_complete(detector.evaluate(at))
                next_eval += evaluate_every
        cpu += time.process_time() - t0
    held = 0
    if trace_memory:
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    series = sum(len(r.series) for r in detector._rules)
    loop.close()
    del detector, book, segments
    return cpu / len(stream), held, series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.25, help="simulated traffic")
    parser.add_argument("--rate", type=float, default=20.0, help="results a second")
    parser.add_argument("--max-values", type=int, default=10, help="per segment key")
    args = parser.parse_args()
    stream = _stream(args.hours * 3600, args.rate, args.max_values, seed=1)
    keys = [SegmentKey(key=k, max_values=args.max_values) for k in KEYS]
    # Each configuration runs twice: CPU without tracemalloc (which slows allocation),
    # then memory with it.
    runs = {
        "baseline (no segments, 1 rule)": ([_rule("r", [])], []),
        "3 keys, 1 rule (no group_by)": ([_rule("r", [])], keys),
        "3 keys, 3 rules (group_by one key each)": (
            [_rule(f"r{i}", [k]) for i, k in enumerate(KEYS)],
            keys,
        ),
        "3 keys, 1 rule (group_by all three)": ([_rule("r", list(KEYS))], keys),
    }
    print(
        f"{len(stream):,} results over {args.hours:g} h at {args.rate:g}/s; "
        f"{len(KEYS)} keys at max_values={args.max_values} "
        f"({args.max_values + 2} label values each)"
    )
    results: dict[str, tuple[float, int, int]] = {}
    for name, (rules, segment_keys) in runs.items():
        cpu, _, series = _run(rules, segment_keys, stream, 30.0, trace_memory=False)
        _, mem, _ = _run(rules, segment_keys, stream, 30.0, trace_memory=True)
        results[name] = (cpu, mem, series)
    base_cpu, base_mem, _ = results["baseline (no segments, 1 rule)"]
    print(f"{'run':44} {'series':>7} {'CPU/result':>11} {'x':>6} {'memory':>10} {'x':>7}")
    for name, (cpu, mem, series) in results.items():
        print(
            f"{name:44} {series:7d} {cpu * 1e6:9.2f}us {cpu / base_cpu:6.2f}"
            f" {mem / 1024:8.0f}KiB {mem / max(base_mem, 1):7.1f}"
        )


if __name__ == "__main__":
    main()
