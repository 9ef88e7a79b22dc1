"""Reading and writing attributes on OTLP protobuf spans.

The collector keeps spans as protobuf messages end to end; these helpers convert
between OTLP ``AnyValue``/``KeyValue`` and plain Python values, in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.common.v1 import common_pb2

if TYPE_CHECKING:
    from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

__all__ = [
    "any_value_to_python",
    "attributes_to_dict",
    "get_attribute",
    "set_attribute",
    "set_attributes",
]

AttributeValue = str | bool | int | float | list[str] | list[bool] | list[int] | list[float]


def any_value_to_python(value: common_pb2.AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a Python value (arrays → lists, kvlists → dicts)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value_to_python(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value_to_python(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return bytes(value.bytes_value)
    return getattr(value, kind)


def attributes_to_dict(
    attributes: RepeatedCompositeFieldContainer[common_pb2.KeyValue],
) -> dict[str, Any]:
    """All attributes as a dict; a repeated key keeps its last value."""
    return {kv.key: any_value_to_python(kv.value) for kv in attributes}


def get_attribute(
    attributes: RepeatedCompositeFieldContainer[common_pb2.KeyValue], key: str
) -> Any:
    """The value of ``key``, or None.  Linear scan: fine for the handful of lookups per
    span; call :func:`attributes_to_dict` once when reading many keys."""
    found: Any = None
    for kv in attributes:
        if kv.key == key:
            found = any_value_to_python(kv.value)
    return found


def _fill(target: common_pb2.AnyValue, value: Any) -> None:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, bytes):
        target.bytes_value = value
    elif isinstance(value, (list, tuple)):
        arr = target.array_value
        for item in value:
            _fill(arr.values.add(), item)
    elif isinstance(value, Mapping):
        kvl = target.kvlist_value
        for k, v in value.items():
            _fill(kvl.values.add(key=str(k)).value, v)
    else:
        target.string_value = str(value)


def set_attribute(
    attributes: RepeatedCompositeFieldContainer[common_pb2.KeyValue], key: str, value: Any
) -> None:
    """Set ``key`` to ``value``, replacing an existing entry (OTLP keys are unique)."""
    for kv in attributes:
        if kv.key == key:
            kv.value.Clear()
            _fill(kv.value, value)
            return
    _fill(attributes.add(key=key).value, value)


def set_attributes(
    attributes: RepeatedCompositeFieldContainer[common_pb2.KeyValue],
    values: Iterable[tuple[str, Any]],
) -> None:
    """Set many attributes at once (one pass over the existing keys)."""
    index = {kv.key: kv for kv in attributes}
    for key, value in values:
        kv = index.get(key)
        if kv is None:
            kv = attributes.add(key=key)
            index[key] = kv
        else:
            kv.value.Clear()
        _fill(kv.value, value)
