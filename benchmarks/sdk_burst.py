"""SDK burst: are spans lost when an app makes calls as fast as it can?

One run, two variants, each in its own fresh process against the same loopback OTLP/HTTP
sink (a separate process, so it never competes for the app's interpreter lock):

1. **raw OTel** with its defaults: ``TracerProvider`` + ``BatchSpanProcessor`` (queue of
   2048 spans) + the OTLP/HTTP exporter (the baseline);
2. **ragtrace** with its defaults: ``ragtrace.configure(endpoint=...)``.

Each process makes ``--calls`` two-span calls (a ``@rag`` call that calls a ``@retriever``
returning 5 documents of ~200 characters: the workload of ``sdk_overhead.py``, raw OTel
setting the same attributes by hand) in a tight loop, then flushes, and reports spans
created, the flush result, and its peak resident memory above what it held just before
the burst.  The sink counts the spans it received.

Targets (ragtrace): 0 spans lost; peak extra RSS <= 128 MiB; ``flush()`` says True only
when nothing was lost.

Run: ``.venv/bin/python benchmarks/sdk_burst.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

_TARGET_EXTRA_RSS_MIB = 128.0


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# ============================================================================ child
def _child(variant: str, endpoint: str, calls: int) -> dict[str, Any]:
    import sdk_overhead  # the shared workload: documents, question, raw-OTel twin

    import ragtrace

    if variant == "raw":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))
        )
        call = sdk_overhead._make_raw(provider)

        def flush() -> bool:
            return bool(provider.force_flush(30_000))

        def stats() -> dict[str, Any]:
            return {}
    else:
        ragtrace.configure(endpoint=endpoint, service_name="burst")
        call = sdk_overhead.traced_answer

        def flush() -> bool:
            return ragtrace.flush(timeout=30.0)

        def stats() -> dict[str, Any]:
            return ragtrace.stats().as_dict()

    question = sdk_overhead._QUESTION
    before = _rss_kib()
    t0 = time.perf_counter()
    for _ in range(calls):
        call(question)
    made = time.perf_counter() - t0
    flushed = flush()
    total = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "variant": variant,
        "spans_created": 2 * calls,
        "flush_ok": flushed,
        "burst_s": round(made, 3),
        "until_flushed_s": round(total, 3),
        "extra_rss_mib": round(max(0, peak - before) / 1024, 1),
        "stats": stats(),
    }


# ============================================================================ main
def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _get(url: str, method: str = "GET") -> dict[str, Any]:
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def _settled_count(stats_url: str, quiet_for: float = 1.0, limit: float = 60.0) -> int:
    """The sink's span count once it has stopped moving."""
    deadline = time.monotonic() + limit
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = int(_get(stats_url)["spans"])
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_for:
            break
        time.sleep(0.1)
    return last


def _run_variant(variant: str, endpoint: str, sink_stats: int, calls: int) -> dict[str, Any]:
    _get(f"http://127.0.0.1:{sink_stats}/reset", method="POST")
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--role",
            "child",
            "--variant",
            variant,
            "--endpoint",
            endpoint,
            "--calls",
            str(calls),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "OTEL_SDK_DISABLED": "false"},
    )
    result = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    result["spans_received"] = _settled_count(f"http://127.0.0.1:{sink_stats}/stats")
    result["spans_lost"] = result["spans_created"] - result["spans_received"]
    result["warnings"] = [ln for ln in out.stderr.splitlines() if ln.strip()][:6]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["main", "child"], default="main")
    parser.add_argument("--variant", choices=["raw", "ragtrace"], default="ragtrace")
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--calls", type=int, default=20_000, help="two-span calls per burst")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if args.role == "child":
        print(json.dumps(_child(args.variant, args.endpoint, args.calls)))
        return 0

    grpc_port, http_port, stats_port = _free_ports(3)
    sink = subprocess.Popen(
        [
            sys.executable,
            str(_HERE / "collector_throughput.py"),
            "--role",
            "sink",
            "--sink-ports",
            f"{grpc_port},{http_port},{stats_port}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout is not None
    sink.stdout.readline()
    endpoint = f"http://127.0.0.1:{http_port}"
    try:
        rows = [_run_variant(v, endpoint, stats_port, args.calls) for v in ("raw", "ragtrace")]
    finally:
        sink.terminate()
        sink.wait(10)
    if args.json:
        print(json.dumps(rows, indent=2))
    _report(rows, args.calls)
    ours = rows[1]
    ok = ours["spans_lost"] == 0 and ours["extra_rss_mib"] <= _TARGET_EXTRA_RSS_MIB
    return 0 if ok else 1


def _report(rows: list[dict[str, Any]], calls: int) -> None:
    print(f"\nSDK burst: {calls} two-span calls as fast as possible, then flush()")
    header = (
        f"{'variant':<10} {'created':>8} {'received':>9} {'lost':>7} {'lost %':>7} "
        f"{'flush()':>7} {'burst s':>8} {'+flush s':>8} {'peak +RSS MiB':>14}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        pct = 100.0 * r["spans_lost"] / r["spans_created"]
        print(
            f"{r['variant']:<10} {r['spans_created']:>8} {r['spans_received']:>9} "
            f"{r['spans_lost']:>7} {pct:>6.1f}% {r['flush_ok']!s:>7} {r['burst_s']:>8.2f} "
            f"{r['until_flushed_s']:>8.2f} {r['extra_rss_mib']:>14.1f}"
        )
    raw, ours = rows
    print(
        f"\nlost: ragtrace {ours['spans_lost']} vs raw OTel {raw['spans_lost']}; "
        f"ragtrace burst time / raw = {ours['burst_s'] / max(raw['burst_s'], 1e-9):.2f}"
    )
    print(
        f"targets: 0 lost (ragtrace: {ours['spans_lost']}), peak extra RSS <= "
        f"{_TARGET_EXTRA_RSS_MIB:.0f} MiB (ragtrace: {ours['extra_rss_mib']:.1f})"
    )
    if ours.get("stats"):
        print(f"ragtrace.stats(): {json.dumps(ours['stats'])}")
    for r in rows:
        for line in r["warnings"]:
            print(f"  [{r['variant']} stderr] {line[:160]}")


if __name__ == "__main__":
    sys.exit(main())
