"""Free loopback ports for servers a test starts on a port chosen in advance.

``bind(("127.0.0.1", 0))`` then close hands out a port from the kernel's ephemeral
range: the very range the kernel also gives to every outgoing connection and every
other ``bind(0)`` on the machine, including the other pytest-xdist workers'.  A port
probed free that way can be taken again before the child process binds it.

:func:`free_port` instead takes ports below the ephemeral range (which the kernel
never hands out on its own), from a slice of its own for each xdist worker, in turn
from a random start (so that two test runs on one machine do not walk in step), and
only a port that it can bind right now.  A start that still loses a port (to another
program using fixed ports) is retried by the callers that can (``tests.fakes.services``,
``tests.fakes.redis_server``).
"""

from __future__ import annotations

import os
import random
import socket
import threading

__all__ = ["free_port", "port_is_free"]

_LOWEST = 10_000
_FALLBACK_EPHEMERAL_START = 32_768
_lock = threading.Lock()
_next: int | None = None


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_START


def _worker() -> tuple[int, int]:
    """(this worker's index, number of workers); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    return index % max(count, 1), max(count, 1)


def _slice() -> range | None:
    top = _ephemeral_start()
    index, count = _worker()
    size = (top - _LOWEST) // count
    if size < 100:  # an unusual ephemeral range: leave it to the kernel
        return None
    start = _LOWEST + index * size
    return range(start, start + size)


def port_is_free(port: int) -> bool:
    """Nothing is bound to loopback ``port`` now (a bind to it succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port() -> int:
    """A loopback TCP port that nothing is bound to now and that this process has not
    handed out before (until its slice wraps around)."""
    global _next
    ports = _slice()
    if ports is None:
        return _kernel_port()
    with _lock:
        if _next is None:
            _next = random.randrange(len(ports))
        for _ in range(len(ports)):
            port = ports[_next % len(ports)]
            _next += 1
            if port_is_free(port):
                return port
    return _kernel_port()
