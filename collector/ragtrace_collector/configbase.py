"""What every section of the configuration shares: strict models (unknown keys are
errors), durations and sizes with units, ``host:port`` endpoints and files that must
exist.  Each component's own section lives next to its code (``receivers/config.py``,
``exporters/config.py``, ...); :mod:`ragtrace_collector.config` composes them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ragtrace_collector.units import parse_duration, parse_size

__all__ = [
    "ByteSize",
    "Duration",
    "ListenEndpoint",
    "StrictModel",
    "check_file",
    "check_listen_endpoint",
    "check_one_auth_source",
    "split_host_port",
]


#: Seconds, from a number or a string such as ``"250ms"``, ``"2s"`` or ``"1h30m"``.
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


#: Bytes, from a number or a string such as ``"16MiB"``.
ByteSize = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]


def split_host_port(endpoint: str) -> tuple[str, int]:
    """``"127.0.0.1:4317"`` -> ``("127.0.0.1", 4317)``; ``"[::1]:4317"`` works too."""
    host, sep, port_text = endpoint.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{endpoint!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{endpoint!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{endpoint!r}: port {port} is out of range 0-65535")
    return host, port


def check_listen_endpoint(value: str) -> str:
    split_host_port(value)
    return value


#: ``host:port`` a listener binds, checked by :func:`check_listen_endpoint` (a YAML
#: number such as ``4317`` is read as text first, to be refused with its own message).
ListenEndpoint = Annotated[str, BeforeValidator(str), AfterValidator(check_listen_endpoint)]


def check_file(path: Path | None) -> Path | None:
    if path is not None and not path.is_file():
        raise ValueError(f"file not found: {path}")
    return path


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def check_one_auth_source(url: str, headers: Mapping[str, str]) -> None:
    """Credentials in the URL (``https://user:pass@host``) and an ``Authorization``
    header cannot both be sent: refuse the combination when the config is read rather
    than fail every request."""
    if urlsplit(url).username is not None and any(k.lower() == "authorization" for k in headers):
        raise ValueError(
            "credentials in the URL and an Authorization header cannot be used together; "
            "keep one of them"
        )
