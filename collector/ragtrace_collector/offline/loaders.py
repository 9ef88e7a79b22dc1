"""Dataset loaders: JSONL, JSON, CSV or Parquet files of cases and conversations, or
any iterable of row mappings (a Hugging Face ``datasets.Dataset``, pandas records).

Accepted shapes:

* JSONL: one object per line (blank lines ignored);
* JSON: a list of objects, an object ``{"cases": [...]}``, or a single case object;
* CSV: a header row of field names, one row per case; list fields (contexts, ids,
  turns) hold JSON in their cell (``["first context", "second"]``); an empty cell is
  an absent field;
* Parquet: one row per case, list fields as list columns (needs ``pyarrow``:
  ``pip install pyarrow``);
* rows: :func:`load_rows` takes mappings, e.g. ``datasets.Dataset`` rows.

The format comes from the file name (``.jsonl``/``.ndjson``, ``.json``, ``.csv``,
``.parquet``/``.pq``); other names are sniffed as JSON or JSONL, and anything else is
an unsupported format (:class:`DatasetError`).  An empty file is an error too.

A row holding more than ``max_row_size`` characters of text (default 1,000,000) is
reported as a bad row and skipped, so that one huge context cannot stall a run.

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

A bad row becomes a :class:`RowError` naming its line (or row) and field; the other
rows load.  Unknown fields are ignored with a warning (with a did-you-mean).
"""

from __future__ import annotations

import csv
import difflib
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragtrace_collector.cases import ContextItem, Conversation, RAGCase, Turn, id_text

__all__ = [
    "DEFAULT_MAX_ROW_SIZE",
    "FORMATS",
    "DatasetError",
    "LoadResult",
    "RowError",
    "accepted_fields",
    "check_feedback_column",
    "load_dataset",
    "load_rows",
    "parse_csv",
    "parse_row",
    "parse_text",
]

#: Rows holding more characters of text than this are skipped as bad rows.
DEFAULT_MAX_ROW_SIZE = 1_000_000

#: The file formats :func:`load_dataset` reads.
FORMATS = ("jsonl", "json", "csv", "parquet")

_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}

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


def accepted_fields() -> dict[str, tuple[str, ...]]:
    """Each field of a case or conversation and the names a row may give it by."""
    return {**_CASE_FIELDS, **{k: v for k, v in _CONVERSATION_FIELDS.items() if k != "case_id"}}


def check_feedback_column(name: str) -> str:
    """``name`` if it can hold labels; ``ValueError`` if it is empty or a case field."""
    taken = {n for names in (*_CASE_FIELDS.values(), *_CONVERSATION_FIELDS.values()) for n in names}
    if not name:
        raise ValueError("the feedback column needs a name")
    if name in taken:
        raise ValueError(f"the feedback column {name!r} is a field of the cases; name another")
    return name


class DatasetError(Exception):
    """The file as a whole cannot be read (missing, unreadable, not JSON at all)."""


