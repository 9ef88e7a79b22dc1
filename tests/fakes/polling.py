"""Waiting, inside a test's event loop, for state that offers no event to await."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["eventually"]


async def eventually(predicate: Callable[[], object], *, within_s: float = 15.0) -> None:
    """Poll ``predicate`` every 20 ms until it is true; AssertionError after ``within_s``."""
    for _ in range(max(1, round(within_s / 0.02))):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {within_s} s")
