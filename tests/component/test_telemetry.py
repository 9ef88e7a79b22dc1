"""ResultBook writes ragtrace_eval_score and ragtrace_eval_results without
prometheus-client's metric objects; what a scrape reads must be what those objects
would have exposed for the same results."""

from __future__ import annotations

import gc
import itertools
import math
import random
import re
import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from ragtrace_collector.component.telemetry import SCORE_BUCKETS, ResultBook, Telemetry

_CREATED = re.compile(r"^(\S+_created\{[^}]*\}) \S+$", re.MULTILINE)


def _reference(results: list[tuple[str, str, str, float | None]]) -> str:
    """The exposition of prometheus-client's own Histogram and Counter."""
    registry = CollectorRegistry()
    score = Histogram(
        "ragtrace_eval_score",
        "Evaluation scores (skipped and errored results are not observed).",
        ["service", "metric"],
        buckets=SCORE_BUCKETS,
        registry=registry,
    )
    counter = Counter(
        "ragtrace_eval_results",
        "Metric results by outcome: passed, failed, skipped, error.",
        ["service", "metric", "outcome"],
        registry=registry,
    )
    for service, metric, outcome, value in results:
        counter.labels(service, metric, outcome).inc()
        if value is not None and math.isfinite(value):
            score.labels(service, metric).observe(value)
    return _CREATED.sub(r"\1 T", generate_latest(registry).decode())


def test_the_exposition_is_prometheus_clients() -> None:
    rng = random.Random(7)
    edges = [*SCORE_BUCKETS, -0.5, 1.5, 0.05, 0.949999, math.nan, math.inf, -math.inf, None]
    results = []
    for _ in range(3000):
        value = rng.choice(edges) if rng.random() < 0.3 else rng.random()
        results.append(
            (
                rng.choice(["shop", "bank"]),
                rng.choice(["id_context_recall", "faithfulness", "answer_relevancy"]),
                rng.choice(["passed", "failed", "skipped", "error"]),
                value,
            )
        )
    telemetry = Telemetry()
    for service, metric, outcome, value in results:
        telemetry.results.record(service, metric, outcome, value)
    ours = _CREATED.sub(r"\1 T", telemetry.render().decode())
    reference = _reference(results)
    kept = [line for line in ours.splitlines() if re.search(r"ragtrace_eval_(score|results)", line)]
    assert "\n".join(kept) + "\n" == reference
    passed = telemetry.registry.get_sample_value(
        "ragtrace_eval_results_total",
        {"service": "shop", "metric": "faithfulness", "outcome": "passed"},
    )
    assert passed == sum(r[:3] == ("shop", "faithfulness", "passed") for r in results)
    sample = telemetry.registry.get_sample_value(
        "ragtrace_eval_score_count", {"service": "bank", "metric": "faithfulness"}
    )
    assert sample == sum(
        r[:2] == ("bank", "faithfulness") and r[3] is not None and math.isfinite(r[3])
        for r in results
    )


def test_a_scrape_from_another_thread_while_results_are_written() -> None:
    book = ResultBook(registry=(registry := CollectorRegistry()))
    stop = threading.Event()
    errors: list[BaseException] = []

    def scrape() -> None:
        try:
            while not stop.is_set():
                generate_latest(registry)
        except BaseException as exc:
            errors.append(exc)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(20_000):  # new series keep appearing while the scraper copies
            book.record(f"svc-{i % 50}", f"m-{i % 97}", "passed", (i % 11) / 10)
    finally:
        stop.set()
        scraper.join(10)
    assert not errors
    text = generate_latest(registry).decode()
    total = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ragtrace_eval_score_count")
    )
    assert total == 20_000


def test_a_scrape_copies_the_series_even_when_a_write_lands_mid_copy() -> None:
    """The scrape copies the series while the event loop may write: a cyclic GC run
    that the copy's own allocations trigger can run Python code (finalizers), and so
    let the loop thread in.  A gc callback plays that thread here, deterministically:
    it adds a series each time the GC starts."""
    book = ResultBook(registry=(registry := CollectorRegistry()))
    for i in range(300):
        book.record(f"svc-{i}", "m", "passed", 0.5)
    added = itertools.count()

    def write_mid_copy(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            book.record(f"new-{next(added)}", "m", "passed", 0.5)

    threshold = gc.get_threshold()
    gc.callbacks.append(write_mid_copy)
    gc.set_threshold(1)  # a collection at nearly every allocation
    try:
        text = generate_latest(registry).decode()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(write_mid_copy)
    assert next(added) > 0, "the GC never ran during the scrape: the test proves nothing"
    # Every series that existed when the scrape began is in it.
    for i in range(300):
        assert (
            f'ragtrace_eval_results_total{{metric="m",outcome="passed",service="svc-{i}"}}' in text
        )
