"""Edit a recipe file's ``patches:`` list as text, so that its comments and layout stay.

The list is found and rewritten line by line (block or flow style); the result is parsed
again and must differ from the old recipe in the ``patches`` list only.  A layout this
cannot edit safely is a RecipeError that says what to write by hand.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._yaml import YamlProblem, loads
from ..errors import RecipeError

_KEY = re.compile(r"^patches:[ \t]*(?P<rest>.*?)[ \t]*$")
_FLOW = re.compile(r"^\[(?P<items>[^\]#]*)\][ \t]*(?P<comment>#.*)?$")
_ITEM = re.compile(r"^(?P<indent>[ \t]*)-[ \t]+(?P<q>['\"]?)(?P<name>[A-Za-z0-9][A-Za-z0-9._+-]*)"
                   r"(?P=q)[ \t]*(?P<comment>#.*)?$")
_TOP = re.compile(r"^[^\s#-]")


def listed_patches(text: str) -> list[str]:
    """The ``patches:`` list of a recipe's text, as the YAML loader reads it."""
    data = _parse(text)
    raw = data.get("patches") if isinstance(data, dict) else None
    return [str(p) for p in raw] if isinstance(raw, list) else []


def _parse(text: str) -> Any:
    try:
        return loads(text)
    except YamlProblem as exc:
        raise RecipeError("the recipe is not valid YAML", why=str(exc),
                          fix="correct the recipe file first") from None


def set_patches(text: str, names: Sequence[str], path: Path) -> str:
    """``text`` with its ``patches:`` list replaced by ``names``; comments and every other
    line kept.  RecipeError when the list's layout cannot be edited safely."""
    lines = text.splitlines(keepends=True)
    new_lines = _edit(lines, list(names))
    if new_lines is None:
        raise _cannot(path, names)
    out = "".join(new_lines)
    before, after = _parse(text), _parse(out)
    if not isinstance(before, dict) or not isinstance(after, dict):
        raise _cannot(path, names)
    before = {k: v for k, v in before.items() if k != "patches"}
    got = after.pop("patches", None) or []
    if after != before or got != list(names):
        raise _cannot(path, names)
    return out


def _cannot(path: Path, names: Sequence[str]) -> RecipeError:
    block = "patches:\n" + "".join(f"  - {n}\n" for n in names) if names else "patches: []\n"
    return RecipeError(
        f"cannot edit the patches: list of {path} as text",
        why="its layout is not a plain list of names (one '- NAME' a line, or '[A, B]' on "
            "the patches: line); the file is rewritten only by editing that list, never by "
            "dumping the YAML again (which would lose its comments); nothing was written",
        fix="make the list plain, or set it by hand to:\n" + block)


def _edit(lines: list[str], names: list[str]) -> list[str] | None:
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    key = next((i for i, ln in enumerate(lines) if _KEY.match(ln.rstrip("\r\n"))), None)
    if key is None:  # no list yet: add one before build:, else at the end
        block = _block(names, "  ", {}, eol)
        at = next((i for i, ln in enumerate(lines) if ln.startswith("build:")), len(lines))
        if lines and at == len(lines) and not lines[-1].endswith("\n"):
            lines = [*lines[:-1], lines[-1] + eol]
        return [*lines[:at], *block, *lines[at:]]
    m = _KEY.match(lines[key].rstrip("\r\n"))
    assert m is not None
    rest = m.group("rest")
    if rest and not rest.startswith("#"):
        flow = _FLOW.match(rest)
        if flow is None:
            return None
        comment = f"  {flow.group('comment')}" if flow.group("comment") else ""
        line = f"patches: [{', '.join(names)}]{comment}"
        if len(line) > 100:
            return [*lines[:key], *_block(names, "  ", {}, eol), *lines[key + 1:]]
        return [*lines[:key], line + eol, *lines[key + 1:]]
    # a block list: item lines, with comment and blank lines among them
    end, indent = key + 1, None
    attached: dict[str, list[str]] = {}
    pending: list[str] = []
    last_item = key
    for i in range(key + 1, len(lines)):
        raw = lines[i].rstrip("\r\n")
        item = _ITEM.match(raw)
        if item:
            if indent is not None and item.group("indent") != indent:
                return None
            indent = item.group("indent")
            comment = f"  {item.group('comment')}" if item.group("comment") else ""
            attached[_slug(item.group("name"))] = [*pending, comment]
            pending = []
            last_item = i
            continue
        if not raw.strip() or raw.lstrip().startswith("#"):
            pending.append(lines[i])
            continue
        if _TOP.match(raw):
            break
        return None  # a continuation, a nested value, ...: not a plain list
    end = last_item + 1
    if indent is None:
        # "patches:" with nothing under it (null): a block after the key
        return [*lines[:key], *_block(names, "  ", {}, eol), *lines[key + 1:]]
    if not names:
        return [*lines[:key], "patches: []" + lines[key][len(lines[key].rstrip("\r\n")):],
                *lines[end:]]
    return [*lines[:key + 1], *_block(names, indent, attached, eol)[1:], *lines[end:]]


def _block(names: list[str], indent: str, attached: dict[str, list[str]],
           eol: str) -> list[str]:
    if not names:
        return ["patches: []" + eol]
    out = ["patches:" + eol]
    for n in names:
        *before, comment = attached.get(_slug(n)) or [""]
        out += [*before, f"{indent}- {n}{comment}{eol}"]
    return out


def _slug(name: str) -> str:
    """A patch's name without its number: comments follow a patch that is renumbered."""
    return re.sub(r"^[0-9]+-", "", name)
