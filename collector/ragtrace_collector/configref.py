"""The configuration reference, generated from the pydantic model of ``collector.yaml``.

``python -m ragtrace_collector.configref`` prints Markdown: one table per top-level
section of :class:`~ragtrace_collector.config.CollectorConfig`, one row per key as a
dotted path (``exporters.<name>.queue.max_spans``, ``alerts.rules[].window``), with its
type, default and description.  Nested models, maps of models, lists of models and
discriminated unions (``exporters.<name>`` by ``type``, an alert rule's ``baseline`` by
``kind``) are walked; a key that differs between the members of a union is listed once
per member, tagged with the member.

Descriptions come from ``Field(description=...)`` or, failing that, from the ``#:``
comment lines right above the field in the model's source.  A field with neither is an
error (:class:`MissingDescriptionError`), so the reference cannot silently go blank.

``python -m ragtrace_collector.configref --write docs/configuration.md`` replaces the
block between :data:`BEGIN_MARKER` and :data:`END_MARKER` in that file; ``tests/docs``
checks that ``docs/configuration.md`` holds exactly what this module prints.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ragtrace_collector.config import CollectorConfig
from ragtrace_collector.units import parse_duration, parse_size

__all__ = [
    "BEGIN_MARKER",
    "DOCUMENT",
    "END_MARKER",
    "MissingDescriptionError",
    "Row",
    "Section",
    "extract_block",
    "main",
    "render_reference",
    "replace_block",
    "sections",
]

BEGIN_MARKER = "<!-- config-reference:begin -->"
END_MARKER = "<!-- config-reference:end -->"
#: The document that holds the reference, relative to the repository root.
DOCUMENT = "docs/configuration.md"
REGENERATE = f"python -m ragtrace_collector.configref --write {DOCUMENT}"

#: Placeholder of a map key in a dotted path, per map field path (default ``<name>``).
_KEY_PLACEHOLDERS: Mapping[str, str] = {"metrics": "<metric>"}

_DURATION_FUNCS: frozenset[Callable[..., Any]] = frozenset({parse_duration})
_SIZE_FUNCS: frozenset[Callable[..., Any]] = frozenset({parse_size})
_SCALARS: Mapping[Any, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "string",
    Path: "path",
    SecretStr: "secret string",
    Any: "any",
}
_BARE = re.compile(r"^[A-Za-z_./][A-Za-z0-9_./:-]*$")
_YAML_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "null", "~"})


class MissingDescriptionError(Exception):
    """Config fields without a description; ``fields`` names each as ``Model.field``."""

    def __init__(self, fields: Sequence[str]) -> None:
        self.fields = list(fields)
        super().__init__(
            "config fields without a description (add Field(description=...) or a "
            "'#:' comment above the field): " + ", ".join(self.fields)
        )


@dataclass(frozen=True)
class Row:
    """One key of the reference."""

    path: str
    type: str
    default: str
    description: str
    #: The union members this row applies to (``"type: file"``); empty: all of them.
    tag: str = ""


@dataclass(frozen=True)
class Section:
    """A top-level key of ``collector.yaml`` and the rows below it (itself first)."""

    name: str
    description: str
    rows: tuple[Row, ...]


# ------------------------------------------------------------------ descriptions
@cache
def _comment_docs(cls: type) -> dict[str, str]:
    """``field -> text`` of the ``#:`` comment lines directly above each field of
    ``cls``'s own body."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    source = textwrap.dedent("".join(lines))
    body = source.splitlines()
    tree = ast.parse(source)
    cls_node = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if cls_node is None:
        return {}
    docs: dict[str, str] = {}
    for node in cls_node.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        index = node.lineno - 2  # the line above, 0-based
        while index >= 0 and body[index].strip().startswith("#:"):
            comment.insert(0, body[index].strip()[2:].strip())
            index -= 1
        if comment:
            docs[node.target.id] = " ".join(comment)
    return docs


