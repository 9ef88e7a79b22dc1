"""Config value types shared by every section: durations and byte sizes.

Durations accept a number of seconds or a string with units, one or several:
``"250ms"``, ``"30s"``, ``"15m"``, ``"24h"``, ``"1d"``, ``"1h30m"``.  Sizes accept a
number of bytes or a string such as ``"512KiB"``, ``"16MiB"``, ``"1GB"``.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = ["ByteSize", "Duration", "format_duration", "parse_duration", "parse_size"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like ``"15m"``, ``"1h30m"``, ``"250ms"``."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            pos = 0
            seconds = 0.0
            for match in _DURATION_PART.finditer(text):
                if match.start() != pos:  # parts must be contiguous: "1h30m", not "1h 30m"
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(
                    f"{value!r} is not a duration (use seconds, or e.g. '250ms', '30s', "
                    "'15m', '24h', '1h30m')"
                ) from None
    else:
        raise ValueError(f"{value!r} is not a duration")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration must be finite and not negative: {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """A single-unit spelling of a whole number of seconds (``900`` -> ``15m``)."""
    if seconds <= 0 or seconds != int(seconds):
        raise ValueError(f"cannot spell {seconds!r} as a whole-unit duration")
    whole = int(seconds)
    if whole % 86400 == 0 and whole >= 3 * 86400:
        return f"{whole // 86400}d"
    for unit, size in (("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def parse_size(value: Any) -> Any:
    """Bytes from a number or a string like ``"16MiB"``."""
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m is None:
            raise ValueError(f"{value!r} is not a size (use bytes, or e.g. 512KiB, 16MiB, 1GB)")
        unit = (m.group(2) or "b").lower()
        return int(float(m.group(1)) * _SIZE_UNITS[unit])
    return value


#: Seconds; accepts numbers and strings like ``"15m"``.
Duration = Annotated[float, BeforeValidator(parse_duration)]
#: Bytes; accepts numbers and strings like ``"16MiB"``.
ByteSize = Annotated[int, BeforeValidator(parse_size)]
