"""Escaping and quoting for the generated pages."""

from __future__ import annotations

import html
import json
import re
import urllib.parse
from typing import Any

# --------------------------------------------------------------------------- pages


_NEEDS_ESCAPE = re.compile("[&<>\"'\n\r]").search


def _e(text: str) -> str:
    """html.escape(quote=True), and line breaks as references: a fragment is one line.

    Most text on the pages (file names, versions, hashes, times) holds none of the
    characters that change; one regex search is cheaper than html.escape's five
    replacements and the two here, and the text is returned as it is.
    """
    if _NEEDS_ESCAPE(text) is None:
        return text
    return html.escape(text, quote=True).replace("\n", "&#10;").replace("\r", "&#13;")


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_QUOTE_TABLE = {c: chr(c) if c in _UNRESERVED else f"%{c:02X}" for c in range(128)}


def _quote(name: str) -> str:
    """urllib.parse.quote(name, safe=""), an order of magnitude faster for ASCII names."""
    if name.isascii():
        return name.translate(_QUOTE_TABLE)
    return urllib.parse.quote(name, safe="")


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # one, not one per page


def _json_text(payload: Any) -> str:
    return _JSON.encode(payload) + "\n"
