"""Admin HTTP port: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz``.

``/readyz`` answers 200 only while every enabled receiver listens and the collector
is not shutting down; otherwise 503 with the reason.  ``/healthz`` answers 200 while
the process serves (its event loop is alive), 503 if a pipeline task died.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ragtrace_collector.config import AdminConfig, split_host_port
from ragtrace_collector.telemetry import CONTENT_TYPE_LATEST, Telemetry

__all__ = ["AdminServer"]

#: Returns (ok, reason).
Probe = Callable[[], tuple[bool, str]]


class AdminServer:
    def __init__(
        self, config: AdminConfig, *, telemetry: Telemetry, ready: Probe, healthy: Probe
    ) -> None:
        self._config = config
        self._telemetry = telemetry
        self._ready = ready
        self._healthy = healthy
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._probe(self._healthy))
        app.router.add_get("/readyz", self._probe(self._ready))
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

    @staticmethod
    def _probe(check: Probe) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            ok, reason = check()
            return web.json_response(
                {"status": "ok" if ok else "unavailable", "reason": reason},
                status=200 if ok else 503,
            )

        return handler
