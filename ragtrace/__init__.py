"""ragtrace SDK: record RAG requests, retrievals and conversation turns as OTel spans.

```python
import ragtrace

ragtrace.configure(service_name="support-bot", endpoint="http://collector:4318")

@ragtrace.retriever
def search(query: str) -> list[dict]: ...

@ragtrace.rag
def answer(question: str) -> str: ...

with ragtrace.session("conv-42", user_id="u-7"):
    answer("How do I reset my password?")

# inside answer(): handle = ragtrace.current_request(); later, from anywhere:
ragtrace.feedback(handle, False, comment="Wrong article")
```

Attribute names: :mod:`ragtrace.semconv`.
"""

from __future__ import annotations

from ragtrace import semconv
from ragtrace._config import ConfigurationError, configure, flush, shutdown, stats
from ragtrace._export import ExportStats
from ragtrace._feedback import RequestHandle, current_request, feedback
from ragtrace._instrument import generator, rag, reranker, retriever
from ragtrace._reference import set_reference
from ragtrace._session import Session, session
from ragtrace._version import __version__

__all__ = [
    "ConfigurationError",
    "ExportStats",
    "RequestHandle",
    "Session",
    "__version__",
    "configure",
    "current_request",
    "feedback",
    "flush",
    "generator",
    "rag",
    "reranker",
    "retriever",
    "semconv",
    "session",
    "set_reference",
    "shutdown",
    "stats",
]
