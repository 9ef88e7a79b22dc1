"""A small webhook receiver for the collector's drop alerts, run inside the demo.

The collector's webhook notifier POSTs one JSON document per firing and per resolved
alert (``{"version": "1", "source": "ragtrace-collector", "status": ..., "rule": ...}``).
Every payload is kept in memory and appended to ``alerts.jsonl``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["AlertReceiver", "ReceivedAlert"]

_PATH = "/alerts"


@dataclass(frozen=True, slots=True)
class ReceivedAlert:
    payload: dict[str, Any]
    #: ``time.monotonic()`` at receipt
    received_at: float

    @property
    def rule(self) -> str:
        return str(self.payload.get("rule", ""))

    @property
    def firing(self) -> bool:
        return self.payload.get("status") == "firing"


class AlertReceiver:
    """``POST http://127.0.0.1:<port>/alerts`` on the demo's event loop."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.alerts: list[ReceivedAlert] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Listen on a free loopback port; returns the URL to give the collector."""
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post(_PATH, self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}{_PATH}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            payload = json.loads(await request.read())
        except ValueError as exc:
            return web.json_response({"error": f"body is not JSON: {exc}"}, status=400)
        if not isinstance(payload, dict) or "rule" not in payload or "status" not in payload:
            return web.json_response(
                {"error": "expected a JSON object with 'rule' and 'status'"}, status=400
            )
        self.alerts.append(ReceivedAlert(payload=payload, received_at=time.monotonic()))
        self._append(payload)
        return web.json_response({"status": "received"})

    def _append(self, payload: dict[str, Any]) -> None:
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(payload, sort_keys=True) + "\n")

    def first_firing(self, rule: str) -> ReceivedAlert | None:
        """The first firing notification of ``rule``, if one came."""
        return next((a for a in self.alerts if a.firing and a.rule == rule), None)
