"""The user question and the final answer from an input or output value, read as a
person reads them.

Instrumentors record a chain's input and output as they were passed: plain text, JSON,
or the Python repr of a framework object.  A case needs the question and the answer
*text*, so a value is reduced:

* **plain text** is kept as written; a JSON-quoted string (``"\"Paris is ...\""``,
  how OpenLLMetry and MLflow record a returned string) is unquoted;
* a **message** is read by its role: OpenAI/GenAI ``{"role", "content"|"parts"}``,
  LangChain's ``{"type": "ai", "content": ...}``, its serialised ``{"type": "ai",
  "data": {...}}`` (``message_to_dict``, what the OpenInference LangChain instrumentor
  writes for LangGraph states) and ``{"lc": 1, "type": "constructor", "id": [...,
  "AIMessage"], "kwargs": {...}}``, and the repr of a Haystack ``ChatMessage``
  (``ChatMessage(_role=<ChatRole.ASSISTANT: 'assistant'>, _content=[TextContent(text=
  '...')], ...)``).  A user (human) message is a question, an assistant (ai) message an
  answer; a message that calls tools is no answer;
* a **list of messages**, alone or as a ``{"messages": [...]}`` state: the question is
  the last user message; the answer is the last assistant message *after* the last
  user message, when it is text and calls no tool.  A conversation whose last turn has
  no such message has no answer: it is never read from another turn or another role;
* a Haystack **answer** (``GeneratedAnswer`` repr, or its ``to_dict`` form): its
  ``data``, never the repr with the query and the documents; AnswerBuilder's
  ``{"answers": [...]}`` is an object with an answer key;
* an **argument map** ``{"args": [...], "kwargs": {...}}`` (how Langfuse's
  ``@observe`` and traceloop's decorators record a call): the question is a question
  key of ``kwargs``, else the only text argument (two are ambiguous), else, with no
  text argument, ``kwargs`` read as an object, else the first argument that is an
  object or a list of messages holding a question; a call holds no answer;
* any other **object** is reduced through its first key that holds the text: for a
  question ``input``, ``question``, ``query``, ``query_str``, ``inputs``,
  ``user_input``, ``prompt``, ``messages``, ``message`` (LlamaIndex chat engines),
  ``query_bundle``, ``text``, ``content``; for an answer ``output``, ``answer``,
  ``answers``, ``result``, ``response``, ``outputs``, ``output_text``, ``replies``
  (Haystack generators), ``generations``, ``choices``, ``message``, ``messages``,
  ``text``, ``content``.  An object with none of these but exactly one text value
  reduces to that value;
* an object with none of these keys whose values are objects is a **component map**
  (Haystack's pipeline input ``{"data": {"retriever": {"query": ...}, "prompt_builder":
  {"question": ...}}}`` and output ``{"llm": {"replies": [...]}}``, LlamaIndex's
  ``{"str_or_query_bundle": {"query_str": ...}}``): the same keys are looked for one
  level down, then two, key order first (so ``question`` beats ``query`` whichever
  component holds it).  Messages are not searched as components;
* any other **list**: its last element for the question, its first for the answer
  (LangChain's ``generations[0][0].text``), reduced the same way.

A value that holds JSON (or a framework repr) but no text reduces to nothing.
:func:`read_question` and :func:`read_answer` then say what was found instead
(:class:`Unread`: "a JSON object with keys a, b, c"), so that the metrics that need the
text are skipped with that reason rather than judged on the JSON; :func:`reduce_question`,
:func:`reduce_answer` and :func:`question_text` give None.

The reduction only descends :data:`_MAX_DEPTH` levels: input is untrusted.  Callers
decide whether a value may hold JSON at all (OpenInference's ``input.value`` only
when ``input.mime_type`` says so).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ragtrace_collector.conventions.base import Unread, json_value

__all__ = [
    "Unread",
    "question_text",
    "read_answer",
    "read_question",
    "reduce_answer",
    "reduce_question",
]

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
    "answers",
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
)

#: Message roles (``role``, ``type``, or a LangChain class name), lower case, by side.
_ROLES: dict[str, str] = {
    "user": "user",
    "human": "user",
    "humanmessage": "user",
    "humanmessagechunk": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "aimessage": "assistant",
    "aimessagechunk": "assistant",
    "model": "assistant",
    "system": "system",
    "systemmessage": "system",
    "developer": "system",
    "tool": "tool",
    "toolmessage": "tool",
    "function": "tool",
    "functionmessage": "tool",
    "chat": "other",
    "chatmessage": "other",
}
#: Content parts that call a tool (OpenAI, Anthropic, GenAI, Haystack).
_TOOL_PARTS = frozenset({"tool_call", "tool_use", "function_call", "tool_calls"})

_Side = Literal["question", "answer"]
_WANTED: dict[_Side, str] = {"question": "user", "answer": "assistant"}

#: Objects looked at per level of a component map, at most (input is untrusted).
_MAX_COMPONENTS = 64
#: Keys named when describing an object that holds no text.
_SHOWN_KEYS = 8

#: A Haystack ``ChatMessage`` repr, and the ``TextContent(text=...)`` literals in it.
_CHAT_MESSAGE = re.compile(r"ChatMessage\(_role=<ChatRole\.(\w+)")
_LITERAL = r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
_TEXT_CONTENT = re.compile(r"TextContent\(text=" + _LITERAL, re.S)
_TOOL_CALL = re.compile(r"\bToolCall\(")
#: A Haystack ``GeneratedAnswer`` repr: its ``data`` literal comes first.
_GENERATED_ANSWER = re.compile(r"GeneratedAnswer\(data=(?:" + _LITERAL + r"|None)", re.S)
#: The start of a Python repr of some object: ``Name(``.
_REPR = re.compile(r"([A-Z]\w{0,63})\(")


def read_question(value: Any) -> str | Unread | None:
    """The user question held by an input value (see the module docstring); what was
    found instead when the value holds none; None for no value or an empty one."""
    return _read(value, "question")


def read_answer(value: Any) -> str | Unread | None:
    """The final answer text held by an output value (see the module docstring); what
    was found instead when the value holds none; None for no value or an empty one."""
    return _read(value, "answer")


def reduce_question(value: Any) -> str | None:
    """The question text of :func:`read_question`, or None."""
    read = _read(value, "question")
    return read if isinstance(read, str) else None


def reduce_answer(value: Any) -> str | None:
    """The answer text of :func:`read_answer`, or None."""
    read = _read(value, "answer")
    return read if isinstance(read, str) else None


#: How a convention reads a case span's question or a retriever span's query (the case
#: builder then lets the first retriever's query stand in for a question that is not
#: text, rather than take a JSON document for it).
question_text = reduce_question


def _read(value: Any, side: _Side) -> str | Unread | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        if not value.strip():
            return None
        parsed = json_value(value)
        if parsed is value:
            text = _from_text(value, side, 0)
            if text is not None:
                return text
            return Unread(_describe_text(value, side))
    else:
        parsed = value
    text = _reduce(parsed, side, 0)
    if text is not None and text.strip():
        return text
    return Unread(_describe(parsed, side))


# ------------------------------------------------------------------ strings
def _from_text(text: str, side: _Side, depth: int) -> str | None:
    """A string that is not a JSON object or list: a JSON-quoted string, a framework
    repr, or the text itself; None for a repr that holds no text for ``side``."""
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == '"' == stripped[-1] and depth < _MAX_DEPTH:
        try:
            inner = json.loads(stripped)
        except (ValueError, RecursionError):
            inner = None
        if isinstance(inner, str):
            return _reduce(json_value(inner), side, depth + 1)
    message = _haystack_message(stripped)
    if message is not None:
        return _message_text(message, side)
    if stripped.startswith("GeneratedAnswer("):
        return _generated_answer(stripped) if side == "answer" else None
    if stripped.startswith(("ChatMessage(", "ExtractedAnswer(", "Document(")):
        return None
    return text


def _literal_text(literal: str) -> str | None:
    try:
        held = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return held if isinstance(held, str) else None


def _haystack_message(text: str) -> _Message | None:
    """A Haystack ``ChatMessage`` repr as a message (its ``TextContent`` texts joined);
    None when ``text`` is not one."""
    if not text.startswith("ChatMessage("):
        return None
    found = _CHAT_MESSAGE.match(text)
    if found is None:
        return None
    texts = [t for t in (_literal_text(m) for m in _TEXT_CONTENT.findall(text)) if t]
    role = _ROLES.get(found.group(1).lower(), "other")
    return _Message(role, "\n".join(texts) or None, _TOOL_CALL.search(text) is not None)


def _generated_answer(text: str) -> str | None:
    found = _GENERATED_ANSWER.match(text)
    if found is None or found.group(1) is None:
        return None
    return _literal_text(found.group(1))


# ------------------------------------------------------------------ messages
@dataclass(frozen=True)
class _Message:
    role: str  # user, assistant, system, tool, other
    text: str | None
    tool_call: bool = False


def _message(value: Any, depth: int = 0) -> _Message | None:
    """``value`` as a message, or None when it is not one (see the module docstring)."""
    if isinstance(value, str):
        return _haystack_message(value) if value.startswith("ChatMessage(") else None
    if not isinstance(value, Mapping) or depth > 2:
        return None
    body: Mapping[str, Any] = value
    role: Any = value.get("role")
    if value.get("lc") is not None and isinstance(value.get("kwargs"), Mapping):
        # LangChain's serialised constructor: the class name says the role.
        ident = value.get("id")
        body = value["kwargs"]
        role = ident[-1] if isinstance(ident, list) and ident else body.get("type")
    elif role is None and isinstance(value.get("data"), Mapping) and "type" in value:
        data = value["data"]  # LangChain's message_to_dict: {"type": "ai", "data": {...}}
        if "content" not in data:
            return None
        body, role = data, value["type"]
    elif role is None and isinstance(value.get("message"), Mapping) and "content" not in value:
        return _message(value["message"], depth + 1)  # a generation or a choice
    elif role is None:
        role = value.get("type")
    if not isinstance(role, str):
        return None
    kind = _ROLES.get(role.lower())
    if kind is None or not any(k in body for k in ("content", "parts", "text")):
        return None
    text, tool_part = _content(body)
    calls = body.get("tool_calls") or body.get("function_call")
    return _Message(kind, text, bool(calls) or tool_part)


def _content(body: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The text of a message body (parts joined), and whether a part calls a tool."""
    for key in ("content", "parts", "text"):
        held = body.get(key)
        if isinstance(held, str):
            return (held if held.strip() else None), False
        if isinstance(held, list):
            texts: list[str] = []
            tool = False
            for part in held:
                if isinstance(part, str):
                    texts.append(part)
                elif isinstance(part, Mapping):
                    kind = part.get("type", "text")
                    if kind in _TOOL_PARTS or "tool_call" in part:
                        tool = True
                    elif kind == "text":
                        for k in ("content", "text"):
                            if isinstance(part.get(k), str):
                                texts.append(part[k])
                                break
            joined = "\n".join(t for t in texts if t.strip())
            return (joined or None), tool
    return None, False


