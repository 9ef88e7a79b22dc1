"""``POST /v1/feedback``: throughput on one core, and ``/healthz`` during a flood.

The real ``ragtrace-collector serve`` runs in its own process pinned to one core
(``sched_setaffinity``), with the write-ahead log on (``storage.directory``, fsync
``batch``: a 202 means the feedback span is synced, as a 200 to OTLP means the request
is) and a file exporter; evaluation is off (feedback needs no judge).  The load
generator (aiohttp, ``--connections`` keep-alive connections) and the ``/healthz``
prober (a new connection every 10 ms, as a kubelet does) run in this process on the
other core(s).

Measured in the same run, against the same collector:

1. **Throughput**, for ``--seconds`` each, with ``feedback.rate`` far above what is
   reachable (so the bound does not cut it): requests per second of

   * the baseline, ``POST /v1/traces`` with one span (protobuf): the very feedback
     span the endpoint would make, as the SDK's ``ragtrace.feedback()`` sends it, so
     the rest of the pipeline (log, assembly, join, file export) costs the same, and
   * ``POST /v1/feedback`` with a JSON body (trace id, span id, value, comment, user,
     service), different feedback each time;

   reported with their ratio.
2. **A flood**: a second collector with the default ``feedback.rate`` (200 per
   second), hammered by the same load for ``--seconds``; ``/healthz`` latency (p50,
   p99) during that flood against ``/healthz`` during the OTLP baseline load, with the
   share of feedback answered 429 and the collector's resident memory before and after
   (``VmRSS``).

Run: ``.venv/bin/python benchmarks/feedback_http.py`` (``--seconds 3
--connections 16`` by default; every loop is bounded in time and count).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))

from ragtrace_collector.feedback.ingest import feedback_request, parse_feedback  # noqa: E402
from tests.e2e._support import Serve  # noqa: E402
from tests.fakes.hostile import Timed, percentile, probe_for  # noqa: E402
from tests.fakes.otlp_data import make_request, make_span, new_trace_id  # noqa: E402

#: Most requests one phase sends, whatever the time bound.
_MAX_REQUESTS = 200_000


def _cpus() -> tuple[set[int], set[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(cpus), set(cpus)
    return {cpus[0]}, set(cpus[1:])


def _collector(directory: Path, rate: float) -> Serve:
    config: dict[str, Any] = {
        "receivers": {"grpc": {"enabled": False}, "http": {"endpoint": "127.0.0.1:0"}},
        "admin": {"endpoint": "127.0.0.1:0"},
        "assembly": {"decision_wait": "100ms", "max_trace_wait": "1s"},
        "evaluation": {"enabled": False},
        "storage": {"directory": str(directory / "wal"), "fsync": "batch"},
        "exporters": {"file": {"type": "file", "path": str(directory / "spans.jsonl")}},
        "feedback": {"rate": rate},
    }
    directory.mkdir(parents=True, exist_ok=True)
    return Serve(config, directory)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _feedback_bodies(n: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "trace_id": os.urandom(16).hex(),
                "span_id": os.urandom(8).hex(),
                "value": i % 2 == 0,
                "comment": "the answer missed the refund policy",
                "user_id": f"user-{i % 100}",
                "service": "bench",
            }
        ).encode()
        for i in range(n)
    ]


def _otlp_bodies(feedback: list[bytes]) -> list[bytes]:
    """The same feedback as one-span OTLP requests (protobuf): what the SDK's
    ``ragtrace.feedback()`` sends, so both paths carry the very same span."""
    return [feedback_request(parse_feedback(body))[1] for body in feedback]


async def _load(
    url: str, bodies: list[bytes], content_type: str, seconds: float, connections: int
) -> tuple[float, Counter[int]]:
    """Send ``bodies`` round-robin on ``connections`` connections for ``seconds``
    (at most :data:`_MAX_REQUESTS`); (requests per second, answers by status)."""
    import aiohttp

    statuses: Counter[int] = Counter()
    sent = 0
    deadline = time.perf_counter() + seconds
    headers = {"Content-Type": content_type}
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(offset: int) -> None:
            nonlocal sent
            i = offset
            while time.perf_counter() < deadline and sent < _MAX_REQUESTS:
                sent += 1
                body = bodies[i % len(bodies)]
                i += connections
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        await resp.read()
                        statuses[resp.status] += 1
                except aiohttp.ClientError:
                    statuses[0] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(connections)))
        elapsed = time.perf_counter() - started
    return sum(statuses.values()) / elapsed, statuses


def _probed(healthz: str, run: Any) -> tuple[tuple[float, Counter[int]], list[Timed]]:
    """Run the coroutine ``run`` while ``/healthz`` is probed every 10 ms."""
    stop = threading.Event()
    probes: list[Timed] = []
    prober = threading.Thread(target=lambda: probes.extend(probe_for(healthz, stop)))
    prober.start()
    try:
        result = asyncio.run(run)
    finally:
        stop.set()
        prober.join(timeout=30)
    return result, probes


def _ms(probes: list[Timed], q: float) -> float:
    return 1000 * percentile([p.seconds for p in probes], q)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    collector_cpus, load_cpus = _cpus()
    os.sched_setaffinity(0, load_cpus)
    feedback = _feedback_bodies(2000)
    otlp = _otlp_bodies(_feedback_bodies(2000))  # other feedback, the same shape
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # 1. throughput, the rate bound out of reach
        unbounded = _collector(Path(tmp) / "a", rate=1e9)
        try:
            os.sched_setaffinity(unbounded.proc.pid, collector_cpus)
            base = unbounded.http_url
            healthz = f"http://{unbounded.endpoints['admin']}/healthz"
            warm = [make_request([make_span(new_trace_id())]).SerializeToString()] * 50
            asyncio.run(_load(f"{base}/v1/traces", warm, "application/x-protobuf", 0.5, 4))
            (otlp_rps, otlp_status), otlp_probes = _probed(
                healthz,
                _load(
                    f"{base}/v1/traces",
                    otlp,
                    "application/x-protobuf",
                    args.seconds,
                    args.connections,
                ),
            )
            fb_rps, fb_status = asyncio.run(
                _load(
                    f"{base}/v1/feedback",
                    feedback,
                    "application/json",
                    args.seconds,
                    args.connections,
                )
            )
        finally:
            unbounded.kill()
        rows["otlp_one_span_rps"] = round(otlp_rps)
        rows["otlp_statuses"] = dict(otlp_status)
        rows["feedback_rps"] = round(fb_rps)
        rows["feedback_statuses"] = dict(fb_status)
        rows["feedback_vs_otlp"] = round(fb_rps / otlp_rps, 2)
        # 2. a flood against the default rate bound
        bounded = _collector(Path(tmp) / "b", rate=200.0)
        try:
            os.sched_setaffinity(bounded.proc.pid, collector_cpus)
            rss_before = _rss_kib(bounded.proc.pid)
            healthz = f"http://{bounded.endpoints['admin']}/healthz"
            (flood_rps, flood_status), flood_probes = _probed(
                healthz,
                _load(
                    f"{bounded.http_url}/v1/feedback",
                    feedback,
                    "application/json",
                    args.seconds,
                    args.connections,
                ),
            )
            rss_after = _rss_kib(bounded.proc.pid)
        finally:
            bounded.kill()
        total = sum(flood_status.values())
        rows["flood_rps"] = round(flood_rps)
        rows["flood_statuses"] = dict(flood_status)
        rows["flood_refused_429_share"] = round(flood_status[429] / total, 3) if total else 0
        rows["flood_rss_kib_before_after"] = [rss_before, rss_after]
        rows["healthz_ms_otlp_load_p50_p99"] = [
            round(_ms(otlp_probes, 0.5), 1),
            round(_ms(otlp_probes, 0.99), 1),
        ]
        rows["healthz_ms_feedback_flood_p50_p99"] = [
            round(_ms(flood_probes, 0.5), 1),
            round(_ms(flood_probes, 0.99), 1),
        ]
        rows["healthz_p99_flood_vs_otlp_load"] = round(
            _ms(flood_probes, 0.99) / _ms(otlp_probes, 0.99), 2
        )
        rows["probes"] = [len(otlp_probes), len(flood_probes)]
    rows["collector_cpus"] = sorted(collector_cpus)
    rows["seconds"] = args.seconds
    rows["connections"] = args.connections
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
