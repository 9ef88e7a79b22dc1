"""``ragtrace-collector replay FILE... --endpoint URL``: send OTLP/JSON lines to a collector.

The input is the file exporter's format (one OTLP/JSON ``ExportTraceServiceRequest``
per line), which is also what ``shutdown.spill_path`` holds.  Each line is POSTed as
``application/json`` to ``URL/v1/traces`` (any OTLP/HTTP receiver: a ragtrace collector,
the OpenTelemetry Collector...).  Back-pressure answers (429, 503) are retried after the
delay the server asks for; any other failure stops the replay and names the line, so
that it can be resumed with ``--skip``.  Lines are sent as they are: the receiver
validates them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

__all__ = ["add_arguments", "replay_command"]

_MAX_WAIT: Final = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", type=Path, nargs="+", help="OTLP/JSON lines files")
    parser.add_argument(
        "--endpoint",
        default="http://127.0.0.1:4318",
        help="OTLP/HTTP base URL; /v1/traces is added (default: %(default)s)",
    )
    parser.add_argument(
        "--token-env",
        default=None,
        metavar="VAR",
        help="environment variable holding a bearer token for the receiver",
    )
    parser.add_argument(
        "--skip", type=int, default=0, help="lines to skip at the start of the first file"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to give up retrying one line"
    )


def replay_command(args: argparse.Namespace) -> int:
    url = args.endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    headers = {"Content-Type": "application/json"}
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            print(f"replay: {args.token_env} is not set", file=sys.stderr)
            return 1
        headers["Authorization"] = f"Bearer {token}"
    lines = spans = 0
    skip = args.skip
    for path in args.files:
        try:
            fh = open(path, "rb")  # noqa: SIM115 (closed below)
        except OSError as exc:
            print(f"replay: cannot read {path}: {exc}", file=sys.stderr)
            return 1
        with fh:
            for number, line in enumerate(fh, start=1):
                if skip:
                    skip -= 1
                    continue
                if not line.strip():
                    continue
                error = _send(url, line, headers, args.timeout)
                if error is not None:
                    print(
                        f"replay: {path} line {number}: {error} ({lines} lines sent; resume "
                        f"with --skip {number - 1})",
                        file=sys.stderr,
                    )
                    return 1
                lines += 1
                spans += _span_count(line)
    print(f"replay: {lines} requests, {spans} spans sent to {url}")
    return 0


def _send(url: str, body: bytes, headers: dict[str, str], timeout: float) -> str | None:
    """POST one line, retrying back-pressure until ``timeout``; the error, or None."""
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                resp.read()
            return None
        except urllib.error.HTTPError as err:
            detail = err.read()[:300].decode("utf-8", "replace")
            if err.code not in (429, 503):
                return f"HTTP {err.code}: {detail}"
            wait = _retry_after(err.headers.get("Retry-After"))
            problem = f"HTTP {err.code} (back-pressure) for {timeout:g}s"
        except (urllib.error.URLError, OSError) as exc:
            wait, problem = 1.0, f"cannot reach {url}: {exc}"
        if time.monotonic() + wait > deadline:
            return problem
        time.sleep(wait)


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value or 1), 0.05), _MAX_WAIT)
    except ValueError:
        return 1.0


def _span_count(line: bytes) -> int:
    try:
        data = json.loads(line)
        return sum(
            len(ss.get("spans", ()))
            for rs in data.get("resourceSpans", ())
            for ss in rs.get("scopeSpans", ())
        )
    except (ValueError, AttributeError, TypeError):
        return 0
