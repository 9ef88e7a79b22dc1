"""The user question and the final answer from an input or output value.

Instrumentors record a chain's input and output as they were passed: plain text, or
JSON.  A case needs the question and the answer text, so a JSON value is reduced:

* a JSON string value is the text itself;
* an **object** is reduced through its first key that holds the text: for a question
  ``input``, ``question``, ``query``, ``query_str``, ``inputs``, ``user_input``,
  ``prompt``, ``messages``, ``message`` (LlamaIndex chat engines), ``query_bundle``,
  ``text``, ``content``; for an answer
  ``output``, ``answer``, ``result``, ``response``, ``outputs``, ``output_text``,
  ``replies`` (Haystack generators), ``generations``, ``choices``, ``message``,
  ``messages``, ``text``, ``content``, ``kwargs`` (LangChain's serialised messages keep
  their content there).  An object with none of these but exactly one text value
  reduces to that value;
* an object with none of these keys whose values are objects is a **component map**
  (Haystack's pipeline input ``{"data": {"retriever": {"query": ...}, "prompt_builder":
  {"question": ...}}}`` and output ``{"llm": {"replies": [...]}}``, LlamaIndex's
  ``{"str_or_query_bundle": {"query_str": ...}}``): the same keys are looked for one
  level down, then two, key order first (so ``question`` beats ``query`` whichever
  component holds it);
* a **list of messages** (OpenAI/LangChain ``{"role"|"type": ..., "content": ...}``,
  GenAI ``{"role": ..., "parts": [{"type": "text", "content": ...}]}``, LangChain's
  serialised ``HumanMessage``/``AIMessage``): the last user (human) message for the
  question, the last assistant (ai) message for the answer; message content given
  as parts is joined;
* any other **list**: its last element for the question, its first for the answer
  (LangChain's ``generations[0][0].text``), reduced the same way;
* the Python repr of a Haystack ``ChatMessage`` (what the OpenInference Haystack
  instrumentor records for a chat generator's replies:
  ``ChatMessage(_role=<ChatRole.ASSISTANT: 'assistant'>, _content=[TextContent(text='...')], ...)``)
  is a message: its ``TextContent`` texts, joined;
* text that is not JSON is kept as it was.  JSON that reduces to nothing is kept as it
  was by :func:`reduce_question` / :func:`reduce_answer`; :func:`question_text` gives
  None instead.  The conventions read questions with the latter, so that the case
  builder lets the first retriever's query stand in rather than take a JSON document
  for the question (which would match no reference and mislead every judge).

The reduction only descends :data:`_MAX_DEPTH` levels: input is untrusted.  Callers
decide whether a value may hold JSON at all (OpenInference's ``input.value`` only
when ``input.mime_type`` says so).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any, Literal

from ragtrace_collector.conventions.base import json_value

__all__ = ["answer_text", "question_text", "reduce_answer", "reduce_question"]

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
    "message",
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
    "replies",
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

#: Objects looked at per level of a component map, at most (input is untrusted).
_MAX_COMPONENTS = 64

#: A Haystack ``ChatMessage`` repr, and the ``TextContent(text=...)`` literals in it.
_CHAT_MESSAGE = re.compile(r"ChatMessage\(_role=<ChatRole\.(\w+)")
_TEXT_CONTENT = re.compile(r"""TextContent\(text=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""", re.S)


def reduce_question(value: Any) -> str | None:
    """The user question held by an input value (see the module docstring)."""
    return _reduce_value(value, "question", True)


def question_text(value: Any) -> str | None:
    """As :func:`reduce_question`, but None rather than the value when it is JSON that
    holds no question: how a convention reads a case span's question or a retriever
    span's query."""
    return _reduce_value(value, "question", False)


def reduce_answer(value: Any) -> str | None:
    """The final answer text held by an output value (see the module docstring)."""
    return _reduce_value(value, "answer", True)


def answer_text(value: Any) -> str | None:
    """As :func:`reduce_answer`, but None rather than the value when it is JSON that
    holds no answer text (the answer side of :func:`question_text`)."""
    return _reduce_value(value, "answer", False)


def _reduce_value(value: Any, side: _Side, keep: bool) -> str | None:
    if value is None:
        return None
    parsed = json_value(value)
    if isinstance(parsed, str):
        message = _haystack_message(parsed)
        return message["content"] if message is not None else parsed
    reduced = _reduce(parsed, side, 0)
    if reduced is not None:
        return reduced
    return value if keep and isinstance(value, str) else None


def _haystack_message(text: str) -> dict[str, str] | None:
    """A Haystack ``ChatMessage`` repr as ``{"role", "content"}`` (its ``TextContent``
    texts joined); None when ``text`` is not one or holds no text."""
    if not text.startswith("ChatMessage("):
        return None
    found = _CHAT_MESSAGE.match(text)
    if found is None:
        return None
    texts: list[str] = []
    for literal in _TEXT_CONTENT.findall(text):
        try:
            held = ast.literal_eval(literal)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(held, str):
            texts.append(held)
    return {"role": found.group(1).lower(), "content": "\n".join(texts)} if texts else None


def _as_message(item: Any) -> Any:
    """``item``, or the message a Haystack ``ChatMessage`` repr holds."""
    if isinstance(item, str) and item.startswith("ChatMessage("):
        return _haystack_message(item) or item
    return item


def _reduce(value: Any, side: _Side, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, str):
        message = _haystack_message(value)
        if message is not None:
            wanted = _USER_ROLES if side == "question" else _ASSISTANT_ROLES
            return message["content"] if message["role"] in wanted else None
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
    items = [_as_message(i) for i in items]
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
        return _reduce(texts[0], side, depth + 1)
    return _from_components(obj, side, keys, depth)


def _from_components(
    obj: Mapping[str, Any], side: _Side, keys: tuple[str, ...], depth: int
) -> str | None:
    """A component map: the first of ``keys`` held by an object one level down, then
    two levels down, ... (key order first, then component order)."""
    level = [v for v in obj.values() if isinstance(v, Mapping)][:_MAX_COMPONENTS]
    while level and depth < _MAX_DEPTH:
        depth += 1
        for key in keys:
            for component in level:
                held = component.get(key)
                if held is not None:
                    reduced = _reduce(held, side, depth + 1)
                    if reduced is not None:
                        return reduced
        level = [v for c in level for v in c.values() if isinstance(v, Mapping)][:_MAX_COMPONENTS]
    return None
