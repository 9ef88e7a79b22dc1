"""Dataset loaders: JSONL or JSON files of cases and conversations.

Accepted shapes:

* JSONL: one object per line (blank lines ignored);
* JSON: a list of objects, an object ``{"cases": [...]}``, or a single case object.

Field names, DeepEval style or Ragas style (mixing is fine, a conflict is an error):

============================  ==============================  ==================
ragtrace (``RAGCase``)        DeepEval                        Ragas
============================  ==============================  ==================
input                         input                           user_input
actual_output                 actual_output                   response
expected_output               expected_output                 reference
retrieval_context             retrieval_context               retrieved_contexts
reference_contexts            context                         reference_contexts
retrieved_context_ids         \\-                              retrieved_context_ids
reference_context_ids         \\-                              reference_context_ids
============================  ==============================  ==================

plus ``id`` / ``case_id`` / ``name`` for the case id (default ``"line N"``).

A context item is a string or an object ``{id, content | text | page_content, score,
metadata}``.  A row with ``turns`` (or a Ragas multi-turn ``user_input`` list of
messages) is a :class:`Conversation`: turns have ``role`` (``user`` / ``assistant``;
``human`` / ``ai`` accepted, ``type`` as well as ``role``), ``content`` and, on
assistant turns, ``retrieval_context`` (DeepEval) or ``retrieved_contexts``; its
outcome is ``expected_outcome`` (DeepEval) or ``reference`` (Ragas).

A bad row becomes a :class:`RowError` naming its line and field; the other rows load.
Unknown fields are ignored with a warning (with a did-you-mean).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragtrace_collector.cases import ContextItem, Conversation, RAGCase, Turn, id_text

__all__ = [
    "DatasetError",
    "LoadResult",
    "RowError",
    "load_dataset",
    "parse_row",
    "parse_text",
]

Item = RAGCase | Conversation

# canonical field -> accepted names (first is canonical)
_CASE_FIELDS: dict[str, tuple[str, ...]] = {
    "input": ("input", "user_input", "query", "question"),
    "actual_output": ("actual_output", "response", "answer"),
    "expected_output": ("expected_output", "reference", "ground_truth"),
    "retrieval_context": ("retrieval_context", "retrieved_contexts", "contexts"),
    "reference_contexts": ("reference_contexts", "context"),
    "retrieved_context_ids": ("retrieved_context_ids",),
    "reference_context_ids": ("reference_context_ids",),
    "case_id": ("case_id", "id", "name"),
}
_CONVERSATION_FIELDS: dict[str, tuple[str, ...]] = {
    "turns": ("turns", "user_input", "messages"),
    "expected_outcome": ("expected_outcome", "reference", "scenario_outcome"),
    "case_id": ("case_id", "id", "name"),
}
# Fields the peers' datasets carry that ragtrace has no use for: ignored silently.
_KNOWN_EXTRAS = frozenset(
    {
        "additional_metadata",
        "comments",
        "tools_called",
        "expected_tools",
        "metadata",
        "tags",
        "rubrics",
        "reference_tool_calls",
        "multi_responses",
        "chatbot_role",
        "scenario",
        "user_description",
        "context_type",
        "synthetic_input_quality",
        "source_file",
        "persona_name",
        "query_style",
        "query_length",
        "synthesizer_name",
        "token_cost",
        "completion_time",
    }
)
_ROLE_ALIASES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "bot": "assistant",
}
_IGNORED_ROLES = frozenset({"system", "tool", "function", "developer"})
_CONTENT_KEYS = ("content", "text", "page_content")


class DatasetError(Exception):
    """The file as a whole cannot be read (missing, unreadable, not JSON at all)."""


@dataclass(frozen=True)
class RowError:
    """One bad row: where it is and what is wrong."""

    line: int
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}"
        if self.field:
            where += f", field {self.field!r}"
        return f"{where}: {self.message}"


@dataclass
class LoadResult:
    """The rows that loaded (with their line numbers) and the ones that did not."""

    items: list[Item] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def cases(self) -> list[RAGCase]:
        return [i for i in self.items if isinstance(i, RAGCase)]

    @property
    def conversations(self) -> list[Conversation]:
        return [i for i in self.items if isinstance(i, Conversation)]


class _RowProblem(ValueError):
    def __init__(self, fld: str | None, message: str) -> None:
        super().__init__(message)
        self.field = fld
        self.message = message


# --------------------------------------------------------------- file level
def load_dataset(path: str | Path) -> LoadResult:
    """Load ``path`` (``.jsonl``/``.ndjson`` as JSON lines, ``.json`` as JSON, other
    extensions sniffed).  Raises :class:`DatasetError` only when nothing can be read."""
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{p}: no such file")
    if p.is_dir():
        raise DatasetError(f"{p}: is a directory, expected a JSON or JSONL file")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{p}: cannot read: {exc}") from None
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        style = "jsonl"
    elif suffix == ".json":
        style = "json"
    else:
        style = _sniff(text)
    return parse_text(text, style=style, source=str(p))


def _sniff(text: str) -> str:
    stripped = text.lstrip()
    if stripped.startswith("["):
        return "json"
    try:
        json.loads(text)
    except ValueError:
        return "jsonl"
    return "json"


def parse_text(text: str, *, style: str = "jsonl", source: str = "<data>") -> LoadResult:
    """Parse dataset text (``style`` is ``"jsonl"`` or ``"json"``)."""
    result = LoadResult()
    rows = _jsonl_rows(text, result) if style == "jsonl" else _json_rows(text, source)
    for line, row in rows:
        _add_row(result, line, row)
    return result


def _jsonl_rows(text: str, result: LoadResult) -> Iterator[tuple[int, Any]]:
    # "\n" only: str.splitlines() also breaks at U+2028, U+0085 and other characters
    # that json.dumps(ensure_ascii=False) leaves raw inside strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as exc:
            result.errors.append(RowError(number, None, f"invalid JSON: {exc}"))


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _array_rows(text: str, pos: int, decoder: json.JSONDecoder) -> Iterator[tuple[int, Any]]:
    """Elements of the JSON array starting at ``text[pos] == "["``, with their lines."""
    pos = _skip_ws(text, pos + 1)
    if pos < len(text) and text[pos] == "]":
        return
    while pos < len(text):
        value, end = decoder.raw_decode(text, pos)
        yield _line_of(text, pos), value
        pos = _skip_ws(text, end)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
            continue
        return


def _json_rows(text: str, source: str) -> list[tuple[int, Any]]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DatasetError(f"{source}: invalid JSON: {exc}") from None
    decoder = json.JSONDecoder()
    start = _skip_ws(text, 0)
    if isinstance(data, list):
        return list(_array_rows(text, start, decoder))
    if isinstance(data, dict) and isinstance(data.get("cases"), list):
        return _cases_array(text, start, decoder, data["cases"])
    if isinstance(data, dict):
        return [(_line_of(text, start), data)]
    raise DatasetError(
        f"{source}: expected a list of cases or an object with a 'cases' list, "
        f"got {type(data).__name__}"
    )


def _cases_array(
    text: str, start: int, decoder: json.JSONDecoder, cases: list[Any]
) -> list[tuple[int, Any]]:
    # Walk the top-level object to the "cases" array so each row keeps its line.
    pos = _skip_ws(text, start + 1)
    while pos < len(text) and text[pos] != "}":
        key, pos = decoder.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        pos = _skip_ws(text, pos + 1)  # the colon
        if key == "cases" and pos < len(text) and text[pos] == "[":
            rows = list(_array_rows(text, pos, decoder))
            if len(rows) == len(cases):
                return rows
            break
        _, pos = decoder.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
    line = _line_of(text, start)  # duplicate keys or the like: rows lose their own lines
    return [(line, c) for c in cases]


# ---------------------------------------------------------------- row level
def _add_row(result: LoadResult, line: int, row: Any) -> None:
    try:
        item, warnings = parse_row(row, default_id=f"line {line}")
    except _RowProblem as exc:
        result.errors.append(RowError(line, exc.field, exc.message))
        return
    result.items.append(item)
    result.lines.append(line)
    result.warnings.extend(f"line {line}: {w}" for w in warnings)


def parse_row(row: Any, *, default_id: str | None = None) -> tuple[Item, list[str]]:
    """One dataset row -> a case or conversation, plus warnings.

    Raises ``ValueError`` (carrying the field) for a bad row; :func:`load_dataset`
    turns that into a :class:`RowError`.
    """
    if not isinstance(row, Mapping):
        raise _RowProblem(None, f"expected a JSON object, got {_type_name(row)}")
    if _is_conversation(row):
        return _conversation(row, default_id)
    return _case(row, default_id)


def _is_conversation(row: Mapping[str, Any]) -> bool:
    if "turns" in row or "messages" in row:
        return True
    ui = row.get("user_input")
    return isinstance(ui, list) and all(isinstance(m, Mapping) for m in ui)


def _type_name(value: Any) -> str:
    return {
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _pick(
    row: Mapping[str, Any], aliases: dict[str, tuple[str, ...]]
) -> tuple[dict[str, tuple[str, Any]], list[str]]:
    """canonical -> (the name used, value); plus warnings for unknown keys."""
    picked: dict[str, tuple[str, Any]] = {}
    known: set[str] = set()
    for canonical, names in aliases.items():
        known.update(names)
        present = [n for n in names if n in row and row[n] is not None]
        if len(present) > 1:
            values = [row[n] for n in present]
            if any(v != values[0] for v in values[1:]):
                raise _RowProblem(
                    present[1],
                    f"conflicts with {present[0]!r}: both give {canonical}, with different values",
                )
        if present:
            picked[canonical] = (present[0], row[present[0]])
    warnings = []
    for key in row:
        if key in known or key in _KNOWN_EXTRAS:
            continue
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        warnings.append(f"unknown field {key!r} ignored{hint}")
    return picked, warnings


def _text(name: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _RowProblem(name, f"expected a string, got {_type_name(value)}")


def _id(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _RowProblem(name, f"expected a string or number id, got {_type_name(value)}")
    return id_text(value)


def _context_item(name: str, value: Any) -> ContextItem:
    if isinstance(value, str):
        return ContextItem(content=value)
    if not isinstance(value, Mapping):
        raise _RowProblem(
            name, f"expected a string or an object with content, got {_type_name(value)}"
        )
    content = next((value[k] for k in _CONTENT_KEYS if value.get(k) is not None), None)
    if content is None:
        raise _RowProblem(name, "a context object needs 'content', 'text' or 'page_content'")
    if not isinstance(content, str):
        raise _RowProblem(name, f"content: expected a string, got {_type_name(content)}")
    raw_id = value.get("id", value.get("doc_id"))
    score = value.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
        raise _RowProblem(name, f"score: expected a number, got {_type_name(score)}")
    metadata = value.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise _RowProblem(name, f"metadata: expected an object, got {_type_name(metadata)}")
    return ContextItem(
        content=content,
        id=None if raw_id is None else _id(f"{name}.id", raw_id),
        score=None if score is None else float(score),
        metadata=dict(metadata),
    )


def _list(name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise _RowProblem(name, f"expected a list, got {_type_name(value)}")
    return value


def _contexts(name: str, value: Any) -> list[ContextItem]:
    return [_context_item(f"{name}[{i}]", v) for i, v in enumerate(_list(name, value))]


def _case(row: Mapping[str, Any], default_id: str | None) -> tuple[RAGCase, list[str]]:
    picked, warnings = _pick(row, _CASE_FIELDS)
    fields: dict[str, Any] = {}
    for canonical in ("input", "actual_output", "expected_output"):
        if canonical in picked:
            name, value = picked[canonical]
            fields[canonical] = _text(name, value)
    if "retrieval_context" in picked:
        name, value = picked["retrieval_context"]
        fields["retrieval_context"] = _contexts(name, value)
    if "reference_contexts" in picked:
        name, value = picked["reference_contexts"]
        fields["reference_contexts"] = [c.content for c in _contexts(name, value)]
    for canonical in ("retrieved_context_ids", "reference_context_ids"):
        if canonical in picked:
            name, value = picked[canonical]
            fields[canonical] = [_id(f"{name}[{i}]", v) for i, v in enumerate(_list(name, value))]
    if "case_id" in picked:
        name, value = picked["case_id"]
        fields["case_id"] = _id(name, value)
    else:
        fields["case_id"] = default_id
    if not any(
        k in fields for k in ("input", "actual_output", "expected_output", "retrieval_context")
    ) and not any(k in fields for k in ("reference_context_ids", "retrieved_context_ids")):
        raise _RowProblem(
            None,
            "no case fields: expected input/user_input, actual_output/response, "
            "expected_output/reference, retrieval_context/retrieved_contexts or turns",
        )
    ids = fields.get("retrieved_context_ids")
    ctx = fields.get("retrieval_context")
    if ids is not None and ctx is not None and len(ids) == len(ctx):
        # Give the contexts their ids, unless they carry their own.
        fields["retrieval_context"] = [
            c if c.id is not None else c.model_copy(update={"id": i})
            for c, i in zip(ctx, ids, strict=True)
        ]
    try:
        return RAGCase(**fields), warnings
    except ValidationError as exc:  # pragma: no cover - the checks above come first
        first = exc.errors()[0]
        raise _RowProblem(".".join(str(p) for p in first["loc"]), first["msg"]) from None


def _conversation(row: Mapping[str, Any], default_id: str | None) -> tuple[Conversation, list[str]]:
    picked, warnings = _pick(row, _CONVERSATION_FIELDS)
    name, raw_turns = picked.get("turns", ("turns", None))
    turns: list[Turn] = []
    for i, raw in enumerate(_list(name, raw_turns)):
        where = f"{name}[{i}]"
        if not isinstance(raw, Mapping):
            raise _RowProblem(where, f"expected a turn object, got {_type_name(raw)}")
        role_key = "role" if "role" in raw else "type"
        raw_role = raw.get(role_key)
        if not isinstance(raw_role, str):
            raise _RowProblem(f"{where}.role", "each turn needs a role: user or assistant")
        role = _ROLE_ALIASES.get(raw_role.strip().lower())
        if role is None:
            if raw_role.strip().lower() in _IGNORED_ROLES:
                warnings.append(f"{where}: {raw_role} turn ignored")
                continue
            raise _RowProblem(
                f"{where}.{role_key}", f"unknown role {raw_role!r}: expected user or assistant"
            )
        content = raw.get("content", "")
        if content is None:
            content = ""
        content = _text(f"{where}.content", content)
        context: list[ContextItem] | None = None
        for key in ("retrieval_context", "retrieved_contexts"):
            if raw.get(key) is not None:
                context = _contexts(f"{where}.{key}", raw[key])
                break
        if context is not None and role == "user":
            warnings.append(f"{where}: retrieval context on a user turn is not used")
        turns.append(Turn(role=role, content=content, retrieval_context=context))
    fields: dict[str, Any] = {"turns": turns}
    if "expected_outcome" in picked:
        oname, value = picked["expected_outcome"]
        fields["expected_outcome"] = _text(oname, value)
    if "case_id" in picked:
        iname, value = picked["case_id"]
        fields["case_id"] = _id(iname, value)
    else:
        fields["case_id"] = default_id
    return Conversation(**fields), warnings
