"""The bundled data: the knowledge base, the golden questions and the scripted conversations.

Files live next to this module in ``data/``:

* ``corpus.jsonl``: one support article per line, ``{"id", "category", "title", "text"}``;
* ``golden.jsonl``: ``{"input", "expected_output", "reference_context_ids",
  "reference_contexts"}``; the reference contexts are the exact ``text`` of the
  referenced articles, so the file doubles as a collector reference store;
* ``conversations.json``: a list of ``{"id", "user_id", "turns", "expected_outcome"}``.

Loading is strict: a malformed line raises :class:`DataError` naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CONVERSATIONS_PATH",
    "CORPUS_PATH",
    "DATA_DIR",
    "GOLDEN_PATH",
    "Article",
    "DataError",
    "GoldenItem",
    "ScriptedConversation",
    "load_conversations",
    "load_corpus",
    "load_golden",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
CORPUS_PATH = DATA_DIR / "corpus.jsonl"
GOLDEN_PATH = DATA_DIR / "golden.jsonl"
CONVERSATIONS_PATH = DATA_DIR / "conversations.json"


class DataError(ValueError):
    """A data file is missing a field or is not valid JSON."""


@dataclass(frozen=True)
class Article:
    """One knowledge-base article."""

    id: str
    category: str
    title: str
    text: str


@dataclass(frozen=True)
class GoldenItem:
    """One golden question with its ground truth."""

    input: str
    expected_output: str
    reference_context_ids: tuple[str, ...]
    reference_contexts: tuple[str, ...]


@dataclass(frozen=True)
class ScriptedConversation:
    """A multi-turn conversation: the user's turns and what a good outcome looks like."""

    id: str
    user_id: str | None
    turns: tuple[str, ...]
    expected_outcome: str | None


def _str_field(record: dict[str, Any], key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field {key!r} must be a non-empty string")
    return value


def _str_list(record: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = record.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DataError(f"{where}: field {key!r} must be a list of non-empty strings")
    return tuple(value)


def _read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    records: list[tuple[str, dict[str, Any]]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise DataError(f"{where}: expected a JSON object")
            records.append((where, record))
    return records


def load_corpus(path: Path = CORPUS_PATH) -> list[Article]:
    """The knowledge base, in file order.  Ids must be unique."""
    articles: list[Article] = []
    seen: set[str] = set()
    for where, record in _read_jsonl(path):
        article = Article(
            id=_str_field(record, "id", where),
            category=_str_field(record, "category", where),
            title=_str_field(record, "title", where),
            text=_str_field(record, "text", where),
        )
        if article.id in seen:
            raise DataError(f"{where}: duplicate article id {article.id!r}")
        seen.add(article.id)
        articles.append(article)
    if not articles:
        raise DataError(f"{path}: no articles")
    return articles


def load_golden(path: Path = GOLDEN_PATH) -> list[GoldenItem]:
    """The golden questions, in file order."""
    items: list[GoldenItem] = []
    for where, record in _read_jsonl(path):
        ids = _str_list(record, "reference_context_ids", where)
        contexts = _str_list(record, "reference_contexts", where)
        if len(ids) != len(contexts):
            raise DataError(
                f"{where}: reference_context_ids and reference_contexts differ in length"
            )
        items.append(
            GoldenItem(
                input=_str_field(record, "input", where),
                expected_output=_str_field(record, "expected_output", where),
                reference_context_ids=ids,
                reference_contexts=contexts,
            )
        )
    return items


def load_conversations(path: Path = CONVERSATIONS_PATH) -> list[ScriptedConversation]:
    """The scripted conversations, in file order."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON ({exc.msg})") from exc
    if not isinstance(raw, list):
        raise DataError(f"{path}: expected a JSON list of conversations")
    conversations: list[ScriptedConversation] = []
    for index, record in enumerate(raw):
        where = f"{path}[{index}]"
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object")
        user_id = record.get("user_id")
        outcome = record.get("expected_outcome")
        conversations.append(
            ScriptedConversation(
                id=_str_field(record, "id", where),
                user_id=user_id if isinstance(user_id, str) else None,
                turns=_str_list(record, "turns", where),
                expected_outcome=outcome if isinstance(outcome, str) else None,
            )
        )
    return conversations
