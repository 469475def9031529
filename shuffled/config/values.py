"""How each setting's value is read: sizes, durations, booleans, locations, ports (one
function per kind, each raising ConfigError naming the setting)."""

from __future__ import annotations

import math
import re
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from shuffled.errors import ConfigError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
_DURATION_RE = re.compile(
    r"P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)
# The short form operators type: 30m, 2h, 1h30m, 90s, 7d (m is minutes, as in Go's and
# systemd's durations; months have no fixed length and are not taken).
_SHORT_RE = re.compile(
    r"(?:(?P<w>\d+(?:\.\d+)?)w)?(?:(?P<d>\d+(?:\.\d+)?)d)?(?:(?P<h>\d+(?:\.\d+)?)h)?"
    r"(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?",
    re.IGNORECASE,
)


def parse_size(value: Any, name: str) -> int:
    """Bytes from ``1048576``, ``64MiB``, ``10GB`` (SI and IEC units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{name}: size {value} is negative", setting=name)
        return value
    match = _SIZE_RE.fullmatch(str(value))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise ConfigError(f"{name}: {value!r} is not a size like 1048576, 64MiB or 10GB", setting=name)
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(value: Any, name: str) -> float:
    """Seconds from a number of seconds, the short form (``30m``, ``2h``, ``1h30m``,
    ``90s``, ``7d``) or an ISO-8601 duration (``PT5M``, ``P1D``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            match = _SHORT_RE.fullmatch(text) if text else None
            if match is None or not any(match.groupdict().values()):
                match = _DURATION_RE.fullmatch(text)
                if not match or text.upper() in ("P", "PT") or text.upper().endswith("T"):
                    raise ConfigError(
                        f"{name}: {value!r} is not a duration: give seconds, 30m, 2h, "
                        "1h30m, 7d or ISO-8601 (PT5M)", setting=name)
            parts = {k: float(v) for k, v in match.groupdict().items() if v}
            seconds = (
                parts.get("w", 0) * 604800 + parts.get("d", 0) * 86400
                + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
            )
    if seconds < 0 or math.isnan(seconds) or math.isinf(seconds):
        raise ConfigError(f"{name}: duration {value!r} must be finite and >= 0", setting=name)
    return seconds


def parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: {value!r} is not a boolean (true/false)", setting=name)


@dataclass(frozen=True)
class LocationSettings:
    """One storage location: a directory, its size cap and the free space to leave on its disk."""

    path: Path
    _: KW_ONLY
    max_bytes: int | None = None
    reserve_bytes: int | None = None  # None: the daemon-wide free_space_reserve

    @classmethod
    def parse(cls, value: Any, name: str = "location") -> LocationSettings:
        """``PATH`` or ``PATH:MAX_BYTES`` (a string) or ``{path, max_bytes, reserve_bytes}``."""
        if isinstance(value, LocationSettings):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"path", "max_bytes", "reserve_bytes"}
            if unknown or "path" not in value:
                raise ConfigError(
                    f"{name}: a location table takes path, max_bytes, reserve_bytes "
                    f"(got {sorted(value)})",
                    setting=name,
                )
            max_b = value.get("max_bytes")
            res_b = value.get("reserve_bytes")
            return cls(
                Path(str(value["path"])),
                max_bytes=parse_size(max_b, f"{name}.max_bytes") if max_b is not None else None,
                reserve_bytes=(parse_size(res_b, f"{name}.reserve_bytes")
                               if res_b is not None else None),
            )
        text = str(value)
        path, sep, size = text.rpartition(":")
        if sep and path and _SIZE_RE.fullmatch(size):
            return cls(Path(path), max_bytes=parse_size(size, name))
        if not text:
            raise ConfigError(f"{name}: empty location path", setting=name)
        return cls(Path(text))


def parse_locations(value: Any, name: str) -> tuple[LocationSettings, ...]:
    items = value if isinstance(value, (list, tuple)) else [
        v for v in str(value).split(",") if v.strip()
    ]
    return tuple(LocationSettings.parse(v, f"{name}[{i}]") for i, v in enumerate(items))


def parse_optional_str(value: Any, name: str) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text or None


def parse_deep_storage_uri(value: Any, name: str) -> str | None:
    text = parse_optional_str(value, name)
    if text is None:
        return None
    bucket = text[len("s3://"):].split("/", 1)[0] if text.startswith("s3://") else ""
    if not bucket:
        raise ConfigError(f"{name}: {text!r} is not s3://BUCKET[/PREFIX]", setting=name)
    return text.rstrip("/")


def parse_port(value: Any, name: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a port number", setting=name)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{name}: {port} is outside 0-65535", setting=name)
    return port


def _int_at_least(value: Any, name: str, low: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not an integer", setting=name)
    if number < low:
        raise ConfigError(f"{name}: {number} must be >= {low}", setting=name)
    return number


def parse_positive_int(value: Any, name: str) -> int:
    return _int_at_least(value, name, 1)


def parse_nonnegative_int(value: Any, name: str) -> int:
    return _int_at_least(value, name, 0)