@dataclass(frozen=True)
class RowError:
    """One bad row: where it is and what is wrong, and what could be read of it."""

    line: int
    field: str | None
    message: str
    #: "line" (JSON, JSONL, CSV: the line the row starts on) or "row" (Parquet, rows).
    unit: str = "line"
    case_id: str | None = None
    #: The row's input text, when it has one that is a string.
    input: str | None = None

    def __str__(self) -> str:
        where = f"{self.unit} {self.line}"
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
    #: Each distinct warning and the lines (or rows) it was given for.
    warning_lines: dict[str, list[int]] = field(default_factory=dict)
    unit: str = "line"
    #: A column of human labels (:func:`check_feedback_column`), not a case field.
    feedback_column: str | None = None
    #: With a ``feedback_column``: each item's raw cell in that column (None when the
    #: row has none), aligned with ``items``.
    feedback: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.feedback_column is not None:
            check_feedback_column(self.feedback_column)

    def grouped_warnings(self, shown: int = 5) -> list[str]:
        """One line per distinct warning: ``"unknown field 'x' ignored (lines 1, 2, 3)"``."""
        out = []
        for message, where in self.warning_lines.items():
            head = ", ".join(str(n) for n in where[:shown])
            more = f" and {len(where) - shown} more" if len(where) > shown else ""
            unit = self.unit if len(where) == 1 else self.unit + "s"
            out.append(f"{message} ({unit} {head}{more})")
        return out

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
def load_dataset(
    path: str | Path,
    *,
    format: str | None = None,
    max_row_size: int | None = DEFAULT_MAX_ROW_SIZE,
    feedback_column: str | None = None,
) -> LoadResult:
    """Load ``path`` as ``format`` (one of :data:`FORMATS`; None: from the file name,
    else sniffed).  Raises :class:`DatasetError` when nothing can be read: a missing,
    empty or unreadable file, an unsupported format, a file with no rows.

    ``feedback_column``: a column of human labels, kept raw in ``result.feedback``."""
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{p}: no such file")
    if p.is_dir():
        raise DatasetError(f"{p}: is a directory, expected a JSON or JSONL file")
    if format is not None and format not in FORMATS:
        raise DatasetError(f"unsupported format {format!r}: expected one of {', '.join(FORMATS)}")
    style = format or _SUFFIXES.get(p.suffix.lower())
    if style == "parquet":
        result = load_rows(
            _parquet_rows(p), max_row_size=max_row_size, feedback_column=feedback_column
        )
    else:
        try:
            text = p.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{p}: cannot read: {exc}") from None
        if not text.strip():
            raise DatasetError(f"{p}: the file is empty")
        if style is None:
            style = _sniff(text, p)
        if style == "csv":
            result = parse_csv(
                text, source=str(p), max_row_size=max_row_size, feedback_column=feedback_column
            )
        else:
            result = parse_text(
                text,
                style=style,
                source=str(p),
                max_row_size=max_row_size,
                feedback_column=feedback_column,
            )
    if not result.items and not result.errors:
        raise DatasetError(f"{p}: no rows")
    return result


def load_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    max_row_size: int | None = DEFAULT_MAX_ROW_SIZE,
    feedback_column: str | None = None,
) -> LoadResult:
    """Rows already parsed (a ``datasets.Dataset``, ``DataFrame.to_dict("records")``,
    Parquet rows), numbered from 1 as "row N", with the field names of files."""
    result = LoadResult(unit="row", feedback_column=feedback_column)
    for number, row in enumerate(rows, start=1):
        _add_row(result, number, row, max_row_size)
    return result


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # optional
    except ImportError:
        raise DatasetError(
            f"{path}: reading Parquet needs pyarrow, which is not installed (pip install pyarrow)"
        ) from None
    try:
        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises its own error types for bad files
        raise DatasetError(f"{path}: cannot read as Parquet: {exc}") from None
    return rows


def parse_csv(
    text: str,
    *,
    source: str = "<data>",
    max_row_size: int | None = DEFAULT_MAX_ROW_SIZE,
    feedback_column: str | None = None,
) -> LoadResult:
    """CSV with a header row of field names; list fields hold JSON in their cell."""
    result = LoadResult(feedback_column=feedback_column)
    # A long context is a long cell: csv's default cap (131,072 characters) would stop
    # the whole file; the row size guard below is the limit that applies.
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames:
        raise DatasetError(f"{source}: no header row")
    try:
        for record in reader:
            # The line the record starts on: its last line less the line breaks in cells.
            line = reader.line_num - sum(
                v.count("\n") for v in record.values() if isinstance(v, str)
            )
            if None in record:
                result.errors.append(RowError(line, None, "more cells than the header has columns"))
                continue
            try:
                row = {k: _csv_cell(k, v) for k, v in record.items() if v}
            except _RowProblem as exc:
                case_id, given = _identity(record)
                result.errors.append(RowError(line, exc.field, exc.message, "line", case_id, given))
                continue
            _add_row(result, line, row, max_row_size)
    except csv.Error as exc:
        result.errors.append(
            RowError(reader.line_num, None, f"invalid CSV, reading stopped: {exc}")
        )
    return result


