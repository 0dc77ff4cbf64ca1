"""Field checks for YAML read as data, whatever the schema: each says what is wrong with
one value in a file's :class:`Problems` (with its key path) and returns what is usable, so
a reader reports every problem at once.  :mod:`.format` builds the recipe schema from them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

__all__ = ["Problems", "join", "limit", "requirements", "section", "string_field", "string_list"]

_SIZE = re.compile(r"^(?P<n>[0-9]{1,15})\s*(?P<unit>|B|KiB|MiB|GiB|TiB)$")
_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


class Problems:
    """Collects problems as ``file: key.path: message`` lines."""

    def __init__(self, path: Path):
        self.path = path
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        prefix = f"{self.path}: {where}" if where else str(self.path)
        self.items.append(f"{prefix}: {message}")

    def unknown_keys(self, where: str, data: Mapping[Any, Any], allowed: Sequence[str]) -> None:
        for key in data:
            if key in allowed:
                continue
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            suggestion = (f"; did you mean '{hint[0]}'?" if hint
                          else f"; allowed: {', '.join(allowed)}")
            self.add(join(where, str(key)), f"unknown key{suggestion}")


def join(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def string_field(p: Problems, data: Mapping[str, Any], key: str, where: str, *,
                 required: bool = True) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            p.add(join(where, key), "is required")
        return None
    if not isinstance(value, str) or not value.strip():
        p.add(join(where, key), f"must be a non-empty string, got {value!r}")
        return None
    return value


def string_list(p: Problems, data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if value is None:
        return ()
    if not isinstance(value, list):
        p.add(join(where, key), f"must be a list of strings, got {type(value).__name__}")
        return ()
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            p.add(join(join(where, key), i), f"must be a non-empty string, got {item!r}")
        else:
            out.append(item)
    return tuple(out)


def requirements(p: Problems, data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    items = string_list(p, data, key, where)
    for i, item in enumerate(items):
        try:
            Requirement(item)
        except InvalidRequirement as exc:
            p.add(join(join(where, key), i), f"not a valid requirement: {exc}")
    return items


def section(p: Problems, data: Any, where: str,
            keys: Sequence[str]) -> dict[str, Any] | None:
    """An optional mapping section: None when absent or not a mapping (said in ``p``),
    its unknown keys said too."""
    if data is None:
        return None
    if not isinstance(data, dict):
        p.add(where, "must be a mapping")
        return None
    p.unknown_keys(where, data, keys)
    return data


def limit(raw: Any, count: bool) -> int | None:
    """A positive count, or a size: an integer (bytes) or ``N KiB|MiB|GiB|TiB``."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw if raw > 0 else None
    m = _SIZE.match(raw.strip()) if isinstance(raw, str) and not count else None
    if m is None:
        return None
    value = int(m.group("n")) * _UNITS[m.group("unit")]
    return value if value > 0 else None
