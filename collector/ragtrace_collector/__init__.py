"""ragtrace collector: OTLP in, evaluated and enriched OTLP out."""

from __future__ import annotations

import os

# litellm fetches its model cost map at import unless told not to; the collector
# must never reach for the network on its own.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