def _message_text(message: _Message, side: _Side) -> str | None:
    if message.role != _WANTED[side]:
        return None
    if side == "answer" and message.tool_call:
        return None
    return message.text


def _from_messages(messages: list[_Message], side: _Side) -> str | None:
    if side == "question":
        for message in reversed(messages):
            if message.role == "user" and message.text:
                return message.text
        return None
    for message in reversed(_after_last_user(messages)):
        if message.role == "assistant":
            return _message_text(message, "answer")
    return None


# ------------------------------------------------------------------ JSON values
def _reduce(value: Any, side: _Side, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, str):
        nested = json_value(value)
        if nested is not value:
            return _reduce(nested, side, depth + 1)
        return _from_text(value, side, depth)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, Mapping):
        return _from_mapping(value, side, depth)
    if isinstance(value, list):
        return _from_list(value, side, depth)
    return None


def _from_list(items: list[Any], side: _Side, depth: int) -> str | None:
    if not items:
        return None
    found = [_message(i) for i in items]
    messages = [m for m in found if m is not None]
    if messages:
        return _from_messages(messages, side)
    if all(isinstance(i, list) and len(i) == 1 for i in items) and side == "answer":
        return _reduce(items[0][0], side, depth + 1)
    pick = items[-1] if side == "question" else items[0]
    return _reduce(pick, side, depth + 1)


