"""Exporters: OTLP/gRPC, OTLP/HTTP, OTLP/JSON file and Phoenix, each with its own queue.

* :mod:`.config`: the ``exporters`` section (one entry per exporter, its kind by ``type``);
* :mod:`.factory`: :func:`build_exporter`, the exporter for one entry;
* :mod:`.base`: what every exporter shares: the bounded queue, batching, retries with
  backoff, encoding off the event loop, and delivery acknowledgements to storage;
* :mod:`.otlp_http`, :mod:`.otlp_grpc`, :mod:`.file`, :mod:`.phoenix`: the kinds.

The names below load their modules on first use, so that reading the configuration
(``check-config``, ``--help``) does not import the exporters themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragtrace_collector.exporters.base import Exporter, ExportError
    from ragtrace_collector.exporters.factory import build_exporter

__all__ = ["ExportError", "Exporter", "build_exporter"]


def __getattr__(name: str) -> Any:
    if name == "build_exporter":
        from ragtrace_collector.exporters.factory import build_exporter

        return build_exporter
    if name in ("Exporter", "ExportError"):
        from ragtrace_collector.exporters import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
