"""A tiny RAG app instrumented with the ragtrace SDK decorators.

The knowledge base and the routing (question -> retrieved document ids) are fixed, so
every retrieval, and therefore every ID- and string-based score, is known exactly.
"""

from __future__ import annotations

from typing import Any

import ragtrace

#: Document id -> text.
KB: dict[str, str] = {
    "doc_paris": "Paris is the capital of France.",
    "doc_louvre": "The Louvre is a museum in Paris.",
    "doc_berlin": "Berlin is the capital of Germany.",
    "doc_eiffel": "The Eiffel Tower is one of the most famous landmarks in Paris.",
    "kb_reset": "To reset your password, open Settings and choose Security.",
    "kb_invoice": "Invoices are emailed on the first day of each month.",
    "kb_expiry": "Password reset links expire after 24 hours.",
    "kb_2fa": "Two-factor codes are sent by text message.",
    "kb_export": "You can export your data as CSV from the Reports page.",
}

#: Question -> retrieved document ids, in rank order.
ROUTES: dict[str, list[str]] = {}


def route(question: str, doc_ids: list[str]) -> None:
    ROUTES[question] = list(doc_ids)


@ragtrace.retriever
def search(query: str) -> list[dict[str, Any]]:
    ids = ROUTES.get(query, [])
    return [{"id": d, "content": KB[d], "score": 1.0 / (i + 1)} for i, d in enumerate(ids)]


@ragtrace.generator
def generate(question: str, contexts: list[str]) -> str:
    return contexts[0] if contexts else "I do not know."


@ragtrace.rag(input="question")
def answer(question: str, reference: dict[str, Any] | None = None) -> str:
    """One request: retrieve, optionally attach ground truth, generate."""
    docs = search(question)
    if reference is not None:
        ragtrace.set_reference(**reference)
    return generate(question, [d["content"] for d in docs])