def _from_mapping(obj: Mapping[str, Any], side: _Side, depth: int) -> str | None:
    message = _message(obj)
    if message is not None:
        return _message_text(message, side)
    answer = _answer_object(obj)
    if answer is not None:
        return _reduce(answer, side, depth + 1) if side == "answer" else None
    if _is_arguments(obj):
        return _from_arguments(obj, side, depth)
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


def _answer_object(obj: Mapping[str, Any]) -> Any:
    """The ``data`` of a Haystack answer (``GeneratedAnswer.to_dict()``, or its fields),
    else None."""
    kind = obj.get("type")
    params = obj.get("init_parameters")
    if isinstance(kind, str) and kind.endswith("Answer") and isinstance(params, Mapping):
        return params.get("data")
    if "data" in obj and "query" in obj and ("documents" in obj or "document" in obj):
        return obj["data"]
    return None


def _is_arguments(obj: Mapping[str, Any]) -> bool:
    """A recorded call: ``{"args": [...], "kwargs": {...}}`` (Langfuse's ``@observe``,
    traceloop's ``@workflow``/``@task``), ``kwargs`` optional."""
    return "args" in obj and set(obj) <= {"args", "kwargs"}


def _from_arguments(obj: Mapping[str, Any], side: _Side, depth: int) -> str | None:
    """A recorded call ``{"args": [...], "kwargs": {...}}``.  The question is, in order:
    a question key of ``kwargs`` (``question=``, ``query=``, ...); the only positional
    argument that is text (two or more are ambiguous: none is taken); with no text
    argument, ``kwargs`` read as an input object (``q="..."``, its only text); the
    first positional object, or list of objects (messages), that holds a question.  A
    list of numbers (an embedding) is never read.  A call holds no answer."""
    if side != "question":
        return None
    kwargs = obj.get("kwargs")
    kwargs = kwargs if isinstance(kwargs, Mapping) else {}
    for key in _QUESTION_KEYS:
        if kwargs.get(key) is not None:
            reduced = _reduce(kwargs[key], side, depth + 1)
            if reduced is not None:
                return reduced
    args = obj.get("args")
    args = args if isinstance(args, list) else []
    texts = [a for a in args if isinstance(a, str)]
    if len(texts) == 1:
        return _reduce(texts[0], side, depth + 1)
    if texts:
        return None
    if kwargs:
        reduced = _from_mapping(kwargs, side, depth + 1)
        if reduced is not None:
            return reduced
    for arg in args:
        if isinstance(arg, Mapping) or (
            isinstance(arg, list) and arg and all(isinstance(a, Mapping) for a in arg)
        ):
            reduced = _reduce(arg, side, depth + 1)
            if reduced is not None:
                return reduced
    return None


