"""The ragtrace end-to-end demo: ``bash scripts/demo.sh`` (``python -m examples.demo``).

A real collector subprocess scores the example support bot's traffic with the offline
judge; the bot's retrieval breaks half-way; the collector's drop detector fires and
posts to a webhook the demo runs; the demo then reads the scores back from the
enriched spans and shows them before and after the fault.  See :mod:`examples.demo.cli`.
"""

from __future__ import annotations

from examples.demo.cli import main

__all__ = ["main"]
