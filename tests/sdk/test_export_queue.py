"""The export queue: a burst loses nothing, and a loss is never silent.

Real OTLP/HTTP export to a receiver on 127.0.0.1 (``tests/fakes/otlp_sink.py``), through
the provider ``ragtrace.configure()`` builds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import pytest

import ragtrace
from ragtrace import ConfigurationError
from tests.fakes.otlp_sink import OtlpSink
from tests.fakes.ports import free_port

#: The exporter's own retry budget in the dead-collector tests (OTel's default is 10 s):
#: long, so that waiting for the exporter instead of the timeout given cannot pass for
#: slowness of the machine.
_EXPORTER_RETRIES_S = "60"

_DOCS = [{"id": f"kb-{i}", "content": "x" * 200, "score": 0.5} for i in range(5)]


@ragtrace.retriever
def search(query: str) -> list[dict[str, Any]]:
    return _DOCS


@ragtrace.rag
def answer(question: str) -> str:
    search(question)
    return "an answer"


def _warnings(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ragtrace" and r.levelno == logging.WARNING and needle in r.getMessage()
    ]


def _closed_port() -> int:
    return free_port()  # nothing listens there


def test_a_burst_loses_no_span() -> None:
    calls = 3000
    with OtlpSink() as sink:
        ragtrace.configure(endpoint=sink.http_url, service_name="burst")
        for i in range(calls):
            answer(f"question {i}")
        assert ragtrace.flush(timeout=60) is True
        received = sink.wait_for_spans(2 * calls, timeout=60)
        stats = ragtrace.stats()
        ragtrace.shutdown()
    assert len(received) == 2 * calls
    assert len({r.span.span_id for r in received}) == 2 * calls
    assert stats.spans_exported == 2 * calls
    assert stats.dropped == 0
    assert stats.spans_queued == 0


def test_a_full_queue_is_counted_reported_by_flush_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with OtlpSink() as sink:
        sink.hold = threading.Event()  # the collector stalls: nothing leaves the queue
        ragtrace.configure(endpoint=sink.http_url, max_queue_bytes=64 * 1024)
        with caplog.at_level(logging.WARNING, logger="ragtrace"):
            for i in range(400):
                answer(f"question {i}")
            stats = ragtrace.stats()
            sink.hold.set()
            assert ragtrace.flush(timeout=30) is False  # spans were dropped
            assert ragtrace.flush(timeout=30) is True  # nothing dropped since
            ragtrace.shutdown()
        delivered = sink.span_count
    dropped = stats.spans_dropped.get("queue_full", 0)
    assert dropped > 0
    assert stats.queue_bytes <= 64 * 1024
    final = ragtrace.stats()
    assert final.spans_exported == delivered == 800 - dropped
    lines = _warnings(caplog, "export queue was full")
    assert len(lines) == 1, lines
    assert "max_queue_bytes" in lines[0]
    assert "RAGTRACE_MAX_QUEUE_BYTES" in lines[0]
    assert f"({dropped} in all)" in lines[0]


def test_a_dead_collector_never_delays_shutdown_past_its_timeout(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", _EXPORTER_RETRIES_S)
    ragtrace.configure(endpoint=f"http://127.0.0.1:{_closed_port()}")
    with caplog.at_level(logging.WARNING, logger="ragtrace"):
        for i in range(50):
            answer(f"question {i}")
        assert ragtrace.flush(timeout=0.5) is False
        started = time.monotonic()
        ragtrace.shutdown(timeout=1.0)
        took = time.monotonic() - started
    # It takes the 1.0 s given (1.0-1.1 s measured); the exporter would retry for a
    # minute.  The bound is over 5x that, not a measure of speed.
    assert took < 6.0, f"shutdown took {took:.1f}s with timeout=1.0"
    stats = ragtrace.stats()
    assert stats.spans_exported == 0
    # Every span is accounted for, the batch still inside the exporter's retries too.
    assert stats.dropped == 100
    assert stats.spans_dropped.get("shutdown", 0) > 0
    # The abandoned export call ends (the exporter's shutdown cut its retries short),
    # and its batch must not be counted twice.
    for thread in threading.enumerate():
        if thread.name == "ragtrace-export":
            thread.join(30)
            assert not thread.is_alive(), "the abandoned export never ended"
    assert ragtrace.stats().dropped == 100
    assert _warnings(caplog, "shutdown()/flush() ran out of time")


def test_stats_before_configure_and_with_a_user_provider() -> None:
    assert ragtrace.stats().as_dict() == {
        "spans_exported": 0,
        "spans_dropped": {},
        "spans_queued": 0,
        "queue_bytes": 0,
        "max_queue_bytes": 0,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [("67108864", 67108864), ("64MiB", 64 * 1024**2), ("512 KB", 512_000), ("1gib", 1024**3)],
)
def test_max_queue_bytes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: int
) -> None:
    monkeypatch.setenv("RAGTRACE_MAX_QUEUE_BYTES", text)
    ragtrace.configure(endpoint=f"http://127.0.0.1:{_closed_port()}")
    assert ragtrace.stats().max_queue_bytes == expected
    ragtrace.shutdown(timeout=0.1)


@pytest.mark.parametrize("text", ["lots", "-5", "12XB", "0", "100"])
def test_bad_max_queue_bytes_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("RAGTRACE_MAX_QUEUE_BYTES", text)
    with pytest.raises(ConfigurationError, match="RAGTRACE_MAX_QUEUE_BYTES"):
        ragtrace.configure(endpoint="http://127.0.0.1:1")
    with pytest.raises(ConfigurationError, match="max_queue_bytes"):
        ragtrace.configure(endpoint="http://127.0.0.1:1", max_queue_bytes=10)


@pytest.mark.slow
def test_a_dead_collector_does_not_hold_up_the_process_exit(tmp_path: Any) -> None:
    """An app that exits without calling shutdown(): ragtrace's exit handler gives the
    queue the default timeout (5 s), not the exporter's retries (here a minute)."""
    import subprocess
    import sys

    script = tmp_path / "app.py"
    script.write_text(
        "import ragtrace\n"
        f"ragtrace.configure(endpoint='http://127.0.0.1:{_closed_port()}')\n"
        "@ragtrace.rag\n"
        "def answer(question):\n"
        "    return 'a'\n"
        "for i in range(200):\n"
        "    answer(f'q{i}')\n"
        "import time\n"
        "print(time.time(), flush=True)\n"
    )
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TIMEOUT": _EXPORTER_RETRIES_S}
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        env=env,
    )
    exited = time.time()
    assert out.returncode == 0, out.stderr
    took = exited - float(out.stdout.strip())  # from the end of the app's code to exit
    # 5.0-5.3 s measured (the default timeout); waiting for the exporter would take
    # the minute it is given.  Over 5x the measure still tells the two apart.
    assert took < 30.0, f"exit took {took:.1f}s after the app's last line"
    assert "dropped 200 span(s)" in out.stderr
