"""Fixtures for the alert tests: a scriptable HTTP receiver on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    at: float


@dataclass
class Receiver:
    """An aiohttp server on 127.0.0.1 that records every POST and answers with the
    scripted ``(status, headers, delay)`` replies in order (then 200)."""

    url: str = ""
    replies: list[tuple[int, dict[str, str], float]] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def script(
        self, *statuses: int, headers: dict[str, str] | None = None, delay: float = 0.0
    ) -> None:
        for status in statuses:
            self.replies.append((status, headers or {}, delay))

    async def wait_for(self, count: int, within: float = 30.0) -> list[Received]:
        async with asyncio.timeout(within):
            while len(self.received) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.received

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.received.append(Received(request.path, dict(request.headers), body, time.monotonic()))
        self.arrived.set()
        status, headers, delay = self.replies.pop(0) if self.replies else (200, {}, 0.0)
        if delay:
            await asyncio.sleep(delay)
        return web.Response(status=status, headers=headers, text=f"status {status}")


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/{tail:.*}", rec._handle)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    rec.url = f"http://127.0.0.1:{port}"
    try:
        yield rec
    finally:
        await runner.cleanup()
