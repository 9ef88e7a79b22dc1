"""ragtrace collector: OTLP in, evaluated and enriched OTLP out.

The packages follow the path of a span::

    receivers/    1. receive OTLP/gRPC and OTLP/HTTP (auth, TLS, decoding off the loop)
    storage/      2. store each accepted request in the write-ahead log
    assembly/     3. assemble spans into traces
    evaluation/   4. sample  5. build cases  6. run the metrics  7. enrich the spans
    exporters/    8. export to the tracing backend (OTLP, Phoenix, file)

and what they use: ``conventions/`` (how instrumentors' spans map to cases),
``metrics/`` (the metric suite), ``judges/`` (LLM and offline), ``stores/`` (session
and reference), ``alerts/`` (drop detector), ``otlp/`` (wire code), ``service/`` (the
process: server, pipeline, components and health, admin, telemetry, logs) and
``offline/`` (``ragtrace-collector eval`` and the Python and pytest APIs over datasets).
``config.py`` composes the sections each package defines in its own ``config.py``.
"""

from __future__ import annotations

import os

# litellm fetches its model cost map at import unless told not to; the collector
# must never reach for the network on its own.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
