"""One small module per instrumentation convention, each mapping spans to what a case
needs (:class:`~ragtrace_collector.conventions.base.Convention`):

* :mod:`.ragtrace`: ragtrace's own decorators (``ragtrace.span.kind``);
* :mod:`.openinference`: OpenInference (LangChain, LlamaIndex, ... instrumentors);
* :mod:`.genai`: the OpenTelemetry GenAI semantic conventions;
* :mod:`.openllmetry`: OpenLLMetry / Traceloop;
* :mod:`.mlflow`: MLflow tracing (``mlflow.spanType``), exported over OTLP;
* :mod:`.langfuse`: Langfuse's OTel-based Python SDK (``langfuse.observation.type``).

:data:`CONVENTIONS` lists them in the order they are asked: the first that claims a
span decides its role and is read first for its question and answer.
"""

from __future__ import annotations

from typing import Final

from ragtrace_collector.conventions import (
    genai,
    langfuse,
    mlflow,
    openinference,
    openllmetry,
    ragtrace,
)
from ragtrace_collector.conventions.base import Convention, Document, Role

__all__ = ["CONVENTIONS", "Convention", "Document", "Role", "by_name"]

CONVENTIONS: Final[tuple[Convention, ...]] = (
    ragtrace,
    openinference,
    genai,
    openllmetry,
    mlflow,
    langfuse,
)


def by_name(names: list[str] | tuple[str, ...]) -> tuple[Convention, ...]:
    """The conventions called ``names``, in :data:`CONVENTIONS` order."""
    wanted = set(names)
    return tuple(c for c in CONVENTIONS if c.name in wanted)
