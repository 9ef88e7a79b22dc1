"""ragtrace SDK: record RAG requests, retrievals and conversation turns as OTel spans."""

from __future__ import annotations

__version__ = "0.1.0"
