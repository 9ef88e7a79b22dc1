"""Fixtures of the online-evaluation building blocks' tests."""

from __future__ import annotations

from tests.fakes.redis_server import redis_server as redis_server
