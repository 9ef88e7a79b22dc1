"""Helpers for the alerting end-to-end tests.

* :data:`DETECTOR_RULE` and :func:`collector_data`: one collector config, used by every
  test here, that evaluates only ``id_context_recall`` (exact and offline: the golden
  traffic carries its reference ids) and runs the drop detector with windows of seconds;
* :class:`Traffic`: the example support bot asking its golden questions through the
  real SDK (``ragtrace.configure`` -> OTLP/HTTP -> the collector) at a steady pace, in
  a thread, with a switchable fault; it records when each request ran and with which
  fault, so a trace seen downstream can be told good or degraded by its start time;
* :class:`CollectorProcess`: ``ragtrace-collector serve --config FILE`` as a subprocess;
* :class:`EvalCollectorThread`: the in-process :class:`CollectorService` with its
  evaluation stage (the harness's thread runs a pass-through by default);
* :class:`HookReceiver`: an aiohttp server on loopback recording every JSON POST;
* :class:`ReleaseSender`: raw OTLP traces of two releases on two index versions, one
  of which can break or be rolled back;
* read-back helpers for Alertmanager, Prometheus, ``/metrics`` and the sink.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

import ragtrace
from examples.support_bot import SupportBot, run_golden
from examples.support_bot.data import GoldenItem, load_golden
from ragtrace import semconv
from ragtrace_collector.config import parse_config
from ragtrace_collector.otlp.spanattrs import set_attributes
from ragtrace_collector.service.server import CollectorService
from tests.fakes.harness import CollectorThread, http_get
from tests.fakes.otlp_sink import OtlpSink, ReceivedSpan
from tests.fakes.services import free_port, get_json
from tests.fakes.spans import make_span

COLLECTOR_BIN = Path(sys.executable).with_name("ragtrace-collector")
SERVICE = "support-bot-alerting"
METRIC = "id_context_recall"
SCORE_ATTR = semconv.eval_attr(METRIC, semconv.EVAL_FIELD_SCORE)

#: The collector's drop rule, shared by the firing test and the noise test: a 6s window
#: against the 30s before it, a drop of 0.2 that the sequential test (the default) must
#: gather evidence for, at least 20 scores on each side, held for 1s.  ``hysteresis``
#: and ``confidence`` apply to ``test: window`` only.
DETECTOR_RULE: dict[str, Any] = {
    "name": "id-recall-drop",
    "metric": METRIC,
    "window": "6s",
    "baseline": {"window": "30s", "min_samples": 20},
    "drop": 0.2,
    "min_samples": 20,
    "for": "1s",
    "hysteresis": 0.1,
    "confidence": 0.95,
    "labels": {"severity": "page"},
}
DETECTOR_ALERTNAME = "RagtraceScoreDrop"


def alerts_section(
    *, webhook_url: str | None = None, alertmanager_url: str | None = None
) -> dict[str, Any]:
    """The ``alerts:`` section: :data:`DETECTOR_RULE`, evaluated every 0.5s."""
    section: dict[str, Any] = {
        "evaluation_interval": "500ms",
        "rules": [DETECTOR_RULE],
        "log": {"enabled": True},
    }
    if webhook_url is not None:
        section["webhook"] = {"url": webhook_url, "max_attempts": 3, "backoff": "100ms"}
    if alertmanager_url is not None:
        section["alertmanager"] = {
            "url": alertmanager_url,
            "resend_interval": "2s",
            "max_attempts": 3,
            "backoff": "100ms",
        }
    return section


def collector_data(
    sink: OtlpSink,
    alerts: dict[str, Any],
    *,
    grpc: str = "127.0.0.1:0",
    http: str = "127.0.0.1:0",
    admin: str = "127.0.0.1:0",
) -> dict[str, Any]:
    """A collector config (as YAML data): loopback ports, every trace evaluated for
    ``id_context_recall`` with the offline judge, results exported to ``sink``."""
    return {
        "receivers": {"grpc": {"endpoint": grpc}, "http": {"endpoint": http}},
        "admin": {"endpoint": admin},
        "assembly": {"decision_wait": "100ms", "max_trace_wait": "5s"},
        "exporters": {
            "backend": {
                "type": "otlp_grpc",
                "endpoint": sink.grpc_endpoint,
                "retry": {"initial_interval": "50ms", "max_interval": "300ms"},
            }
        },
        "judge": {"model": "offline"},
        "metrics": {METRIC: {}},
        "sampling": {"rate": 1.0},
        "alerts": alerts,
        "logging": {"level": "info", "format": "json"},
        "shutdown": {"receiver_grace": 1, "processor_timeout": 5, "flush_timeout": 10},
    }


# -------------------------------------------------------------------- traffic
@dataclass(frozen=True)
class Request:
    """One request of the bot: when it ran (epoch ns), its fault, its true ID recall,
    and whether it carried its ground truth (without it, ID recall is skipped)."""

    start_ns: int
    end_ns: int
    fault: str
    recall: float
    scored: bool = True


class Traffic:
    """Golden questions through the real SDK at ``rate`` requests per second.

    ``set(fault=..., bad_ratio=..., unscored_ratio=...)`` changes what comes next:
    every request uses ``fault``, except a share ``bad_ratio`` of them (seeded) sent
    with ``wrong_index``; a share ``unscored_ratio`` is sent without ground truth, like
    ordinary production traffic.  The bot's own ID recall of every request is the
    oracle for the collector's score.
    """

    def __init__(self, *, rate: float = 10.0, seed: int = 0) -> None:
        self._period = 1.0 / rate
        self._rng = random.Random(seed)
        self._bot = SupportBot(fault="none")
        self._golden: list[GoldenItem] = load_golden()
        self._lock = threading.Lock()
        self._fault = "none"
        self._bad_ratio = 0.0
        self._unscored_ratio = 0.0
        self._requests: list[Request] = []
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="alerting-traffic", daemon=True)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def set(
        self, *, fault: str = "none", bad_ratio: float = 0.0, unscored_ratio: float = 0.0
    ) -> int:
        """Switch what the next requests do; returns the switch time (epoch ns)."""
        with self._lock:
            self._fault, self._bad_ratio = fault, bad_ratio
            self._unscored_ratio = unscored_ratio
            return time.time_ns()

    def stop(self) -> None:
        """Stop, flush the SDK, and re-raise what went wrong in the thread."""
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the traffic thread did not stop"
        assert ragtrace.flush(30), "the SDK could not flush its spans to the collector"
        if self._error is not None:
            raise AssertionError("the traffic thread failed") from self._error

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def count(self, since_ns: int = 0, fault: str | None = None, scored: bool | None = None) -> int:
        return sum(
            1
            for r in self.requests
            if r.start_ns >= since_ns and fault in (None, r.fault) and scored in (None, r.scored)
        )

    def request_at(self, start_ns: int) -> Request | None:
        """The request whose run covers ``start_ns`` (a span's start time)."""
        requests = self.requests
        i = bisect.bisect_right([r.start_ns for r in requests], start_ns) - 1
        if i >= 0 and requests[i].start_ns <= start_ns <= requests[i].end_ns:
            return requests[i]
        return None

    def _run(self) -> None:
        try:
            n = 0
            next_at = time.monotonic()
            while not self._stop.is_set():
                with self._lock:
                    bad = self._rng.random() < self._bad_ratio
                    scored = self._rng.random() >= self._unscored_ratio
                    fault = "wrong_index" if bad else self._fault
                item = self._golden[n % len(self._golden)]
                n += 1
                start = time.time_ns()
                run = run_golden(self._bot, fault=fault, items=[item], set_reference=scored)
                end = time.time_ns()
                (result,) = run.results
                with self._lock:
                    self._requests.append(Request(start, end, fault, result.id_recall, scored))
                # a steady pace; after a stall, carry on from now instead of bursting
                next_at = max(next_at + self._period, time.monotonic())
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as exc:
            self._error = exc


def configure_sdk(http_base_url: str) -> None:
    """``ragtrace.configure`` to the collector's OTLP/HTTP receiver, exporting every
    100 ms (``OTEL_BSP_SCHEDULE_DELAY`` must be set by the caller's fixture)."""
    assert os.environ.get("OTEL_BSP_SCHEDULE_DELAY") == "100"
    ragtrace.configure(service_name=SERVICE, endpoint=http_base_url, protocol="http/protobuf")


# ------------------------------------------------------------------ collectors
class CollectorProcess:
    """``ragtrace-collector serve --config FILE`` on free loopback ports."""

    def __init__(self, workdir: Path, data: dict[str, Any]) -> None:
        self.workdir = workdir
        self.http_port, self.grpc_port, self.admin_port = free_port(), free_port(), free_port()
        data = json.loads(json.dumps(data))
        data["receivers"]["http"]["endpoint"] = f"127.0.0.1:{self.http_port}"
        data["receivers"]["grpc"]["endpoint"] = f"127.0.0.1:{self.grpc_port}"
        data["admin"]["endpoint"] = f"127.0.0.1:{self.admin_port}"
        parse_config(data, env={})  # a broken test config fails here, readably
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "collector.yaml"
        self.config_path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        self.log_path = workdir / "collector.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [str(COLLECTOR_BIN), "serve", "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def http_base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def admin_address(self) -> str:
        return f"127.0.0.1:{self.admin_port}"

    def log_lines(self) -> list[dict[str, Any]]:
        """The collector's JSON log lines."""
        out = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the collector exited:\n{self.log_tail()}")
            try:
                status, _ = http_get(self.admin_url + "/readyz", timeout=2)
            except OSError:
                status = 0
            if status == 200:
                return
            time.sleep(0.1)
        raise AssertionError(f"the collector was not ready in {within:g}s:\n{self.log_tail()}")

    def stop(self, within: float = 30.0) -> int:
        """SIGTERM (graceful shutdown), then SIGKILL if it hangs; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(within)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        return int(self.process.returncode)


class EvalCollectorThread(CollectorThread):
    """The harness's collector thread, running the evaluation stage of its config."""

    def start(self) -> EvalCollectorThread:
        self._thread.start()

        async def _start() -> CollectorService:
            service = CollectorService(self.config)
            assert service.stage is not None, "evaluation must be enabled"
            await service.start()
            return service

        self.service = self.run(_start)
        return self

    @property
    def http_base_url(self) -> str:
        return self.http_url.removesuffix("/v1/traces")


# ---------------------------------------------------------------- webhooks
@dataclass(frozen=True)
class Hook:
    path: str
    body: Any
    at: float


class HookReceiver:
    """An aiohttp server on 127.0.0.1 that answers 200 to every POST and keeps its JSON."""

    def __init__(self) -> None:
        self.url = ""
        self.received: list[Hook] = []
        self._changed = asyncio.Condition()

    def on(self, path: str) -> list[Any]:
        return [h.body for h in self.received if h.path == path]

    async def wait_for(
        self, probe: Callable[[HookReceiver], Any], *, within: float, what: str
    ) -> Any:
        """Wait until ``probe(self)`` returns something truthy, and return it."""
        try:
            async with asyncio.timeout(within), self._changed:
                while not (found := probe(self)):
                    await self._changed.wait()
                return found
        except TimeoutError:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}") from None

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        async with self._changed:
            self.received.append(Hook(request.path, body, time.time()))
            self._changed.notify_all()
        return web.Response(text="ok")