# CSV cells that hold JSON: the list fields of cases and the turns of conversations
# (a Ragas ``user_input`` cell too, when it holds a JSON list of messages).
_JSON_CELLS = frozenset(
    [
        *(
            name
            for canonical in (
                "retrieval_context",
                "reference_contexts",
                "retrieved_context_ids",
                "reference_context_ids",
            )
            for name in _CASE_FIELDS[canonical]
        ),
        "turns",
        "messages",
    ]
)


def _csv_cell(name: str, value: str) -> Any:
    if name in _JSON_CELLS or (name == "user_input" and value.lstrip().startswith("[")):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise _RowProblem(
                name, f"expected JSON in the cell (a list), got {value[:40]!r}: {exc}"
            ) from None
    return value


def _sniff(text: str, path: Path) -> str:
    stripped = text.lstrip()
    if stripped.startswith("["):
        return "json"
    if not stripped.startswith("{"):
        suffix = path.suffix or "(no extension)"
        raise DatasetError(
            f"{path}: unsupported format {suffix}: expected JSONL, JSON, CSV or Parquet "
            "(.jsonl, .json, .csv, .parquet, or name it with --format)"
        )
    try:
        json.loads(text)
    except ValueError:
        return "jsonl"
    return "json"


def parse_text(
    text: str,
    *,
    style: str = "jsonl",
    source: str = "<data>",
    max_row_size: int | None = DEFAULT_MAX_ROW_SIZE,
    feedback_column: str | None = None,
) -> LoadResult:
    """Parse dataset text (``style`` is ``"jsonl"`` or ``"json"``)."""
    result = LoadResult(feedback_column=feedback_column)
    rows = _jsonl_rows(text, result) if style == "jsonl" else _json_rows(text, source)
    for line, row in rows:
        _add_row(result, line, row, max_row_size)
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
def _add_row(result: LoadResult, line: int, row: Any, max_row_size: int | None) -> None:
    unit = result.unit
    feedback_column = result.feedback_column
    label: Any = None
    if feedback_column is not None and isinstance(row, Mapping) and feedback_column in row:
        label = row[feedback_column]
        row = {k: v for k, v in row.items() if k != feedback_column}
    try:
        if max_row_size is not None:
            size = _text_size(row)
            if size > max_row_size:
                raise _RowProblem(
                    None,
                    f"{size:,} characters of text, over the limit of {max_row_size:,} "
                    "(max_row_size, --max-row-size): skipped",
                )
        item, warnings = parse_row(row, default_id=f"{unit} {line}")
    except _RowProblem as exc:
        case_id, text = _identity(row)
        result.errors.append(RowError(line, exc.field, exc.message, unit, case_id, text))
        return
    result.items.append(item)
    result.lines.append(line)
    if feedback_column is not None:
        result.feedback.append(label)
    for w in warnings:
        result.warnings.append(f"{unit} {line}: {w}")
        result.warning_lines.setdefault(w, []).append(line)


def _text_size(value: Any) -> int:
    """Characters of text in a parsed row (keys and string values, nested)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(str(k)) + _text_size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_text_size(v) for v in value)
    return 0


def _identity(row: Any) -> tuple[str | None, str | None]:
    """(case id, input text) of a bad row, as far as they can be read."""
    if not isinstance(row, Mapping):
        return None, None
    raw_id = next((row[k] for k in _CASE_FIELDS["case_id"] if row.get(k) is not None), None)
    text = next((row[k] for k in _CASE_FIELDS["input"] if isinstance(row.get(k), str)), None)
    case_id = None if raw_id is None or isinstance(raw_id, (list, dict)) else str(raw_id)
    return case_id, text


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
