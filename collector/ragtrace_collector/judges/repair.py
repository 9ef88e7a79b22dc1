"""Local repair of a judge's JSON answer, before any retry is spent.

Models wrap JSON in code fences or prose, leave trailing commas, or answer with
Python-style literals.  :func:`parse_json_object` fixes those locally and returns the
object (and whether it was repaired); anything it cannot turn into a single JSON
*object* raises ``ValueError``.  It never invents content: a plain "yes" stays
invalid.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["parse_json_object"]

_FENCED = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)
_LITERALS = {"True": "true", "False": "false", "None": "null"}
_MAX_CHARS = 1_000_000


def parse_json_object(text: str) -> tuple[dict[str, Any], bool]:
    """The JSON object in ``text`` and whether it needed repair; ``ValueError`` when
    there is no usable object."""
    if len(text) > _MAX_CHARS:
        raise ValueError(f"answer is too long ({len(text)} characters)")
    stripped = text.strip()
    if not stripped:
        raise ValueError("the answer is empty")
    try:
        return _as_object(json.loads(stripped)), False
    except json.JSONDecodeError:
        pass
    errors: list[str] = []
    for candidate in _candidates(stripped):
        for attempt in (candidate, _normalise(candidate)):
            if attempt is None:
                continue
            try:
                return _as_object(json.loads(attempt, strict=False)), True
            except json.JSONDecodeError as exc:
                errors.append(str(exc))
    if not errors:
        raise ValueError("the answer contains no JSON object")
    raise ValueError(f"the answer is not valid JSON ({errors[-1]})")


def _as_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"the answer is a JSON {type(value).__name__}, not an object")
    return value


def _candidates(text: str) -> list[str]:
    """Places a JSON object may hide: inside code fences, or between prose."""
    found: list[str] = []
    for match in _FENCED.finditer(text):
        obj = _balanced_object(match.group(1))
        if obj is not None:
            found.append(obj)
    obj = _balanced_object(text)
    if obj is not None and obj not in found:
        found.append(obj)
    return found


def _balanced_object(text: str) -> str | None:
    """The first ``{...}`` span with balanced braces (quotes respected)."""
    start = text.find("{")
    while start != -1:
        depth = 0
        quote: str | None = None
        i = start
        while i < len(text):
            ch = text[i]
            if quote is not None:
                if ch == "\\":
                    i += 2
                    continue
                if ch == quote:
                    quote = None
            elif ch in "\"'":
                quote = ch
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start : i + 1]
            i += 1
        start = text.find("{", start + 1)
    return None


def _normalise(text: str) -> str | None:
    """Single-quoted strings to JSON strings, drop trailing commas, Python literals to
    JSON.  None when the text has an unterminated string."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            end, body = _read_string(text, i)
            if end is None:
                return None
            out.append(body)
            i = end
        elif ch == ",":
            j = i + 1
            while j < n and text[j].isspace():
                j += 1
            if j < n and text[j] in "}]":
                i += 1
                continue
            out.append(ch)
            i += 1
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            out.append(_LITERALS.get(word, word))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _read_string(text: str, start: int) -> tuple[int | None, str]:
    """Read the string opening at ``start``; return (index after it, JSON form)."""
    quote = text[start]
    buf: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            buf.append("'" if nxt == "'" else ch + nxt)
            i += 2
            continue
        if ch == quote:
            return i + 1, '"' + "".join(buf) + '"'
        if ch == '"':  # only reachable inside a single-quoted string
            buf.append('\\"')
        elif ch == "\n":
            buf.append("\\n")
        else:
            buf.append(ch)
        i += 1
    return None, ""
