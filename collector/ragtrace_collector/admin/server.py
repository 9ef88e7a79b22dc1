"""Admin HTTP port: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz``.

Both probes answer from the components' reported statuses
(:class:`~ragtrace_collector.component.ComponentHost`), never from a constant:

* ``/healthz`` (liveness) is 503 when a component is in ``permanent_error``, or has
  been in ``recoverable_error`` longer than ``admin.unhealthy_after``: restarting
  the process is then a reasonable next step.
* ``/readyz`` (readiness) is 503 when the process cannot accept data: receivers not
  listening yet, shutting down, a component not running, or the pipeline refusing
  requests.

  - A component is not running while its status is ``starting``, ``stopping`` or
    ``stopped``; the reason names each one (``evaluation:workers: starting``).  Every
    component leaves ``starting`` by the end of its start, so a collector that has
    started is not held back by a part that merely has no work yet.
  - ``recoverable_error`` and ``permanent_error`` do not make ``/readyz`` 503 by
    themselves: a reference store waiting for its file or an exporter whose backend
    is down still lets the process take data (exporters queue it, the write-ahead
    log keeps it).  Failures are ``/healthz``'s question; the ready reason still
    names the components that are not ``ok``.  Answering 503 for an outage every
    replica shares would take them all out of the load balancer at once.
  - The refusal is the very predicate the receivers' admission reads
    (``Pipeline.refusal``, which asks the write-ahead log through
    ``Storage.refusal``): an exporter queue full, the processor holding its limit, the
    log full, its writes failing (disk full), its writer stalled or stopped.  Load
    balancers are never told "ready" while data is refused, whatever caused it.

Neither probe's reason calls a component healthy unless its status is ``ok``.

``/feedback`` (when feedback is on) is the feedback join's report: the windows and
bounds, the counts, and per (service, metric, feedback name) series the AUROC with its
interval, Cohen's kappa at the threshold and the pairs behind them, ranked
(``docs/feedback.md``).  404 when feedback is off.

The JSON body of both, redacted like the logs, is ``{"status": "ok"|"unavailable",
"reason": ..., "components": {name: {"status", "last_error", "since_s",
"timestamp"}}}``.  The probes are answered on the event loop from in-memory state
only, so they stay fast while parts fail.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ragtrace_collector.admin.config import AdminConfig
from ragtrace_collector.component.logs import redact
from ragtrace_collector.component.telemetry import CONTENT_TYPE_LATEST, Telemetry
from ragtrace_collector.configbase import split_host_port

__all__ = ["AdminServer", "Probe"]

#: Returns (ok, reason).
Probe = Callable[[], tuple[bool, str]]
#: Returns every component's status (``ComponentHost.snapshot``).
Snapshot = Callable[[], dict[str, dict[str, Any]]]
#: Returns a JSON-able report (``FeedbackStage.report``).
Report = Callable[[], dict[str, Any]]


class AdminServer:
    def __init__(
        self,
        config: AdminConfig,
        *,
        telemetry: Telemetry,
        ready: Probe,
        healthy: Probe,
        components: Snapshot | None = None,
        feedback: Report | None = None,
    ) -> None:
        self._config = config
        self._telemetry = telemetry
        self._ready = ready
        self._healthy = healthy
        self._components = components
        self._feedback = feedback
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._probe(self._healthy))
        app.router.add_get("/readyz", self._probe(self._ready))
        if self._feedback is not None:
            app.router.add_get("/feedback", self._feedback_report)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        host, port = split_host_port(self._config.endpoint)
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        sockname = runner.addresses[0]
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self._telemetry.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _feedback_report(self, request: web.Request) -> web.Response:
        assert self._feedback is not None
        return web.json_response(self._feedback())

    def _probe(self, check: Probe) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            ok, reason = check()
            body: dict[str, Any] = {"status": "ok" if ok else "unavailable", "reason": reason}
            if self._components is not None:
                body["components"] = self._components()
            # Errors may quote a URL with credentials: the same redaction as the logs.
            return web.json_response(redact(body), status=200 if ok else 503)

        return handler
