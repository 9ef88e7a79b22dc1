"""The user question and the final answer from an input or output value.

Instrumentors record a chain's input and output as they were passed: plain text, or
JSON.  A case needs the question and the answer text, so a JSON value is reduced:

* a JSON string value is the text itself;
* an **object** is reduced through its first key that holds the text: for a question
  ``input``, ``question``, ``query``, ``query_str``, ``inputs``, ``user_input``,
  ``prompt``, ``messages``, ``query_bundle``, ``text``, ``content``; for an answer
  ``output``, ``answer``, ``result``, ``response``, ``outputs``, ``output_text``,
  ``generations``, ``choices``, ``message``, ``messages``, ``text``, ``content``,
  ``kwargs`` (LangChain's serialised messages keep their content there).  An object
  with none of these but exactly one text value reduces to that value;
* a **list of messages** (OpenAI/LangChain ``{"role"|"type": ..., "content": ...}``,
  GenAI ``{"role": ..., "parts": [{"type": "text", "content": ...}]}``, LangChain's
  serialised ``HumanMessage``/``AIMessage``): the last user (human) message for the
  question, the last assistant (ai) message for the answer; message content given
  as parts is joined;
* any other **list**: its last element for the question, its first for the answer
  (LangChain's ``generations[0][0].text``), reduced the same way;
* text that is not JSON, or JSON that reduces to nothing, is kept as it was.

The reduction only descends :data:`_MAX_DEPTH` levels: input is untrusted.  Callers
decide whether a value may hold JSON at all (OpenInference's ``input.value`` only
when ``input.mime_type`` says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ragtrace_collector.conventions.base import json_value

__all__ = ["reduce_answer", "reduce_question"]

_MAX_DEPTH = 8

_QUESTION_KEYS = (
    "input",
    "question",
    "query",
    "query_str",
    "inputs",
    "user_input",
    "prompt",
    "messages",
    "query_bundle",
    "text",
    "content",
)
_ANSWER_KEYS = (
    "output",
    "answer",
    "result",
    "response",
    "outputs",
    "output_text",
    "generations",
    "choices",
    "message",
    "messages",
    "text",
    "content",
    "kwargs",
)
_USER_ROLES = frozenset({"user", "human", "humanmessage", "humanmessagechunk"})
_ASSISTANT_ROLES = frozenset({"assistant", "ai", "aimessage", "aimessagechunk", "model"})

_Side = Literal["question", "answer"]


def reduce_question(value: Any) -> str | None:
    """The user question held by an input value (see the module docstring)."""
    return _reduce_value(value, "question")


def reduce_answer(value: Any) -> str | None:
    """The final answer text held by an output value (see the module docstring)."""
    return _reduce_value(value, "answer")


def _reduce_value(value: Any, side: _Side) -> str | None:
    if value is None:
        return None
    parsed = json_value(value)
    if isinstance(parsed, str):
        return parsed
    reduced = _reduce(parsed, side, 0)
    if reduced is not None:
        return reduced
    return value if isinstance(value, str) else None


def _reduce(value: Any, side: _Side, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, str):
        nested = json_value(value)
        if nested is not value and depth < _MAX_DEPTH:
            return _reduce(nested, side, depth + 1) or value
        return value
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, Mapping):
        return _from_mapping(value, side, depth)
    if isinstance(value, list):
        return _from_list(value, side, depth)
    return None


def _role(message: Mapping[str, Any]) -> str | None:
    role = message.get("role")
    if role is None:
        role = message.get("type")
    if role is None and message.get("lc") is not None:
        ident = message.get("id")
        if isinstance(ident, list) and ident:
            role = ident[-1]
    if role is None and isinstance(message.get("message"), Mapping):
        return _role(message["message"])
    return str(role).lower() if role is not None else None


def _content(message: Mapping[str, Any], depth: int) -> str | None:
    """The text of one message, whatever its shape."""
    if message.get("lc") is not None and isinstance(message.get("kwargs"), Mapping):
        return _content(message["kwargs"], depth + 1)
    if isinstance(message.get("message"), Mapping):
        return _content(message["message"], depth + 1)
    for key in ("content", "parts", "text"):
        held = message.get(key)
        if isinstance(held, str):
            return held
        if isinstance(held, list):
            texts = [t for t in (_part_text(p) for p in held) if t]
            if texts:
                return "\n".join(texts)
    return None


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping) and part.get("type", "text") == "text":
        for key in ("content", "text"):
            held = part.get(key)
            if isinstance(held, str):
                return held
    return None


def _is_message(value: Any) -> bool:
    return (
        isinstance(value, Mapping) and _role(value) is not None and (_content(value, 0) is not None)
    )


def _from_list(items: list[Any], side: _Side, depth: int) -> str | None:
    if not items:
        return None
    messages = [m for m in items if _is_message(m)]
    if messages:
        wanted = _USER_ROLES if side == "question" else _ASSISTANT_ROLES
        for message in reversed(messages):
            if _role(message) in wanted:
                return _content(message, depth)
        return None
    if all(isinstance(i, list) and len(i) == 1 for i in items) and side == "answer":
        return _reduce(items[0][0], side, depth + 1)
    pick = items[-1] if side == "question" else items[0]
    return _reduce(pick, side, depth + 1)


def _from_mapping(obj: Mapping[str, Any], side: _Side, depth: int) -> str | None:
    if _is_message(obj):
        return _content(obj, depth)
    keys = _QUESTION_KEYS if side == "question" else _ANSWER_KEYS
    for key in keys:
        if key in obj and obj[key] is not None:
            reduced = _reduce(obj[key], side, depth + 1)
            if reduced is not None:
                return reduced
    texts = [v for v in obj.values() if isinstance(v, str)]
    if len(texts) == 1 and len(obj) == 1:
        return texts[0]
    return None
