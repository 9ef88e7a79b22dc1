"""Listening ports, explained to people: which key of the config a port comes from,
why it cannot be bound, and what to do about it.

:func:`port_problems` tries each endpoint before anything starts (bind, then close at
once; ``SO_REUSEADDR`` as the servers use it), so that a port in use is reported with
its config key and command-line flag instead of an ``OSError`` or gRPC's own C++ log
line.  :func:`bind_problem` words a failure the servers still hit afterwards (another
process may take the port in between).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from ragtrace_collector.configbase import split_host_port

__all__ = ["Endpoint", "StartupError", "bind_problem", "port_problems"]


class StartupError(Exception):
    """The collector cannot start; the message is for people (one line per problem)."""


@dataclass(frozen=True)
class Endpoint:
    """One listening endpoint: where it comes from and how to change it."""

    key: str  # the config key, e.g. "receivers.grpc.endpoint"
    flag: str  # the serve flag that overrides it, e.g. "--grpc-endpoint"
    endpoint: str  # host:port


def bind_problem(where: Endpoint, exc: BaseException) -> str:
    """A port that cannot be bound, with its key and the fix."""
    host, port = split_host_port(where.endpoint)
    change = (
        f"set {where.key} in the config to a free host:port, or pass "
        f"{where.flag} HOST:PORT to serve"
    )
    code = getattr(exc, "errno", None)
    if code == errno.EADDRINUSE or "in use" in str(exc).lower():
        return (
            f"{where.key}: port {port} ({where.endpoint}) is already in use by another "
            f"process; stop that process (e.g. another collector), or {change}"
        )
    if code == errno.EACCES:
        return (
            f"{where.key}: not allowed to listen on port {port} ({where.endpoint}); ports "
            f"below 1024 need privileges: {change}"
        )
    if code in (errno.EADDRNOTAVAIL, socket.EAI_NONAME) or isinstance(exc, socket.gaierror):
        return (
            f"{where.key}: {host!r} is not an address of this machine ({where.endpoint}); "
            f"use 127.0.0.1, 0.0.0.0 (every interface) or one of its addresses: {change}"
        )
    return f"{where.key}: cannot listen on {where.endpoint}: {exc}; {change}"


def _try_bind(endpoint: str) -> None:
    host, port = split_host_port(endpoint)
    if port == 0:
        return  # the system picks a free port
    for family, kind, proto, _name, address in socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)


def port_problems(endpoints: list[Endpoint]) -> list[str]:
    """A problem for each endpoint that cannot be bound now (and for two endpoints that
    share a port), every one of them."""
    problems = []
    seen: dict[int, Endpoint] = {}
    for where in endpoints:
        port = split_host_port(where.endpoint)[1]
        if port and port in seen:
            problems.append(
                f"{where.key}: port {port} is also {seen[port].key}; give each its own port"
            )
            continue
        seen[port] = where
        try:
            _try_bind(where.endpoint)
        except OSError as exc:
            problems.append(bind_problem(where, exc))
    return problems