def _components(values: Any) -> list[Mapping[str, Any]]:
    """The objects among ``values`` that are not messages (a message is read by its
    role, never searched for a text key)."""
    return [v for v in values if isinstance(v, Mapping) and _message(v) is None][:_MAX_COMPONENTS]


def _from_components(
    obj: Mapping[str, Any], side: _Side, keys: tuple[str, ...], depth: int
) -> str | None:
    """A component map: the first of ``keys`` held by an object one level down, then
    two levels down, ... (key order first, then component order)."""
    level = _components(obj.values())
    while level and depth < _MAX_DEPTH:
        depth += 1
        for key in keys:
            for component in level:
                held = component.get(key)
                if held is not None:
                    reduced = _reduce(held, side, depth + 1)
                    if reduced is not None:
                        return reduced
        level = _components(v for c in level for v in c.values())
    return None


# ------------------------------------------------------------------ descriptions
def _describe_text(text: str, side: _Side) -> str:
    found = _REPR.match(text.strip())
    name = found.group(1) if found else "a repr"
    if name == "ChatMessage":
        message = _haystack_message(text.strip())
        if message is not None:
            return _describe_message(message, side)
    return f"a Python repr of {name} with no {side} text"


def _describe_message(message: _Message, side: _Side) -> str:
    role = {"user": "user", "assistant": "AI"}.get(message.role, message.role)
    if side == "answer" and message.role == "assistant" and message.tool_call:
        return "an AI message that calls a tool (no answer text)"
    if message.text is None:
        return f"a {role} message with no text"
    return f"a {role} message, not a{'n AI' if side == 'answer' else ' user'} message"


def _describe(value: Any, side: _Side) -> str:
    """What a JSON value that holds no ``side`` text is, in a few words."""
    if isinstance(value, str):
        return _describe_text(value, side)
    message = _message(value)
    if message is not None:
        return _describe_message(message, side)
    if isinstance(value, Mapping):
        if _is_arguments(value):
            args = value.get("args")
            count = len(args) if isinstance(args, list) else 0
            texts = sum(isinstance(a, str) for a in args) if isinstance(args, list) else 0
            return (
                f"a call's arguments ({count} positional, {texts} of them text, and no "
                "question keyword)"
            )
        for key in ("messages", "answers", "replies"):
            held = value.get(key)
            if isinstance(held, list) and held:
                return f'{{"{key}": ...}} holding {_describe(held, side)}'
        keys = [str(k) for k in list(value)[:_SHOWN_KEYS]]
        more = ", ..." if len(value) > _SHOWN_KEYS else ""
        if not keys:
            return "an empty JSON object"
        return f"a JSON object with keys {', '.join(keys)}{more}"
    if isinstance(value, list):
        messages = [m for m in (_message(i) for i in value) if m is not None]
        if messages:
            if side == "answer":
                after = _after_last_user(messages)
                last = next((m for m in reversed(after) if m.role == "assistant"), None)
                if last is not None and last.tool_call:
                    return (
                        f"{len(messages)} messages whose last AI message calls a tool "
                        "(no answer text)"
                    )
                return f"{len(messages)} messages with no AI message after the last user message"
            return f"{len(messages)} messages with no user message"
        return f"a JSON list of {len(value)} items with no {side} text"
    return f"a {type(value).__name__} with no {side} text"


def _after_last_user(messages: list[_Message]) -> list[_Message]:
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    return messages[users[-1] + 1 :] if users else messages
