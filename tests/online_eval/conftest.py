from __future__ import annotations

from tests.fakes.redis_server import redis_server as redis_server