def _description(model: type[BaseModel], name: str, info: FieldInfo) -> str | None:
    if info.description:
        return _clean_text(info.description)
    for cls in model.__mro__:
        if (
            isinstance(cls, type)
            and issubclass(cls, BaseModel)
            and name in inspect.get_annotations(cls)
        ):
            text = _comment_docs(cls).get(name)
            if text:
                return _clean_text(text)
    return None


def _clean_text(text: str) -> str:
    """One line of Markdown: RST double backticks become single ones."""
    text = " ".join(text.split())
    return text.replace("``", "`")


# ------------------------------------------------------------------------- types
def _strip_none(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``."""
    if get_origin(tp) in (Union, types.UnionType):
        args = get_args(tp)
        if type(None) in args:
            rest = tuple(a for a in args if a is not type(None))
            if len(rest) == 1:
                return rest[0], True
            return Union[rest], True  # noqa: UP007 - a runtime union of the remaining types
    return tp, False


def _special(metadata: Iterable[Any]) -> str | None:
    for item in metadata:
        func = getattr(item, "func", None)
        if func in _DURATION_FUNCS:
            return "duration"
        if func in _SIZE_FUNCS:
            return "size"
    return None


def _model_members(tp: Any) -> list[type[BaseModel]]:
    """The models of a union of models (``[]`` when ``tp`` is anything else)."""
    if get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) > 1 and all(_is_model(m) for m in members):
            return members
    return []


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _type_text(tp: Any, metadata: Iterable[Any] = ()) -> str:
    special = _special(metadata)
    if special is not None:
        return special
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extra = get_args(tp)
        return _type_text(base, extra)
    base, optional = _strip_none(tp)
    if optional:
        return f"{_type_text(base)} or null"
    if tp in _SCALARS:
        return _SCALARS[tp]
    if origin is Literal:
        return "one of " + ", ".join(f"`{v}`" for v in get_args(tp))
    if origin in (dict, Mapping):
        key, value = get_args(tp)
        return f"map: {_type_text(key)} → {_type_text(value)}"
    if origin in (list, Sequence, tuple):
        return f"list of {_type_text(get_args(tp)[0])}"
    if _is_model(tp):
        return "mapping"
    members = _model_members(tp)
    if members:
        return "mapping"
    if origin in (Union, types.UnionType):
        texts = [_type_text(a) for a in get_args(tp)]
        return ", ".join(texts[:-1]) + " or " + texts[-1]
    return getattr(tp, "__name__", str(tp))


def _constraints(info: FieldInfo, tp: Any) -> str:
    inherent: list[Any] = []
    if get_origin(tp) is Annotated:
        for extra in get_args(tp)[1:]:
            if isinstance(extra, FieldInfo):
                inherent += extra.metadata
    parts: list[str] = []
    for item in info.metadata:
        if item in inherent:
            continue
        if isinstance(item, annotated_types.Ge):
            parts.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Gt):
            parts.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Le):
            parts.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.Lt):
            parts.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.MinLen) and item.min_length > 0:
            parts.append("not empty")
    return ", ".join(parts)


def _field_type(model: type[BaseModel], name: str, info: FieldInfo) -> Any:
    """The annotation with its ``Annotated`` extras (which ``info.annotation`` lost)."""
    hints = _hints(model)
    return hints.get(name, info.annotation)


@cache
def _hints(model: type[BaseModel]) -> dict[str, Any]:
    return typing.get_type_hints(model, include_extras=True)


# ---------------------------------------------------------------------- defaults
def _spell_duration(seconds: float) -> str:
    if seconds == 0:
        return "0s"
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    millis = seconds * 1000
    if millis == int(millis):
        return f"{int(millis)}ms"
    return f"{seconds:g}s"


def _spell_size(size: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def _flow(value: Any) -> str:
    """A value as a YAML flow literal."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        if value and _BARE.match(value) and value.lower() not in _YAML_WORDS:
            return value
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_flow(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return json.dumps(str(value))


def _dump(value: Any) -> Any:
    """JSON-ish data of a default: models without their own defaults, but with the
    discriminator (``type`` / ``kind``) kept."""
    if isinstance(value, BaseModel):
        data = value.model_dump(mode="json", exclude_defaults=True, by_alias=True)
        for tag in ("type", "kind"):
            if tag in type(value).model_fields and tag not in data:
                data = {tag: getattr(value, tag), **data}
        return data
    if isinstance(value, Mapping):
        return {str(k): _dump(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_dump(v) for v in value]
    if isinstance(value, SecretStr):
        return "***"
    if isinstance(value, Path):
        return str(value)
    return value


def _default_value(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        if info.default_factory_takes_validated_data:
            return PydanticUndefined
        return info.default_factory()  # type: ignore[call-arg]
    return info.default


def _default_text(info: FieldInfo, tp: Any, type_text: str) -> str:
    value = _default_value(info)
    if value is PydanticUndefined:
        return "required"
    base, _ = _strip_none(tp)
    if _is_model(base) and isinstance(value, base):
        try:
            if value == base():
                return ""  # a section: its keys below carry the defaults
        except Exception:  # a model with required keys: show the value
            pass
    if value is not None and type_text.startswith("duration"):
        return f"`{_spell_duration(float(value))}`"
    if value is not None and type_text.startswith("size"):
        return f"`{_spell_size(int(value))}`"
    if isinstance(value, str) and not value:
        return '`""`'
    if isinstance(value, Mapping | list | tuple) and not value:
        return "`{}`" if isinstance(value, Mapping) else "`[]`"
    return f"`{_flow(_dump(value))}`"


# ------------------------------------------------------------------------- walk
def _walk_model(model: type[BaseModel], prefix: str, missing: list[str]) -> list[Row]:
    rows: list[Row] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        path = f"{prefix}.{key}" if prefix else key
        rows += _walk_field(model, name, info, path, missing)
    return rows


def _walk_field(
    model: type[BaseModel], name: str, info: FieldInfo, path: str, missing: list[str]
) -> list[Row]:
    tp = _field_type(model, name, info)
    description = _description(model, name, info)
    if description is None:
        missing.append(f"{model.__name__}.{name}")
        description = ""
    type_text = _type_text(tp, info.metadata)
    limits = _constraints(info, tp)
    if limits:
        type_text = f"{type_text} ({limits})"
    row = Row(path, type_text, _default_text(info, tp, type_text), description)
    return [row, *_walk_type(tp, path, missing)]


def _walk_type(tp: Any, path: str, missing: list[str]) -> list[Row]:
    """Rows of the keys below a value of type ``tp`` at ``path``."""
    if get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    tp, _ = _strip_none(tp)
    if _is_model(tp):
        return _walk_model(tp, path, missing)
    members = _model_members(tp)
    if members:
        return _walk_union(members, path, missing)
    origin = get_origin(tp)
    if origin in (dict, Mapping):
        placeholder = _KEY_PLACEHOLDERS.get(path, "<name>")
        return _walk_type(get_args(tp)[1], f"{path}.{placeholder}", missing)
    if origin in (list, Sequence, tuple):
        return _walk_type(get_args(tp)[0], f"{path}[]", missing)
    return []


def _discriminator(members: Sequence[type[BaseModel]]) -> str:
    for tag in ("type", "kind"):
        if all(
            tag in m.model_fields and get_origin(m.model_fields[tag].annotation) is Literal
            for m in members
        ):
            return tag
    raise TypeError(f"no type/kind discriminator in {[m.__name__ for m in members]}")


def _walk_union(members: Sequence[type[BaseModel]], path: str, missing: list[str]) -> list[Row]:
    tag = _discriminator(members)
    per_member: list[tuple[str, list[Row]]] = []
    for member in members:
        value = get_args(member.model_fields[tag].annotation)[0]
        found: list[str] = []
        per_member.append((str(value), _walk_model(member, path, found)))
        # The discriminator's description is generated below.
        missing += [m for m in found if m != f"{member.__name__}.{tag}"]
    tag_path = f"{path}.{tag}"
    order: list[str] = [tag_path]
    for _, rows in per_member:
        order += [r.path for r in rows if r.path not in order]
    merged: list[Row] = []
    for row_path in order:
        if row_path == tag_path:
            values = [value for value, _ in per_member]
            required = all(m.model_fields[tag].is_required() for m in members)
            merged.append(
                Row(
                    tag_path,
                    "one of " + ", ".join(f"`{v}`" for v in values),
                    "required" if required else "",
                    f"Selects the kind of `{path.rsplit('.', 1)[-1]}`; keys tagged with a "
                    f"`{tag}` apply to that kind only.",
                )
            )
            continue
        variants: dict[Row, list[str]] = {}
        for value, rows in per_member:
            for r in rows:
                if r.path == row_path:
                    variants.setdefault(r, []).append(value)
        if len(variants) == 1 and len(next(iter(variants.values()))) == len(per_member):
            merged.append(next(iter(variants)))
            continue
        for r, values in variants.items():
            # A row of a nested union keeps its own (more precise) tag.
            member_tag = r.tag or f"{tag}: {', '.join(values)}"
            merged.append(Row(r.path, r.type, r.default, r.description, member_tag))
    return merged


# ----------------------------------------------------------------------- output
def sections(model: type[BaseModel] = CollectorConfig) -> list[Section]:
    """The reference of ``model``: one section per top-level key.

    Raises :class:`MissingDescriptionError` naming every field without a description.
    """
    missing: list[str] = []
    out: list[Section] = []
    for name, info in model.model_fields.items():
        rows = _walk_field(model, name, info, info.alias or name, missing)
        out.append(Section(name, rows[0].description, tuple(rows)))
    if missing:
        raise MissingDescriptionError(missing)
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_reference(model: type[BaseModel] = CollectorConfig) -> str:
    """The Markdown reference (what goes between the markers of :data:`DOCUMENT`)."""
    parts = [
        f"<!-- Generated by `{REGENERATE}`; do not edit by hand. -->",
    ]
    for section in sections(model):
        parts.append(f"### `{section.name}`")
        head, *rows = section.rows
        about = section.description
        if head.default and head.default != "`null`":
            about += f" Default: {head.default}."
        parts.append(about)
        if not rows:
            continue
        table = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
        for row in rows:
            key = f"`{row.path}`" + (f" ({row.tag})" if row.tag else "")
            table.append(
                f"| {_cell(key)} | {_cell(row.type)} | {_cell(row.default)} "
                f"| {_cell(row.description)} |"
            )
        parts.append("\n".join(table))
    return "\n\n".join(parts) + "\n"


def replace_block(text: str, block: str) -> str:
    """``text`` with everything between the markers replaced by ``block``."""
    begin = text.find(BEGIN_MARKER)
    end = text.find(END_MARKER)
    if begin < 0 or end < begin:
        raise ValueError(f"the markers {BEGIN_MARKER} ... {END_MARKER} are missing")
    head = text[: begin + len(BEGIN_MARKER)]
    return f"{head}\n{block}{text[end:]}"


def extract_block(text: str) -> str:
    """What is between the markers (as :func:`replace_block` writes it)."""
    begin = text.find(BEGIN_MARKER)
    end = text.find(END_MARKER)
    if begin < 0 or end < begin:
        raise ValueError(f"the markers {BEGIN_MARKER} ... {END_MARKER} are missing")
    return text[begin + len(BEGIN_MARKER) : end].removeprefix("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ragtrace_collector.configref",
        description="Print the collector configuration reference (Markdown).",
    )
    parser.add_argument(
        "--write",
        type=Path,
        metavar="FILE",
        help=f"replace the block between {BEGIN_MARKER} and {END_MARKER} in FILE",
    )
    args = parser.parse_args(argv)
    try:
        block = render_reference()
    except MissingDescriptionError as exc:
        print(f"configref: {exc}", file=sys.stderr)
        return 1
    if args.write is None:
        sys.stdout.write(block)
        return 0
    path: Path = args.write
    try:
        text = path.read_text(encoding="utf-8")
        new = replace_block(text, block)
    except (OSError, ValueError) as exc:
        print(f"configref: {path}: {exc}", file=sys.stderr)
        return 1
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"configref: {path} updated", file=sys.stderr)
    else:
        print(f"configref: {path} already up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
