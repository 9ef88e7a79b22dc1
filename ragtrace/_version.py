"""The SDK version (one place; ``ragtrace.__version__`` re-exports it)."""

from __future__ import annotations

__version__ = "0.1.0"