@asynccontextmanager
async def hook_receiver() -> AsyncIterator[HookReceiver]:
    receiver = HookReceiver()
    app = web.Application()
    app.router.add_post("/{tail:.*}", receiver._handle)
    runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    receiver.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield receiver
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ read-back
def am_alerts(url: str, alertname: str) -> list[dict[str, Any]]:
    """Alerts Alertmanager holds now (``GET /api/v2/alerts``; resolved ones are gone)."""
    found: list[dict[str, Any]] = get_json(url + "/api/v2/alerts")
    return [a for a in found if a["labels"].get("alertname") == alertname]


def prom_query(url: str, query: str) -> list[dict[str, Any]]:
    data = get_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def prom_alerts(url: str, alertname: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = get_json(f"{url}/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == alertname]


@dataclass(frozen=True)
class Exposition:
    """A ``/metrics`` page: every sample, and every declared family."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    families: dict[str, str]  # family name -> type

    def value(self, name: str, **labels: str) -> float | None:
        """The sum of the samples ``name`` whose labels include ``labels`` (None if none)."""
        want = set(labels.items())
        found = [v for (n, lbls), v in self.samples.items() if n == name and want <= set(lbls)]
        return sum(found) if found else None

    @property
    def sample_names(self) -> set[str]:
        return {name for name, _ in self.samples}


def scrape(admin_url: str) -> Exposition:
    status, body = http_get(admin_url + "/metrics")
    assert status == 200, body
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    families: dict[str, str] = {}
    for family in text_string_to_metric_families(body.decode("utf-8")):
        families[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return Exposition(samples, families)


def rag_span(sink: OtlpSink, trace_id: str) -> ReceivedSpan | None:
    """The (evaluated) ``@rag`` span of a trace, as the backend received it."""
    for span in sink.spans:
        if (
            span.span.trace_id.hex() == trace_id
            and span.attributes.get(semconv.RAGTRACE_SPAN_KIND) == semconv.KIND_RAG
        ):
            return span
    return None


# ------------------------------------------------------ segment traffic (raw OTLP)
SEGMENT_SERVICE = "shop"


class ReleaseSender:
    """Posts one trace at a time over OTLP/HTTP to ``url`` (the collector's
    ``/v1/traces``) for :data:`SEGMENT_SERVICE`, alternating index ``v1`` (release
    ``1.0``) and index ``v2`` (release ``2.0``), ``rate`` traces a second each, from a
    thread.  The index version is an attribute of the retriever span, the release one
    of the resource.  ``broken`` makes v2's retrieval miss (ID recall mostly 0 instead
    of 1.0 or 0.5); ``rolled_back`` stops v2's traffic (a rollback).  ``last_sent``
    keeps, per index version, the wall time its last post was answered."""

    def __init__(self, url: str, *, rate: float = 12.0, seed: int = 22) -> None:
        self.url = url
        self.broken = False
        self.rolled_back = False
        self.sent: dict[str, str] = {}  # trace id hex -> index version
        self.last_sent: dict[str, float] = {}
        self._period = 1.0 / (2 * rate)
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="release-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop, and re-raise what went wrong in the thread."""
        self._stop.set()
        self._thread.join(30)
        if self._error is not None:
            raise AssertionError("the sender thread failed") from self._error

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for index, release in (("v1", "1.0"), ("v2", "2.0")):
                    if not (index == "v2" and self.rolled_back):
                        self._post(index, release)
                    self._stop.wait(self._period)
        except BaseException as exc:
            self._error = exc

    def _post(self, index: str, release: str) -> None:
        tid = os.urandom(16)
        bad = index == "v2" and self.broken
        # ID recall against 2 reference ids: 1.0 or 0.5 when healthy, mostly 0 when broken.
        if bad:
            docs = ["doc_9"] if self._rng.random() < 0.8 else ["doc_1"]
        else:
            docs = ["doc_1", "doc_2"] if self._rng.random() < 0.8 else ["doc_1"]
        attrs = {
            semconv.INPUT_VALUE: "How do I reset my password?",
            semconv.OUTPUT_VALUE: "answer",
            semconv.REFERENCE_CONTEXT_IDS: json.dumps(["doc_1", "doc_2"]),
        }
        rag = make_span(tid, "rag", attrs=attrs)
        retriever = make_span(tid, "retriever", parent=rag, docs=[(d, f"text {d}") for d in docs])
        set_attributes(retriever.attributes, [("app.index_version", index)])
        request = ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        set_attributes(
            rs.resource.attributes,
            [("service.name", SEGMENT_SERVICE), ("service.version", release)],
        )
        rs.scope_spans.add().spans.extend([rag, retriever])
        post = urllib.request.Request(
            self.url,
            data=request.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
            method="POST",
        )
        with urllib.request.urlopen(post, timeout=10) as resp:
            assert resp.status == 200
        self.sent[tid.hex()] = index
        self.last_sent[index] = time.time()
