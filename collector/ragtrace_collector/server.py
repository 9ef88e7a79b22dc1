"""``ragtrace-collector serve``: wire the parts, run, shut down gracefully.

Start order: admin port (``/readyz`` says not ready), exporters, pipeline, receivers;
then ready.  On SIGTERM or SIGINT:

1. not ready; receivers stop accepting (listening sockets closed; calls in progress
   finish within ``shutdown.receiver_grace``);
2. the assembler releases every buffered trace through the processor hook, and the
   processor may drain within ``shutdown.processor_timeout``;
3. every exporter delivers its queue within ``shutdown.flush_timeout``;
4. exit 0.

A configuration error is reported (key and problem) before anything listens, and
``serve`` exits 1; failing to bind a port also exits 1.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from ragtrace_collector.admin import AdminServer
from ragtrace_collector.component import ComponentHost, Supervisor
from ragtrace_collector.config import CollectorConfig, ConfigError, load_config
from ragtrace_collector.exporters import Exporter, build_exporter
from ragtrace_collector.logs import configure_logging, get_logger
from ragtrace_collector.pipeline import PassThroughProcessor, Pipeline, TraceProcessor
from ragtrace_collector.receivers.auth import BearerAuth
from ragtrace_collector.receivers.grpc import GrpcReceiver
from ragtrace_collector.receivers.http import HttpReceiver
from ragtrace_collector.stage import EvaluationStage, build_stage
from ragtrace_collector.telemetry import Telemetry

__all__ = ["CollectorService", "serve_command"]


class CollectorService:
    """One collector: receivers, pipeline, exporters, admin port.

    ``processor`` is the trace processor hook; by default the evaluation stage
    (:mod:`ragtrace_collector.stage`), or a pass-through with ``evaluation.enabled: false``.
    Tests and embedders use ``await start()`` / ``await stop()``; ``serve`` adds
    signals.
    """

    def __init__(
        self,
        config: CollectorConfig,
        *,
        processor: TraceProcessor | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.config = config
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        #: Every long-lived part registers here; health and readiness read their statuses.
        self.host = ComponentHost(self.telemetry)
        #: Runs every background task of every part: logs, counts and restarts failures.
        self.supervisor = Supervisor(self.host)
        self._log = get_logger("service")
        #: The evaluation stage, unless a processor was given or evaluation is off.
        self.stage: EvaluationStage | None = None
        if processor is None and config.evaluation.enabled:
            self.stage = build_stage(config, self.telemetry, supervisor=self.supervisor)
            processor = self.stage.processor
            self.host.register(self.stage.evaluator)
            if self.stage.pool is not None:
                self.host.register(self.stage.pool)
        elif config.alerts.rules:
            self._log.warning(
                "alerts_without_evaluation",
                detail="evaluation is off, so no scores reach the alert rules",
                rules=[r.name for r in config.alerts.rules],
            )
        self.exporters: list[Exporter[Any]] = [
            build_exporter(name, cfg, self.telemetry) for name, cfg in config.exporters.items()
        ]
        self.pipeline = Pipeline(
            assembly=config.assembly,
            exporters=self.exporters,
            processor=processor if processor is not None else PassThroughProcessor(),
            telemetry=self.telemetry,
            retry_after=config.receivers.retry_after,
        )
        auth = BearerAuth(config.receivers.auth.bearer_tokens)
        grace = config.shutdown.receiver_grace
        self.grpc_receiver = (
            GrpcReceiver(
                config.receivers.grpc,
                pipeline=self.pipeline,
                auth=auth,
                telemetry=self.telemetry,
                grace=grace,
            )
            if config.receivers.grpc.enabled
            else None
        )
        self.http_receiver = (
            HttpReceiver(
                config.receivers.http,
                pipeline=self.pipeline,
                auth=auth,
                telemetry=self.telemetry,
                grace=grace,
            )
            if config.receivers.http.enabled
            else None
        )
        self.admin = (
            AdminServer(
                config.admin, telemetry=self.telemetry, ready=self._ready, healthy=self._healthy
            )
            if config.admin.enabled
            else None
        )
        self._listening = False
        self._stopping = False
        self._started = False

    # ---------------------------------------------------------------- probes
    def _ready(self) -> tuple[bool, str]:
        if self._stopping:
            return False, "shutting down"
        if not self._listening:
            return False, "receivers not listening yet"
        return True, "receivers listening"

    def _healthy(self) -> tuple[bool, str]:
        return True, "serving"

    @property
    def ready(self) -> bool:
        return self._ready()[0]

    # -------------------------------------------------------------- addresses
    @property
    def grpc_address(self) -> tuple[str, int] | None:
        return self.grpc_receiver.address if self.grpc_receiver else None

    @property
    def http_address(self) -> tuple[str, int] | None:
        return self.http_receiver.address if self.http_receiver else None

    @property
    def admin_address(self) -> tuple[str, int] | None:
        return self.admin.address if self.admin else None

    # -------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Bind every port and start every part; on failure, undo and re-raise."""
        self._started = True
        try:
            if self.admin is not None:
                host, port = await self.admin.start()
                self._log.info("admin_listening", endpoint=f"{host}:{port}")
            await self.pipeline.start()
            if self.stage is not None:
                self.stage.start()
            if self.grpc_receiver is not None:
                host, port = await self.grpc_receiver.start()
                self._log.info(
                    "receiver_listening", receiver="otlp_grpc", endpoint=f"{host}:{port}"
                )
            if self.http_receiver is not None:
                host, port = await self.http_receiver.start()
                self._log.info(
                    "receiver_listening", receiver="otlp_http", endpoint=f"{host}:{port}"
                )
        except BaseException:
            await self._teardown_quietly()
            raise
        self._listening = True
        self._log.info(
            "collector_ready",
            exporters=[f"{e.name} ({e.kind})" for e in self.exporters],
            decision_wait_s=self.config.assembly.decision_wait,
        )

    async def stop(self) -> None:
        """Graceful shutdown: stop receiving, release, drain, flush."""
        if self._stopping:
            return
        self._stopping = True
        self._log.info("shutdown_started")
        self.pipeline.stop_accepting()
        if self.http_receiver is not None:
            await self.http_receiver.stop_listening()
        receivers = [r for r in (self.grpc_receiver, self.http_receiver) if r is not None]
        await asyncio.gather(*(r.stop() for r in receivers), return_exceptions=True)
        self._listening = False
        shutdown = self.config.shutdown
        report = await self.pipeline.shutdown(
            processor_timeout=shutdown.processor_timeout, flush_timeout=shutdown.flush_timeout
        )
        self._log.info(
            "shutdown_complete",
            traces_flushed=report.traces_flushed,
            processor_timed_out=report.processor_timed_out,
            forwarded_unprocessed=report.forwarded_unprocessed,
            spans_dropped=report.spans_dropped,
        )
        if self.stage is not None:
            await self.stage.aclose()
        if self.admin is not None:
            await self.admin.stop()

    async def _teardown_quietly(self) -> None:
        self._stopping = True
        if self.stage is not None:
            try:
                await self.stage.aclose()
            except Exception as exc:
                self._log.debug("teardown_error", error=repr(exc))
        for part in (self.http_receiver, self.grpc_receiver):
            if part is not None:
                try:
                    await part.stop()
                except Exception as exc:
                    self._log.debug("teardown_error", error=repr(exc))
        for exporter in self.exporters:
            try:
                await exporter.close(asyncio.get_running_loop().time())
            except Exception as exc:
                self._log.debug("teardown_error", error=repr(exc))
        if self.admin is not None:
            await self.admin.stop()


async def _serve(config: CollectorConfig) -> int:
    log = get_logger("service")
    try:
        service = CollectorService(config)
    except Exception as exc:  # settings that fail only when built: a reference file...
        log.error("startup_failed", error=f"{type(exc).__name__}: {exc}")
        print(f"ragtrace-collector: cannot start: {exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, sig, stop, log)
    try:
        await service.start()
    except Exception as exc:  # a port in use, an unreadable certificate...
        log.error("startup_failed", error=f"{type(exc).__name__}: {exc}")
        return 1
    await stop.wait()
    await service.stop()
    return 0


def _on_signal(sig: signal.Signals, stop: asyncio.Event, log: Any) -> None:
    if stop.is_set():
        log.warning("signal_ignored", signal=sig.name, detail="shutdown already in progress")
        return
    log.info("signal_received", signal=sig.name)
    stop.set()


def serve_command(config_path: Path | None) -> int:
    """``ragtrace-collector serve [--config FILE]``; returns the exit code."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    configure_logging(config.logging.level, config.logging.format, secrets=config.secrets())
    try:
        return asyncio.run(_serve(config))
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130
